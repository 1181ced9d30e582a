"""`make bench-kernels`, issue 29's table: what the kernels above K=1024 move and issue, counted
on the CPU emulator (exact), beside K=1024 on the same rows, sorted and unsorted.

Shapes (issue 29 point 6): 16 x 131072 K=2048, 1 x 163840 K=2048, 64 x 65536 K=2048 and
1024 x 131072 K=4096, and the large-k path at 1 x 163840 k=40000, float32 and bfloat16,
normal rows. Each batch is planned as the runtime
plans it (`policy.select` with its rows: a small batch splits across CTAs, and its table
lists both launches); the emulator runs one row of the plan (the counts are per row). Each
line is run sorted and with sorted=False (the kernels' `unsorted` flag), so the last columns
are what skipping the final sort saves. Columns:
  kernel, chunks  what serves the batch (chunks: CTAs per row; 1: not split)
  reads/elem      global bytes loaded / input bytes, every launch of the row
  writes/elem     global bytes stored / input bytes (the large-k path's candidates included)
  warp instr/key  warp instructions issued per input key, every launch (SASS x emulator,
                  topkgen/emulator/instructions.py)
  sort bar/row    __syncthreads in the "sort and output" phase, per row (every launch)
  unsorted        the same with sorted=False, and the ratio of warp instructions
Nothing here is a time: no GPU ran it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from shapes import DATA_KINDS, make_rows  # noqa: E402

ARCH = "sm_90"
SORT = "sort and output"
# (batch rows, n, k) of issue 29 point 6; each also runs at BESIDE_K on the same rows.
# The last one is the large-k path (k above every K rung; `explain --k 40000`'s shape).
SHAPES = ((16, 131072, 2048), (1, 163840, 2048), (64, 65536, 2048), (1024, 131072, 4096), (1, 163840, 40000))
BESIDE_K = 1024
DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class Count:
    reads_per_element: float
    writes_per_element: float
    warp_instructions_per_key: float
    sort_barriers_per_row: float


@dataclass(frozen=True)
class Line:
    dtype: str
    rows: int
    n: int
    k: int
    kernel: str
    chunks: int
    sorted: Count
    unsorted: Count


class Runner:
    def __init__(self) -> None:
        from topkgen import policy

        self.policy = policy.load()
        self._counters: dict[str, object] = {}
        self._modules: dict[str, object] = {}

    def counter(self, spec):
        from topkgen.build.render import render
        from topkgen.emulator.instructions import Counter

        if spec.name not in self._counters:
            self._counters[spec.name] = Counter(render(spec), spec.name, ARCH)
            self._modules[spec.name] = self._counters[spec.name].module()
        return self._counters[spec.name], self._modules[spec.name]

    def line(self, dtype: str, rows: int, n: int, k: int) -> Line:
        from topkgen import policy

        sel = policy.select(self.policy, ARCH, dtype, k, n, rows=rows)
        import ml_dtypes

        x = make_rows("normal", 1, n, seed=n + k + DATA_KINDS.index("normal")).astype(
            np.float32 if dtype == "float32" else ml_dtypes.bfloat16)
        chunks = sel.split.chunks if sel.split is not None else 1
        counts = [self.count(sel.kernel, x, k, chunks, sorted_) for sorted_ in (True, False)]
        return Line(dtype, rows, n, k, sel.kernel.name, chunks, *counts)

    def count(self, spec, x: np.ndarray, k: int, chunks: int, sorted_: bool) -> Count:
        """One row of the plan: its launches, as the runtime binds them, counted."""
        from topkgen.manifest.params import output_flags, params
        from topkgen.policy.split import ChunkPlan, stages
        from topkgen.runtime import arguments, reference
        from topkgen.runtime.emulator_backend import workspace_arrays

        n = x.shape[-1]
        counter, module = self.counter(spec)
        values, indices = np.zeros((1, k), x.dtype), np.zeros((1, k), np.int64)
        plan = ChunkPlan(1, n, k, chunks, x.itemsize) if chunks > 1 else None
        pointers = {"x": x, "values": values, "indices": indices}
        if plan is not None:
            pointers.update(workspace_arrays(plan, x.dtype, np.zeros(plan.workspace_bytes, np.uint8)))
        launches = [module.launch(spec.name, stage.grid_rows, spec.threads,
                                  arguments(params(spec), stage, pointers, None),
                                  shared_bytes=stage.shared_bytes, counters=True)
                    for stage in stages(1, n, k, True, plan, flags=output_flags(sorted_, "int64"), shared=spec.shared)]
        expect, _ = reference.topk(x, k, largest=True)
        got = reference.select_keys(values, True).astype(np.int64)
        if not np.array_equal(-np.sort(-got, axis=-1), reference.select_keys(expect, True)):
            raise SystemExit(f"bench-every-k: {spec.name} returned a wrong top-{k} of {n} (sorted={sorted_})")
        if sorted_ and not np.array_equal(got, reference.select_keys(expect, True)):
            raise SystemExit(f"bench-every-k: {spec.name} returned top-{k} of {n} out of order")
        issued = sum(counter.count(c, spec.name).warp_instructions for c in launches)
        sort_barriers = sum(c.phases[SORT].barriers if SORT in c.phases else 0 for c in launches)
        return Count(sum(c.global_load_bytes for c in launches) / x.nbytes,
                     sum(c.global_store_bytes for c in launches) / x.nbytes, issued / n, sort_barriers)


def table(lines: list[Line]) -> str:
    head = ("| dtype | batch | N | K | kernel | chunks | reads/elem | writes/elem | warp instr/key | sort bar/row "
            "| unsorted: reads/elem | warp instr/key | sort bar/row | unsorted / sorted instr |")
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in lines:
        s, u = r.sorted, r.unsorted
        out.append(f"| {r.dtype} | {r.rows} | {r.n} | {r.k} | {r.kernel} | {r.chunks} | {s.reads_per_element:.3f} "
                   f"| {s.writes_per_element:.3f} | {s.warp_instructions_per_key:.2f} | {s.sort_barriers_per_row:.0f} "
                   f"| {u.reads_per_element:.3f} | {u.warp_instructions_per_key:.2f} | {u.sort_barriers_per_row:.0f} "
                   f"| {u.warp_instructions_per_key / s.warp_instructions_per_key:.3f} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_every_k.py", description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="FILE", help="write the lines as JSON")
    parser.add_argument("--md", metavar="FILE", help="also write the table (what it prints) to FILE")
    parser.add_argument("--quick", action="store_true", help="the first shape only, float32 (a smoke run)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    runner = Runner()
    shapes = SHAPES[:1] if args.quick else SHAPES
    lines = [runner.line(dtype, rows, n, kk) for dtype in (DTYPES[:1] if args.quick else DTYPES)
             for rows, n, k in shapes for kk in (k, BESIDE_K)]
    text = (f"bench-every-k: {ARCH} kernels of the default policy above K={BESIDE_K} and at it, counted on the "
            f"emulator, one row of each batch's plan; sorted and sorted=False (no GPU: nothing here is a time)\n\n"
            + table(lines))
    print(text, end="")
    if args.md:
        Path(args.md).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"arch": ARCH, "lines": [asdict(r) for r in lines]}, indent=1) + "\n")
    print(f"\n{len(lines) * 2} plans counted in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
