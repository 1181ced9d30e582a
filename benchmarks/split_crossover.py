"""The measured split crossover (issue 14, point 6).

`make gpu-check` times each batch of the grid below twice on the GPU: from a bundle whose
policy splits every batch it can (`rows_below` at the schema's maximum) and from one whose
policy splits none (no `split` section). The kernels are the same in both bundles; only the
dispatch differs, so the two times compare splitting with not splitting and nothing else.
This module picks the `rows_below` those times favour and writes it into the policy file:

    python benchmarks/split_crossover.py RESULTS/split_crossover.json            # shows it
    python benchmarks/split_crossover.py RESULTS/split_crossover.json --write    # edits it

The rule chosen is the one with the lowest geometric mean time over the grid (every shape
counts alike, whatever its size); ties go to the smaller threshold, which splits less and
needs less workspace. Only `rows_below` of the measured arch changes: one value on one line,
the rest of the file (comments included) stays byte for byte.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

ROWS = (1, 4, 16, 32, 64, 96, 128, 192, 264)
SHAPES = tuple((dtype, n, k) for dtype in ("float32", "bfloat16") for n in (131072, 262144) for k in (16, 256, 1024))
GRID = tuple((dtype, n, k, rows) for dtype, n, k in SHAPES for rows in ROWS)  # what gpu-check times
ALWAYS_SPLIT = 65536  # the schema's largest rows_below
COMMENT = "# measured on {device} (make gpu-check, benchmarks/split_crossover.py)"


@dataclass(frozen=True)
class Measured:
    """One batch, timed split (chunks per row as the always-split policy cut it) and unsplit."""

    dtype: str
    n: int
    k: int
    rows: int
    chunks: int
    split_us: float
    unsplit_us: float


@dataclass(frozen=True)
class Crossover:
    rows_below: int | None  # None: splitting paid on no batch measured
    geomean_ratio: float    # the chosen rule's time over unsplit time, geometric mean over the grid
    worst: Measured | None  # the batch the chosen rule slows down most (None: it slows none)
    measured_rows: tuple[int, ...]


def variant_policies(policy_text: str, arch: str) -> dict[str, str]:
    """The two policies gpu-check builds: 'split' splits every batch of `arch` it can,
    'unsplit' none. Everything else is the policy's own."""
    doc = yaml.safe_load(policy_text)
    split = doc["archs"][arch].get("split")
    if split is None:
        raise ValueError(f"archs.{arch}: the policy has no split section to measure")
    always = json.loads(json.dumps(doc))
    always["archs"][arch]["split"] = {**{key: v for key, v in split.items() if key != "rows_below_by_k"},
                                      "rows_below": ALWAYS_SPLIT}  # every K rung
    never = json.loads(json.dumps(doc))
    del never["archs"][arch]["split"]
    return {"split": yaml.safe_dump(always, sort_keys=False), "unsplit": yaml.safe_dump(never, sort_keys=False)}


def choose_rows_below(measured: list[Measured]) -> Crossover:
    """Split below R, not from R: R is 1 (never), or one more than a measured batch. Batches
    the always-split policy did not split (one chunk) ran the same launch twice and are
    left out: their difference is noise."""
    split_ones = [m for m in measured if m.chunks > 1]
    if not split_ones:
        raise ValueError("no measured batch was split: nothing to decide")
    rows = sorted({m.rows for m in split_ones})

    def log_time(m: Measured, threshold: int) -> float:
        return math.log(m.split_us if m.rows < threshold else m.unsplit_us)

    base = sum(math.log(m.unsplit_us) for m in split_ones)
    scored = [(sum(log_time(m, t) for m in split_ones), t) for t in [1] + [r + 1 for r in rows]]
    best_score, best = min(scored)  # ties: the smaller threshold
    slowed = [m for m in split_ones if m.rows < best and m.split_us > m.unsplit_us]
    worst = max(slowed, key=lambda m: m.split_us / m.unsplit_us, default=None)
    ratio = math.exp((best_score - base) / len(split_ones))
    return Crossover(None if best == 1 else best, ratio, worst, tuple(rows))


def summary(arch: str, device: str, now: int | None, found: Crossover) -> str:
    lines = [f"measured on {device}, {arch}: split batches of {', '.join(map(str, found.measured_rows))} rows"]
    if found.rows_below is None:
        lines.append("splitting paid on no measured batch: remove the split section of this arch")
    else:
        lines.append(f"crossover: rows_below {found.rows_below} (the policy has {now}); split below it, the "
                     f"grid takes {found.geomean_ratio:.2f}x the unsplit time (geometric mean)")
        if found.rows_below > found.measured_rows[-1]:
            lines.append(f"splitting still paid at the largest batch measured ({found.measured_rows[-1]} rows): "
                         f"the crossover lies beyond it")
    if found.worst is not None:
        w = found.worst
        lines.append(f"slowest under that rule: {w.dtype} {w.rows} x {w.n} K={w.k} in {w.chunks} chunks, "
                     f"{w.split_us / w.unsplit_us:.2f}x the unsplit time")
    return "\n".join(lines)


def table(measured: list[Measured]) -> str:
    head = "| dtype | N | K | rows | chunks | split us | unsplit us | split / unsplit |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for m in measured:
        lines.append(f"| {m.dtype} | {m.n} | {m.k} | {m.rows} | {m.chunks} | {m.split_us:.1f} | "
                     f"{m.unsplit_us:.1f} | {m.split_us / m.unsplit_us:.2f} |")
    return "\n".join(lines)


def rows_below_span(policy_text: str, arch: str) -> tuple[int, int]:
    """Where archs.<arch>.split.rows_below's value sits in the text: (start, end) offsets."""
    node = yaml.compose(policy_text)
    for key in ("archs", arch, "split", "rows_below"):
        values = [v for k, v in node.value if k.value == key] if isinstance(node, yaml.MappingNode) else []
        if not values:
            raise ValueError(f"the policy has no archs.{arch}.split.rows_below to write")
        node = values[0]
    return node.start_mark.index, node.end_mark.index


def with_rows_below(policy_text: str, arch: str, rows_below: int, device: str) -> str:
    """The policy text with that one value replaced, and the line's comment saying where it
    comes from."""
    start, end = rows_below_span(policy_text, arch)
    line_end = policy_text.find("\n", end)
    line_end = len(policy_text) if line_end < 0 else line_end
    rest = policy_text[end:line_end]
    kept = rest[:rest.index("#")].rstrip() if "#" in rest else rest.rstrip()
    note = COMMENT.format(device=" ".join(device.replace("#", " ").split()))
    return f"{policy_text[:start]}{rows_below}{kept}  {note}{policy_text[line_end:]}"


def load_results(path: Path) -> tuple[str, str, list[Measured], int]:
    """arch, device, the batches measured, and how many the grid had (a run out of time
    measures fewer)."""
    doc = json.loads(path.read_text())
    return doc["arch"], doc["device"], [Measured(**m) for m in doc["measured"]], int(doc["grid"])


def write_results(path: Path, arch: str, device: str, measured: list[Measured], grid: int) -> None:
    path.write_text(json.dumps({"arch": arch, "device": device, "grid": grid,
                                "measured": [asdict(m) for m in measured]}, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The measured split crossover, from gpu-check's "
                                                 "split_crossover.json, written into the policy.")
    parser.add_argument("results", type=Path, help="split_crossover.json from `make gpu-check`")
    parser.add_argument("--policy", type=Path, default=Path(__file__).resolve().parent.parent / "policies" / "topk.yaml")
    parser.add_argument("--write", action="store_true", help="write rows_below into the policy file")
    parser.add_argument("--partial", action="store_true",
                        help="write even when the run measured only part of the grid (it ran out of time)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from topkgen import policy

    try:
        arch, device, measured, grid = load_results(args.results)
        text = args.policy.read_text()
        current = policy.loads(text, source=str(args.policy)).archs[arch].split
        found = choose_rows_below(measured)
    except (OSError, ValueError, KeyError, TypeError, policy.PolicyError) as err:
        print(f"split_crossover: {err}", file=sys.stderr)
        return 2
    print(table(measured) + "\n")
    print(summary(arch, device, current.rows_below if current else None, found))
    if len(measured) < grid:
        print(f"partial: {len(measured)} of the grid's {grid} batches were measured")
    if found.rows_below is None or not args.write:
        return 0
    if len(measured) < grid and not args.partial:
        print(f"split_crossover: {args.results}: {len(measured)} of {grid} batches measured; the choice may "
              f"differ on the rest, so nothing is written (--partial writes it anyway)", file=sys.stderr)
        return 2
    edited = with_rows_below(text, arch, found.rows_below, device)
    policy.loads(edited, source=str(args.policy))  # still a valid policy, or nothing is written
    with tempfile.NamedTemporaryFile("w", dir=args.policy.parent, delete=False, suffix=".tmp") as tmp:
        tmp.write(edited)
    shutil.copymode(args.policy, tmp.name)
    os.replace(tmp.name, args.policy)
    print(f"wrote rows_below {found.rows_below} for {arch} into {args.policy}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
