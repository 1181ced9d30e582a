"""Issue 28's target shapes from two bench-kernels runs side by side: global reads per element,
warp instructions per key and the H200 model (a MODEL ESTIMATE, with its issue bound at 4 and
at 2 warp instructions per clock) before -> after, the small-batch splits, and every other radix
row whose CTAs per SM or model estimate moved (a policy's shared memory or launch bounds).

    .venv/bin/python benchmarks/compare_kernels.py BEFORE.json AFTER.json [--md FILE]

Both files are `bench_kernels.py --json` output; the counts are the emulator's (exact for these
kernels and data), the instruction counts the SASS weighted by them (topkgen.emulator.instructions).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TARGETS = [("seed grid", 16384, 256), ("rows of 131072", 131072, 256), ("rows of 131072", 131072, 1024),
           ("LLM sampling", 262144, 256), ("LLM sampling", 262144, 1024)]
SPLITS = [(1, 131072, 256), (1, 131072, 1024), (64, 262144, 16), (16, 131072, 1024), (64, 131072, 256)]


def _index(rows: list[dict], *fields: str) -> dict:
    return {tuple(r[f] for f in fields): r for r in rows}


def table(before: dict, after: dict) -> str:
    b = _index(before["rows"], "set", "dtype", "n", "k", "data")
    out = ["| shape | data | reads/elem | warp instr/key | model us at 4/clock (bound) | model us at 2/clock | HBM floor us |",
           "|---|---|---|---|---|---|---|"]
    for r in after["rows"]:
        if (r["set"], r["n"], r["k"]) not in TARGETS or r["family"] != "radix":
            continue
        o = b.get((r["set"], r["dtype"], r["n"], r["k"], r["data"]))
        if o is None:
            continue
        out.append(f"| {r['model_rows']}x{r['n']} K{r['k']} {r['dtype']} | {r['data']} "
                   f"| {o['reads_per_element']:.3f} -> {r['reads_per_element']:.3f} "
                   f"| {o['warp_instructions_per_key']:.2f} -> {r['warp_instructions_per_key']:.2f} "
                   f"| {o['model_us']:.0f} -> {r['model_us']:.0f} ({r['model_bound']}) "
                   f"| {o['issue_us_at_2']:.0f} -> {r['issue_us_at_2']:.0f} | {r['hbm_floor_us']:.1f} |")
    sb = _index(before["split_rows"], "rows", "dtype", "n", "k", "data")
    out += ["", "Small batches (each as the policy of its run splits it; model: H200 MODEL ESTIMATE, the 'after' run "
                "with the issue bound at 4 per clock, the 'before' run without it):", "",
            "| batch | data | CTAs/row | reads/elem (stage 1) | warp instr/key (both launches) | model us | one CTA/row us |",
            "|---|---|---|---|---|---|---|"]
    for r in after["split_rows"]:
        if (r["rows"], r["n"], r["k"]) not in SPLITS or r["data"] != "normal":
            continue
        o = sb.get((r["rows"], r["dtype"], r["n"], r["k"], r["data"]))
        if o is None:
            continue
        out.append(f"| {r['rows']}x{r['n']} K{r['k']} {r['dtype']} | {r['data']} | {o['ctas_per_row']} -> {r['ctas_per_row']} "
                   f"| {o['stage1_reads_per_element']:.3f} -> {r['stage1_reads_per_element']:.3f} "
                   f"| {o['warp_instructions_per_key']:.2f} -> {r['warp_instructions_per_key']:.2f} "
                   f"| {o['model_us']:.1f} -> {r['model_us']:.1f} | {r['model_one_cta_us']:.1f} |")
    moved = []
    for r in after["rows"]:
        o = b.get((r["set"], r["dtype"], r["n"], r["k"], r["data"]))
        if r["family"] != "radix" or (r["set"], r["n"], r["k"]) in TARGETS or o is None:
            continue
        if (o["ctas_per_sm"], round(o["model_us"], 1)) != (r["ctas_per_sm"], round(r["model_us"], 1)):
            moved.append((o, r))
    if moved:
        out += ["", "The other rows whose CTAs per SM or model estimate moved:", "",
                "| shape | data | CTAs/SM | warp instr/key | model us at 4/clock (bound) |", "|---|---|---|---|---|"]
        out += [f"| {r['model_rows']}x{r['n']} K{r['k']} {r['dtype']} | {r['data']} | {o['ctas_per_sm']} -> {r['ctas_per_sm']} "
                f"| {o['warp_instructions_per_key']:.3f} -> {r['warp_instructions_per_key']:.3f} "
                f"| {o['model_us']:.1f} ({o['model_bound']}) -> {r['model_us']:.1f} ({r['model_bound']}) |" for o, r in moved]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--md", metavar="FILE")
    a = ap.parse_args()
    text = table(json.loads(Path(a.before).read_text()), json.loads(Path(a.after).read_text()))
    print(text, end="")
    if a.md:
        Path(a.md).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
