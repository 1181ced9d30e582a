"""Long rows read once at any batch (issue 28, point 4): for rows longer than a radix kernel's
shared memory holds, one CTA per row (which reads the row twice, three times on some data)
beside the split that cuts every row into chunks that each fit (topkgen.policy.split: stage 1
reads each chunk once into shared memory, stage 2 merges the chunks' candidates). Both are
counted on the CPU emulator (exact, for these kernels and this data): global bytes read per
input byte, the merge's included, and warp instructions per key (SASS x emulator counts);
then both go through the first-order H200 model with its issue bound (benchmarks/h200_model.py).
The model columns are a MODEL ESTIMATE, not a measurement; they are what the default policy's
split section (rows_below, min_n) follows until `make gpu-check` measures it on an H200.

    .venv/bin/python benchmarks/read_once.py [--md FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_kernels import ARCH, Kernels, _facts, run_split_row  # noqa: E402
from h200_model import HBM_BYTES_PER_S, estimate_seconds  # noqa: E402
from shapes import DATA_KINDS, make_rows  # noqa: E402

SHAPES = [(dtype, n, k) for dtype in ("float32", "bfloat16") for n in (16384, 32768, 65536, 131072, 262144)
          for k in (64, 256, 1024, 2048)]
BATCHES = (1, 4, 16, 64, 256, 1024, 4096)  # the batches the model takes (the emulator counts one row)


def measure(kernels: Kernels, dtype: str, n: int, k: int, kind: str = "normal") -> list[dict]:
    """One emulated row unsplit and in the chunks that fit the kernel's shared memory."""
    import ml_dtypes

    from topkgen.policy.selection import resident_elements, split_capable
    from topkgen.policy.split import ChunkPlan
    from topkgen.runtime import reference

    x = make_rows(kind, 1, n, seed=n + k + DATA_KINDS.index(kind)).astype(
        np.float32 if dtype == "float32" else ml_dtypes.bfloat16)
    expect, _ = reference.topk(x, k, largest=True)
    spec = kernels.select(dtype, k, n)
    # The arch's split section with no batch or length limit: the chunks it would give every batch.
    tuning = dataclasses.replace(kernels.policy.archs[ARCH].split, rows_below=2**31 - 1, rows_below_by_k={}, min_n=1)
    resident = resident_elements(spec)
    module, counter = kernels.module(spec), kernels.counter(spec)

    def run(c: int):
        return run_split_row(module, spec, x, k, c, expect, "read_once")

    def facts(counts, elements, ctas, input_bytes, part):
        f = _facts(kernels, spec, counts, elements, ctas, input_bytes, spec.shared.bytes_for(part))
        return dataclasses.replace(f, warp_instructions_per_row=counter.count(counts, spec.name).warp_instructions / ctas)

    (whole,) = run(1)
    one = facts(whole, n, 1, x.nbytes, n)
    out, runs = [], {}
    for rows in BATCHES:
        chunks = tuning.chunks(rows, n, spec.k, resident) if split_capable(spec) else 1
        if chunks > 1 and not spec.n_min <= min(n // chunks, chunks * k) <= chunks * k <= spec.n_max:
            chunks = 1  # the kernel's n window holds no such split (as select decides)
        split = None
        if chunks > 1:
            if chunks not in runs:
                runs[chunks] = run(chunks)
            split = runs[chunks]
        row = {"dtype": dtype, "n": n, "k": k, "rows": rows, "kernel": spec.name, "chunks": chunks,
               "one_reads": whole.global_load_bytes / x.nbytes,
               "one_instr": counter.count(whole, spec.name).warp_instructions / n,
               "one_us": estimate_seconds(rows, n, k, x.itemsize, one)[0] * 1e6,
               "floor_us": (rows * n * x.itemsize + rows * k * (x.itemsize + 8)) / HBM_BYTES_PER_S * 1e6}
        if split is not None:
            first, second = split
            plan = ChunkPlan(rows, n, k, chunks, x.itemsize)
            s1 = facts(first, n, chunks, x.nbytes, plan.last_chunk)
            s2 = facts(second, plan.candidates, 1, plan.candidates * x.itemsize, plan.candidates)
            row.update(split_reads=(first.global_load_bytes + second.global_load_bytes) / x.nbytes,
                       split_instr=(counter.count(first, spec.name).warp_instructions
                                    + counter.count(second, spec.name).warp_instructions) / n,
                       split_us=(estimate_seconds(rows * chunks, plan.chunk, k, x.itemsize, s1)[0]
                                 + estimate_seconds(rows, plan.candidates, k, x.itemsize, s2)[0]) * 1e6)
        out.append(row)
    return out


def table(rows: list[dict]) -> str:
    head = ("| dtype | N | K | rows | chunks | reads/elem one CTA -> split | warp instr/key one CTA -> split "
            "| model us one CTA -> split | HBM floor us |\n|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows:
        if "split_us" in r:
            lines.append(f"| {r['dtype']} | {r['n']} | {r['k']} | {r['rows']} | {r['chunks']} "
                         f"| {r['one_reads']:.3f} -> {r['split_reads']:.3f} | {r['one_instr']:.2f} -> {r['split_instr']:.2f} "
                         f"| {r['one_us']:.1f} -> {r['split_us']:.1f} | {r['floor_us']:.1f} |")
        else:
            lines.append(f"| {r['dtype']} | {r['n']} | {r['k']} | {r['rows']} | 1 | {r['one_reads']:.3f} "
                         f"| {r['one_instr']:.2f} | {r['one_us']:.1f} | {r['floor_us']:.1f} |")
    return head + "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--md", metavar="FILE", help="also write the table to FILE")
    args = ap.parse_args()
    kernels = Kernels()
    rows = [r for shape in SHAPES for r in measure(kernels, *shape)]
    text = ("Read once at any batch (sm_90 kernels; emulator counts on one normal row; model columns: "
            "H200 MODEL ESTIMATE)\n\n" + table(rows))
    print(text)
    if args.md:
        Path(args.md).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
