"""Where dispatch moves, as exact regions: `k 1..32, n 4096..2^31-1, all rows`, not the grid
points that sample them.

Each side's dispatch is its table (topkgen.policy.dispatch_table.build_list: disjoint boxes of
k, n and rows covering the domain, each with the kernel `select` picks there, JIT on), so
intersecting the two sides' boxes finds every (k, n, rows) served otherwise, whichever
points a grid would sample. A bundle side serves the archs it lacks by JIT, as the runtime
does; an arch or dtype a side's policy lacks is unsupported there. Boxes that move the same
way are merged with their neighbours, so a reviewer reads few ranges.
"""

from __future__ import annotations

from typing import Any

from topkgen.policy import Policy
from topkgen.policy.dispatch_table import build_list
from topkgen.policy.model import MODES, N_MAX
from topkgen.policy.split import ROWS_MAX

Box = tuple[int, int, int, int, int, int]  # k lo, k hi, n lo, n hi, rows lo, rows hi (inclusive)
UNSUPPORTED = "unsupported"


def _answers(side: Any, arch: str, dtype: str, mode: str) -> list[tuple[Box, dict[str, Any]]] | None:
    """The side's dispatch boxes for (arch, dtype, mode) with their choices; None when its
    policy lacks the arch or the dtype (unsupported there)."""
    policy: Policy = side.policy
    if arch not in policy.archs or dtype not in policy.dtypes:
        return None
    jit_only = side.kind == "manifest" and arch not in side.archs  # a bundle serves the archs it lacks by JIT
    return [((row["k"][0], row["k"][1], row["n"][0], row["n"][1], row["rows"][0], row["rows"][1]),
             {"kernel": row["kernel"], "source": "jit" if jit_only else row["source"], "chunks": row["chunks"]})
            for row in build_list(policy, arch, dtype, mode)]


def _serving(side: Any) -> tuple[str, tuple[str, ...] | None]:
    """What decides a side's dispatch: its policy, and for a bundle the archs it holds."""
    return side.policy.sha256, tuple(sorted(side.archs)) if side.kind == "manifest" else None


def _whole(choice: dict[str, Any]) -> list[tuple[Box, dict[str, Any]]]:
    return [((1, N_MAX, 1, N_MAX, 1, ROWS_MAX), choice)]


def _unsupported(side: Any, arch: str, dtype: str) -> dict[str, Any]:
    what = f"arch {arch}" if arch not in side.policy.archs else f"dtype {dtype}"
    return {"kernel": None, "source": UNSUPPORTED, "chunks": None, "note": f"{what} not in the policy"}


def _intersect(a: Box, b: Box) -> Box | None:
    box = (max(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), min(a[3], b[3]), max(a[4], b[4]), min(a[5], b[5]))
    if box[0] > box[1] or box[2] > box[3] or box[4] > box[5] or box[3] < box[0]:  # empty, or all n < k
        return None
    return box


def _merge(boxes: list[Box]) -> list[Box]:
    """Neighbours that together form a box, merged along rows, then n, then k, until none
    is left to merge (a handful of rounds)."""
    boxes = sorted(set(boxes))
    while True:
        before = len(boxes)
        for axis in (2, 1, 0):  # rows, n, k
            lo = 2 * axis
            other = [i for i in range(6) if i not in (lo, lo + 1)]
            boxes.sort(key=lambda b: ([b[i] for i in other], b[lo]))
            merged: list[Box] = []
            for box in boxes:
                last = merged[-1] if merged else None
                if last and all(last[i] == box[i] for i in other) and last[lo + 1] + 1 == box[lo]:
                    widened = list(last)
                    widened[lo + 1] = box[lo + 1]
                    merged[-1] = tuple(widened)  # type: ignore[assignment]
                else:
                    merged.append(box)
            boxes = merged
        if len(boxes) == before:
            return sorted(boxes)


def movement(before: dict[str, Any], after: dict[str, Any]) -> str:
    """How a shape's serving moved between the sides (diff's MOVES), for the grid and the regions alike."""
    if before["source"] == UNSUPPORTED:
        return "unsupported -> served"
    if after["source"] == UNSUPPORTED:
        return "served -> unsupported"
    if before["source"] != after["source"]:
        return f"{before['source']} -> {after['source']}"
    return "kernel -> kernel" if before["kernel"] != after["kernel"] else "split"


def dispatch_regions(old: Any, new: Any) -> list[dict[str, Any]]:
    """Every region of (arch, dtype, mode, k, n, rows) the two sides serve differently:
    {arch, dtype, mode, k: [lo, hi], n: [lo, hi], rows: [lo, hi], old, new, moves}, ranges
    inclusive, in arch, dtype, mode and k order. rows 0 (an empty batch) launches nothing on
    either side and is left out."""
    if _serving(old) == _serving(new):  # the same rules and the same JIT-only archs: nothing moves
        return []
    archs = list(dict.fromkeys([*old.policy.archs, *new.policy.archs]))
    dtypes = list(dict.fromkeys([*old.policy.dtypes, *new.policy.dtypes]))
    regions = []
    for arch in archs:
        for dtype in dtypes:
            for mode in MODES:
                sides = [_answers(side, arch, dtype, mode) for side in (old, new)]
                if sides[0] is None and sides[1] is None:
                    continue
                a, b = (s if s is not None else _whole(_unsupported(side, arch, dtype))
                        for s, side in zip(sides, (old, new)))
                moved: dict[tuple, list[Box]] = {}
                choices: dict[tuple, tuple[dict[str, Any], dict[str, Any]]] = {}
                for box_a, before in a:
                    for box_b, after in b:
                        if before == after:
                            continue
                        box = _intersect(box_a, box_b)
                        if box is not None:
                            key = (tuple(before.values()), tuple(after.values()))
                            moved.setdefault(key, []).append(box)
                            choices[key] = (before, after)
                for key, boxes in moved.items():
                    before, after = choices[key]
                    for box in _merge(boxes):
                        regions.append({"arch": arch, "dtype": dtype, "mode": mode, "k": [box[0], box[1]],
                                        "n": [max(box[2], box[0]), box[3]], "rows": [box[4], box[5]],
                                        "old": dict(before), "new": dict(after), "moves": movement(before, after)})
    order = {arch: i for i, arch in enumerate(archs)}
    regions.sort(key=lambda r: (order[r["arch"]], dtypes.index(r["dtype"]), MODES.index(r["mode"]), r["k"], r["n"],
                                r["rows"]))
    return regions


def _bound(value: int, top: int, top_word: str) -> str:
    return top_word if value == top else str(value)


def region_text(region: dict[str, Any]) -> str:
    """`k 1..32, n 4096..2^31-1, all rows` (a single value once: `k 64`)."""
    def span(name: str, lo: int, hi: int, top: int, top_word: str) -> str:
        return f"{name} {lo}" if lo == hi else f"{name} {lo}..{_bound(hi, top, top_word)}"

    rows = region["rows"]
    rows_text = "all rows" if rows == [1, ROWS_MAX] else span("rows", rows[0], rows[1], ROWS_MAX, "2^31-1")
    return ", ".join((span("k", *region["k"], N_MAX, "2^31-1"), span("n", *region["n"], N_MAX, "2^31-1"), rows_text))


def region_groups(regions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Regions that move the same way (arch, dtype, mode, old and new choice), together:
    {where, old, new, moves, ranges: [text]}."""
    groups: dict[tuple, dict[str, Any]] = {}
    for r in regions:
        mode = "det" if r["mode"] == "deterministic" else "fast"
        key = (r["arch"], r["dtype"], mode, tuple(r["old"].values()), tuple(r["new"].values()))
        group = groups.setdefault(key, {"where": f"{r['arch']} {r['dtype']} {mode}", "old": r["old"], "new": r["new"],
                                        "moves": r["moves"], "ranges": []})
        group["ranges"].append(region_text(r))
    return list(groups.values())
