"""Global reads of a ragged batch on the emulator (issue 30, point 6): a batch of ROWS rows of
n elements whose lengths are uniform in [1, n] should read about the sum of the lengths, not
rows x n. The emulator counts every global load the kernels make (topk_memory.cuh), so the
figure is exact for these kernels and this data; it is not a GPU time.

    python benchmarks/ragged_reads.py [--rows 64] [--n 131072] [--k 64 256 1024 2048] [--dtype float32]

prints the kernel, the launch(es), the bytes read, the sum of the lengths in bytes, and their
ratio (the issue asks for at most 1.05)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ARCH = "sm_90"


def measure(rows: int, n: int, k: int, dtype: str, seed: int = 30, starts: bool = True) -> dict:
    """One ragged launch (or a split's two, as the policy plans the batch) with counters."""
    import ml_dtypes

    from topkgen import policy
    from topkgen.build.render import render
    from topkgen.emulator import compile_source
    from topkgen.manifest.params import params
    from topkgen.runtime import arguments
    from topkgen.runtime.emulator_backend import workspace_arrays
    from topkgen.policy.split import stages

    pol = policy.load()
    sel = policy.select(pol, ARCH, dtype, k, n, rows=rows)
    spec, plan = sel.kernel, sel.split
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, n)).astype(np.float32).astype(
        {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[dtype])
    lengths = rng.integers(1, n + 1, size=rows).astype(np.int64)
    first = (rng.integers(0, n - lengths + 1) if starts else np.zeros(rows, np.int64)).astype(np.int64)
    values, indices = np.zeros((rows, k), x.dtype), np.zeros((rows, k), np.int64)
    pointers = {"x": x, "values": values, "indices": indices, "lengths": lengths, "starts": first}
    if plan is not None:
        pointers.update(workspace_arrays(plan, x.dtype, np.zeros(plan.workspace_bytes, np.uint8)))
    module = compile_source(render(spec), name=spec.name)
    read = 0
    for stage in stages(rows, n, k, True, plan, window_bytes=8, starts=starts, shared=spec.shared):
        grid = -(-stage.grid_rows // spec.rows_per_block)
        c = module.launch(spec.name, grid, spec.threads, arguments(params(spec), stage, pointers, None),
                          shared_bytes=stage.shared_bytes, counters=True)
        read += c.global_load_bytes
    # Each window alone as a dense row, by the same kernel (k capped at its length): what a
    # row of that length reads, so `alone_ratio` is the ragged launch's reads over the dense
    # rows' (the kernels read a row longer than their shared memory more than once).
    alone = 0
    for r in range(rows):
        row = np.ascontiguousarray(x[r:r + 1, first[r]:first[r] + lengths[r]])
        kr = int(min(k, lengths[r]))
        v, i = np.zeros((1, kr), x.dtype), np.zeros((1, kr), np.int64)
        (stage,) = stages(1, int(lengths[r]), kr, True, None, shared=spec.shared)
        c = module.launch(spec.name, 1, spec.threads, arguments(params(spec), stage, {"x": row, "values": v,
                                                                                     "indices": i}, None),
                          shared_bytes=stage.shared_bytes, counters=True)
        alone += c.global_load_bytes
    useful = int(lengths.sum()) * x.itemsize
    return {"kernel": spec.name, "chunks": plan.chunks if plan else 1, "rows": rows, "n": n, "k": k,
            "dtype": dtype, "read_bytes": read, "length_bytes": useful, "dense_bytes": rows * n * x.itemsize,
            "ratio": read / useful, "alone_bytes": alone, "alone_ratio": read / alone, "values": values, "indices": indices, "x": x, "lengths": lengths,
            "starts": first}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--n", type=int, default=131072)
    ap.add_argument("--k", type=int, nargs="+", default=[64, 256, 1024, 2048])
    ap.add_argument("--dtype", default="float32")
    a = ap.parse_args()
    for k, starts in ((k, starts) for k in a.k for starts in (False, True)):
        m = measure(a.rows, a.n, k, a.dtype, starts=starts)
        print(f"{m['rows']} x {m['n']} {m['dtype']} k={m['k']} lengths uniform in [1, n], "
              f"{'windows at random starts' if starts else 'windows at the row start'}: {m['kernel']} "
              f"x{m['chunks']}: read {m['read_bytes']} bytes, sum of lengths {m['length_bytes']} bytes "
              f"(dense {m['dense_bytes']}): {m['ratio']:.4f} x the sum of the lengths; each window alone as a "
              f"dense row reads {m['alone_bytes']}: ragged / alone = {m['alone_ratio']:.4f}")


if __name__ == "__main__":
    main()
