"""Where splitting rows across CTAs pays, by the first-order H200 model (benchmarks/h200_model.py,
from shared/tools/kernel_perf_model.py): a MODEL ESTIMATE, not a measurement. It is where the
default policy's split section (rows_below, min_n, ctas_per_sm, chunk_per_k) comes from until
`make gpu-check` measures the crossover on an H200.

For each batch it takes the chunks per row the policy's `select` gives (and, beside them, the
other powers of two) and models stage 1 (rows x chunks CTAs on chunks of n / chunks) plus
stage 2 (rows CTAs on chunks x k candidates; in the same launch where the kernel merges, the
policy's split one_launch) against one CTA per row. The kernel facts are
assumed, not counted (`make bench-kernels` counts them for float32): one read per element
when a row or chunk is resident in shared memory, two otherwise; the first pass's atomic
wavefronts and the barriers per row as bench-kernels counted them on normal data; the warp
instructions per key (the issue bound, issue 27) as benchmarks/results/bench_kernels.json
counted them on normal data, per dtype, K rung and whether the row is resident (the nearest
n counted; a launch of candidates is a resident row).

    .venv/bin/python benchmarks/split_model.py [--arch sm_90]
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import lru_cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from h200_model import LAUNCH_S, KernelFacts, ctas_per_sm, estimate_seconds  # noqa: E402

from topkgen import policy as pol  # noqa: E402

BARRIERS = {64: 12.0, 128: 41.0, 256: 49.0, 512: 60.0, 1024: 70.0}  # per row, bench-kernels, normal data
REGISTERS = {1024: 32}  # assumed elsewhere: 56 (ptxas reports 47-84 by rung)


RESULTS = Path(__file__).resolve().parent / "results" / "bench_kernels.json"


@lru_cache(maxsize=None)
def _counted() -> tuple[tuple[str, int, int, bool, float], ...]:
    """(dtype, K rung, n, resident, warp instructions per key) of bench-kernels' radix rows on
    normal data."""
    rows = json.loads(RESULTS.read_text())["rows"] if RESULTS.exists() else []
    out = []
    for r in rows:
        if r["family"] != "radix" or r["data"] != "normal" or not r.get("warp_instructions_per_key"):
            continue
        rung = int(r["kernel"].split("_k")[1].split("_")[0])
        out.append((r["dtype"], rung, r["n"], r["reads_per_element"] < 1.5, r["warp_instructions_per_key"]))
    return tuple(out)


def warp_instructions_per_key(spec: pol.KernelSpec, n: int, resident: bool) -> float:
    """Counted per key for the kernel's dtype and K rung (the same residency, the nearest n;
    any rung of the dtype when that one was not counted); 0 (no issue bound) when none was."""
    rows = [r for r in _counted() if r[0] == spec.dtype and r[3] == resident]
    same = [r for r in rows if r[1] == spec.k] or rows
    if not same:
        return 0.0
    return min(same, key=lambda r: (abs(r[2] - n), r[1]))[4]


def facts(spec: pol.KernelSpec, n: int) -> KernelFacts:
    resident = n <= pol.resident_elements(spec)
    static = 4 * 2048 + 8 * spec.k + 512
    return KernelFacts(threads=spec.threads,
                       ctas_per_sm=ctas_per_sm(spec.threads, REGISTERS.get(spec.k, 56), static, spec.shared.bytes_for(n)),
                       bytes_in_flight=spec.threads * 16 * spec.loads_in_flight,
                       reads_per_element=1.0 if resident else 2.0, atomic_wavefronts_per_element=0.06,
                       barriers_per_row=BARRIERS[spec.k],
                       warp_instructions_per_row=warp_instructions_per_key(spec, n, resident) * n)


def seconds(spec: pol.KernelSpec, rows: int, n: int, k: int, chunks: int) -> float:
    size = pol.DTYPE_SIZES[spec.dtype]
    if chunks == 1:
        return estimate_seconds(rows, n, k, size, facts(spec, n))[0]
    chunk, merge = n // chunks, chunks * k
    # one launch (schema 7): the merge's CTA starts where its row's last chunk ends
    return (estimate_seconds(rows * chunks, chunk, k, size, facts(spec, chunk))[0]
            + estimate_seconds(rows, merge, k, size, facts(spec, merge))[0] - LAUNCH_S * spec.merges)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_90")
    args = parser.parse_args(argv)
    policy = pol.load()
    print(f"split_model: {args.arch}, the default policy's chunks per row; an H200 MODEL ESTIMATE, not a measurement\n")
    print("| dtype | N | K | rows | policy chunks | model us, policy | model us, one CTA/row | best chunks (model) "
          "| model us, best | policy pays |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    losses = 0
    for dtype in ("float32", "bfloat16"):
        for n in (65536, 131072, 262144):
            for k in (16, 256, 1024):
                for rows in (1, 4, 16, 32, 64, 95, 96, 128):
                    sel = pol.select(policy, args.arch, dtype, k, n, rows=rows)
                    one = seconds(sel.kernel, rows, n, k, 1)
                    ours = seconds(sel.kernel, rows, n, k, sel.chunks)
                    options = [c for c in (1, 2, 4, 8, 16, 32, 64) if c == 1 or n // c >= k]
                    best = min(options, key=lambda c: seconds(sel.kernel, rows, n, k, c))
                    pays = "yes" if ours < one else "no split" if sel.chunks == 1 else "NO"
                    losses += pays == "NO"
                    print(f"| {dtype} | {n} | {k} | {rows} | {sel.chunks} | {ours * 1e6:.0f} | {one * 1e6:.0f} | {best} "
                          f"| {seconds(sel.kernel, rows, n, k, best) * 1e6:.0f} | {pays} |")
    print(f"\n{losses} split batches the model puts behind one CTA per row")
    return 0


if __name__ == "__main__":
    sys.exit(main())
