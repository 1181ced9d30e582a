"""Issue 28 point 5: what a small batch's split merge would gain from keeping only the stage-1
candidates that can still be in the top k, or from merging on several CTAs per row. Counted
on the emulator, put through the H200 model (benchmarks/h200_model.py): a MODEL ESTIMATE,
not a measurement.

For each shape, one row as the default policy splits it at `--rows` (C chunks of n / C, then
one CTA merging the C x k candidates) is run and counted, and beside it the same kernel on:
- the candidates that pass the best bound stage 1 could publish: every chunk's k-th key is a
  lower bound of the row's k-th, so nothing below the largest of them can be in the top k
  (chunks publishing to a shared word would each see a running maximum, a weaker bound: the
  kept count is the most pruning can drop, with its atomics not counted);
- the C x k candidates merged on g CTAs (g chunks of C x k / g), then g x k on one CTA: a
  three-launch split, each launch counted; and, in the last columns, both designs in one
  launch (the policy's one_launch; tickets per group of chunks), each less its launches but
  the first.
The candidates are each chunk's top k from numpy (the keys stage 1 writes); each run is
checked against the reference.

    .venv/bin/python benchmarks/merge_options.py [--rows 1] [--data normal]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_kernels import ARCH, Kernels, _facts, run_split_row  # noqa: E402
from h200_model import LAUNCH_S, estimate_seconds  # noqa: E402
from shapes import DATA_KINDS, make_rows  # noqa: E402

SHAPES = (("float32", 131072, 16), ("float32", 131072, 256), ("float32", 131072, 1024),
          ("float32", 262144, 16), ("float32", 262144, 256), ("float32", 262144, 1024),
          ("bfloat16", 131072, 256))
GROUPS = (2, 4, 8)


def chunk_candidates(x: np.ndarray, plan) -> tuple[np.ndarray, np.ndarray]:
    """Of one row (x: 1 x n), each of the plan's chunks' top k values (chunk c covers
    [c x chunk, (c + 1) x chunk), the last the rest), in chunk order, and each chunk's k-th key."""
    from topkgen.runtime import reference

    values, kth = [], []
    for c in range(plan.chunks):
        part = x[:, c * plan.chunk:][:, :plan.last_chunk if c == plan.chunks - 1 else plan.chunk]
        top, _ = reference.topk(part, plan.k, largest=True)
        values.append(top)
        kth.append(reference.select_keys(top, True)[0].min())
    return np.concatenate(values, axis=1), np.array(kth)


def main(argv: list[str] | None = None) -> int:
    from topkgen import policy
    from topkgen.runtime import reference

    import ml_dtypes

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1, help="the batch the policy plans and the model takes")
    parser.add_argument("--data", default="normal", choices=DATA_KINDS)
    args = parser.parse_args(argv)
    kernels = Kernels()
    print(f"merge_options: {ARCH}, {args.rows} row(s) of {args.data} data, the default policy's split; "
          "counted on the emulator, times an H200 MODEL ESTIMATE\n")
    head = ("| dtype | N | K | chunks | candidates | kept by the best bound | merge warp instr "
            "| one CTA on them, all / kept "
            "| model us: policy | pruned | " + " | ".join(f"merge on {g} CTAs" for g in GROUPS)
            + " | one launch: policy | one launch: merge on g CTAs, the best |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for dtype, n, k in SHAPES:
        x = make_rows(args.data, 1, n, seed=n + k + DATA_KINDS.index(args.data)).astype(
            np.float32 if dtype == "float32" else ml_dtypes.bfloat16)
        sel = policy.select(kernels.policy, ARCH, dtype, k, n, rows=args.rows)
        if sel.split is None:
            print(f"| {dtype} | {n} | {k} | 1 | (not split at {args.rows} rows) |" + " |" * (head.count("|") - 6))
            continue
        spec, plan = sel.kernel, sel.split
        module, counter = kernels.module(spec), kernels.counter(spec)
        expect, _ = reference.topk(x, k, largest=True)

        def facts(counts, elements: int, ctas: int):
            return replace(_facts(kernels, spec, counts, elements, ctas, elements * x.itemsize,
                                  spec.shared.bytes_for(elements // ctas)),
                           warp_instructions_per_row=counter.count(counts, spec.name).warp_instructions / ctas)

        def launch_us(rows: int, elements: int, counts, ctas: int) -> float:
            return estimate_seconds(rows, elements // ctas, k, x.itemsize, facts(counts, elements, ctas))[0] * 1e6

        first, second = run_split_row(module, spec, x, k, plan.chunks, expect, "merge_options")
        stage1_us = launch_us(args.rows * plan.chunks, n, first, plan.chunks)
        launch = LAUNCH_S * 1e6  # what one launch saves: the merge in stage 1's (one_launch)
        two_launches_us = stage1_us + launch_us(args.rows, plan.candidates, second, 1)
        policy_us = two_launches_us - launch * spec.merges
        candidates, kth = chunk_candidates(x, plan)
        kept = candidates[:, reference.select_keys(candidates, True)[0] >= kth.max()]
        # the same one-CTA launch on all candidates and on the kept ones, compared alike
        (whole,) = run_split_row(module, spec, candidates, k, 1, expect, "merge_options (candidates)")
        (pruned,) = run_split_row(module, spec, kept, k, 1, expect, "merge_options (pruned)")
        pruned_us = stage1_us + launch_us(args.rows, kept.shape[1], pruned, 1) - launch * spec.merges
        groups = {}
        for g in GROUPS:
            if plan.candidates // g >= k:
                merge1, merge2 = run_split_row(module, spec, candidates, k, g, expect, f"merge_options ({g} CTAs)")
                groups[g] = (stage1_us + launch_us(args.rows * g, plan.candidates, merge1, g)
                             + launch_us(args.rows, g * k, merge2, 1))
        warp = [counter.count(c, spec.name).warp_instructions for c in (second, whole, pruned)]
        print(f"| {dtype} | {n} | {k} | {plan.chunks} | {plan.candidates} | {kept.shape[1]} "
              f"({kept.shape[1] / plan.candidates:.1%}) | {warp[0]:.0f} | {warp[1]:.0f} / {warp[2]:.0f} "
              f"| {policy_us:.2f} "
              f"| {pruned_us:.2f} | " + " | ".join(f"{groups[g]:.2f}" if g in groups else "-" for g in GROUPS)
              + f" | {two_launches_us - launch:.2f} | {min(groups.values()) - 2 * launch:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
