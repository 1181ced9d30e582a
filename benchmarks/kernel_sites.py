"""Where one kernel's warp instructions go: the kernel the default policy dispatches for a shape
(sm_90, one CTA per row, the largest k, sorted: as `make bench-kernels` runs it), counted on the
emulator, in warp instructions per key, by source site, source line or SASS opcode.

    .venv/bin/python benchmarks/kernel_sites.py DTYPE N K [--data KIND] [--rows R] [--by site|line|opcode] [--top T]
        [--fixed N2]

Every SASS instruction of the kernel's cubin is charged the warp executions the emulator counted
on its path of sites (topkgen.emulator.instructions: exact for these rows and data; no stall,
replay or dual issue), and the charges are summed by the innermost site (function body, loop or
branch) the instruction lies in, by the line NVRTC names for it (the innermost, inlined or not),
or by opcode. A site's figure is its own code, not the sites nested in it: the breakdown that
tells which part of a kernel a change moved, where bench-kernels gives one figure a kernel.

--fixed N2 runs the same kernel on rows of N2 as well and splits each figure into a cost per row
and one per key (the line through the two: per row = fixed + per key x n), sorted by the fixed
part: what a row costs whatever its length (setup, scans, the sort), against what each key adds.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_kernels import Kernels, run_counted  # noqa: E402
from shapes import DATA_KINDS  # noqa: E402

BY = ("site", "line", "opcode")


def breakdown(census, counter, by: str) -> dict[str, float]:
    """Warp instructions (summed over the launch) by site, line or opcode, each with a label that
    names it in the kernel's source (the counter's instrumented copy has the same lines)."""
    lines = [line.strip() for line in counter.source.splitlines()]
    out: dict[str, float] = defaultdict(float)
    if by == "site":
        for sid, n in census.by_site.items():
            s = counter.inst.by_id[sid]
            out[f"site {sid} {s.kind} L{s.first_line}-{s.last_line}: {lines[s.first_line - 1]}"] += n
    else:
        for ins, n in census.by_instruction.items():
            if by == "opcode":
                out[ins.opcode.split(".")[0]] += n
            else:
                line = ins.chain[0][1] if ins.chain else 0
                out[f"L{line}: {lines[line - 1] if 0 < line <= len(lines) else '(no line)'}"] += n
    return dict(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dtype", choices=("float32", "bfloat16"))
    ap.add_argument("n", type=int)
    ap.add_argument("k", type=int)
    ap.add_argument("--data", default="normal", choices=DATA_KINDS)
    ap.add_argument("--rows", type=int, default=4, help="rows run (the figures are per key of all of them)")
    ap.add_argument("--by", default="site", choices=BY)
    ap.add_argument("--top", type=int, default=25, help="print the T largest (0: all)")
    ap.add_argument("--fixed", type=int, metavar="N2", help="also rows of N2: split each figure into per row and per key")
    a = ap.parse_args(argv)
    if not (1 <= a.k <= a.n) or a.rows < 1:
        ap.error("need 1 <= K <= N and --rows >= 1")

    kernels = Kernels()
    spec = kernels.select(a.dtype, a.k, a.n)
    if spec.family != "radix":
        ap.error(f"{spec.name} is a register kernel: the counter serves the radix kernels")
    if a.fixed is not None and (a.fixed in (a.n, 0) or a.fixed < a.k or kernels.select(a.dtype, a.k, a.fixed) != spec):
        ap.error(f"--fixed {a.fixed}: need another n >= K that the same kernel ({spec.name}) serves")
    counter = kernels.counter(spec)

    def per_row(n: int) -> tuple[object, dict[str, float]]:
        _, c = run_counted(kernels, spec, a.rows, a.dtype, n, a.k, a.data, who="kernel_sites")
        census = counter.count(c, spec.name)
        return census, {label: w / a.rows for label, w in breakdown(census, counter, a.by).items()}

    if a.fixed is not None:
        (_, at_n), (_, at_n2) = per_row(a.n), per_row(a.fixed)
        split = {}
        for label in at_n.keys() | at_n2.keys():
            slope = (at_n.get(label, 0.0) - at_n2.get(label, 0.0)) / (a.n - a.fixed)
            split[label] = (at_n.get(label, 0.0) - slope * a.n, slope)
        print(f"{spec.name}: {a.rows} {a.data} rows of {a.n} and of {a.fixed}, k={a.k}: "
              f"{sum(f for f, _ in split.values()):.0f} warp instructions a row + "
              f"{sum(p for _, p in split.values()):.4f} a key, by {a.by} (counted on the emulator; SASS for sm_90)")
        for label, (fixed, slope) in sorted(split.items(), key=lambda t: -t[1][0])[:a.top or None]:
            print(f"{fixed:8.0f} a row {slope:8.4f} a key  {label[:100]}")
        return 0
    census, _ = per_row(a.n)
    keys = a.rows * a.n
    print(f"{spec.name}: {a.rows} {a.data} rows of {a.n}, k={a.k}: {census.warp_instructions / keys:.4f} warp "
          f"instructions per key, by {a.by} (counted on the emulator; SASS for sm_90)")
    parts = sorted(breakdown(census, counter, a.by).items(), key=lambda t: -t[1])
    for label, n in parts[:a.top or None]:
        print(f"{n / keys:8.4f} {100 * n / census.warp_instructions:5.1f}%  {label[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
