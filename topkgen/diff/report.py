"""`topkgen diff` reports sized for review: the summary first, then the details; a changed
kernel shows only the fields that changed; shapes that move the same way are grouped; the
markdown (a pull-request comment holds 65,536 characters) stays under MARKDOWN_LIMIT whatever
the sides, folding details into <details> blocks and counting what it leaves out.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

from topkgen.diff.compare import Report, field_aspect, field_label
from topkgen.diff.regions import region_groups
from topkgen.diff.sides import Side
from topkgen.common.reader import printable

SCHEMA_VERSION = 6  # schemas/diff.schema.json
MARKDOWN_LIMIT = 60_000
LABEL_CHARS = 120      # a side's label or origin as the header shows it
SHAPES_PER_ROW = 12    # shapes a markdown dispatch row lists before "+N more"

Style = Callable[..., str]


def _plain(text: str, **_: Any) -> str:
    return text


# ----------------------------------------------------------------------------- json

def to_json(report: Report) -> dict[str, Any]:
    def side(s: Side) -> dict[str, Any]:
        return {"label": s.label, "kind": s.kind, "origin": s.origin, "policy_sha256": s.policy.sha256,
                "archs": s.archs, "built": s.built}

    return {
        "format": "topkgen-diff", "schema_version": SCHEMA_VERSION,
        "old": side(report.old), "new": side(report.new), "differs": report.differs,
        "summary": report.summary(),
        "kernels": {"added": [k["name"] for k in report.added], "removed": [k["name"] for k in report.removed],
                    "changed": report.changed, "jit_changed": report.jit_changed,
                    "over_budget": report.over_budget},
        "jit_only": {"added": report.tiers_added, "removed": report.tiers_removed, "changed": report.tiers_changed},
        "dispatch": {"shapes_checked": report.shapes_checked, "changed": report.dispatch,
                     "regions": report.regions},
    }


# ----------------------------------------------------------------------------- shared wording

def _clip(text: str, limit: int = LABEL_CHARS) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _value(value: Any) -> str:
    return _clip(value if isinstance(value, str) else json.dumps(value, sort_keys=True), 60)


def change_text(change: dict[str, Any]) -> str:
    """`threads 256 -> 512, registers 52 -> 46 (-6), cubin 30000 -> 32280 (+7.6%)`"""
    fields = change["changes"]
    parts = []
    for path, delta in fields.items():
        old, new = delta["old"], delta["new"]
        if path == "source_sha256":
            parts.append(_templates_text(change))
        elif path == "params" and isinstance(old, list) and isinstance(new, list):
            parts.append(_params_text(old, new))
        elif path == "sha256":
            if "size_bytes" not in fields and "source_sha256" not in fields:
                parts.append("cubin bytes differ, same size")
        elif path == "size_bytes" and isinstance(old, int) and isinstance(new, int):
            ratio = f"{(new - old) / old * 100:+.1f}%" if old else "new"
            parts.append(f"cubin {old} -> {new} ({ratio})")
        elif field_aspect(path) == "resources" and isinstance(old, int) and isinstance(new, int):
            parts.append(f"{field_label(path)} {old} -> {new} ({new - old:+d})")
        else:
            parts.append(f"{field_label(path)} {_value(old)} -> {_value(new)}")
    return ", ".join(parts)


def tier_change_text(change: dict[str, Any]) -> str:
    """`reason "old words" -> "new words", k [32] -> [16]`: a reason quoted as JSON writes it
    (one line) and whole up to 400 characters, since a reviewer reads the words; other
    fields as a kernel's are."""
    parts = []
    for key, delta in change["changes"].items():
        if key == "reason":
            parts.append(f"reason {_clip(json.dumps(delta['old'], ensure_ascii=False), 400)} -> "
                         f"{_clip(json.dumps(delta['new'], ensure_ascii=False), 400)}")
        else:
            parts.append(f"{key} {_value(delta['old'])} -> {_value(delta['new'])}")
    return ", ".join(parts)


def _params_text(old: list[dict[str, str]], new: list[dict[str, str]]) -> str:
    """`params +tickets +merged_values`: the parameters a loader passes that one side lists and
    the other does not (`params reordered` or `params retyped` where the names are the same)."""
    before, after = ([p.get("name") for p in side] for side in (old, new))
    words = [f"-{name}" for name in before if name not in after] + [f"+{name}" for name in after if name not in before]
    if words:
        return "params " + _clip(" ".join(words), 120)
    return "params reordered" if before != after else "params retyped"


def _templates_text(change: dict[str, Any]) -> str:
    templates = change["templates"]
    if templates is None:  # a bundle side: which templates built it is not recorded
        return "source"
    return f"source ({', '.join(templates)})" if templates else "source (templates unchanged)"


def _choice_text(choice: dict[str, Any]) -> str:
    note = f": {choice['note']}" if choice.get("note") else ""
    if choice["kernel"] is None:
        return f"unsupported ({choice.get('note', '')})"
    chunks = f", {choice['chunks']} chunks per row" if choice.get("chunks", 1) > 1 else ""
    return f"{choice['kernel']} ({choice['source']}{chunks}{note})"


def _budget_text(row: dict[str, Any]) -> str:
    def one(problems: list[str] | None) -> str:
        return "n/a" if problems is None else "; ".join(problems) or "within budget"
    return f"old: {one(row['old'])}; new: {one(row['new'])}"


def dispatch_groups(report: Report) -> list[dict[str, Any]]:
    """Shapes that move the same way (arch, dtype, mode, old and new choice), together."""
    groups: dict[tuple, dict[str, Any]] = {}
    for d in report.dispatch:
        s = d["shape"]
        mode = "det" if s["deterministic"] else "fast"
        key = (s["arch"], s["dtype"], mode, json.dumps(d["old"], sort_keys=True), json.dumps(d["new"], sort_keys=True))
        group = groups.setdefault(key, {"where": f"{s['arch']} {s['dtype']} {mode}", "old": d["old"],
                                        "new": d["new"], "moves": d["moves"], "shapes": []})
        group["shapes"].append(f"k={s['k']} n={s['n']}" + ("" if s["rows"] is None else f" rows={s['rows']}"))
    return list(groups.values())


def _summary_lines(report: Report) -> dict[str, str]:
    """The summary's sentences, shared by the text and the markdown."""
    s = report.summary()
    k = s["kernels"]
    changed_in = ", ".join(f"{n} in {a}" for a, n in k["changed_in"].items() if n)
    lines = {"kernels": f"{k['added']} added, {k['removed']} removed, {k['changed']} changed"
                        + (f" ({changed_in})" if changed_in else ""),
             "JIT kernels": f"{k['jit_changed_in_source']} changed in source"}
    budget = s["over_budget"]
    if budget["old"] is not None or budget["new"] is not None:
        def count(n: int | None) -> str:
            return "not built" if n is None else str(n)
        lines["over budget"] = f"old {count(budget['old'])}, new {count(budget['new'])}"
    tiers = s["jit_only"]
    lines["JIT-only tiers"] = f"{tiers['added']} added, {tiers['removed']} removed, {tiers['changed']} changed"
    d = s["dispatch"]
    moves = ", ".join(f"{n} {m}" for m, n in d["moves"].items() if n)
    lines["dispatch"] = f"{d['changed']} of {d['shapes_checked']} shapes change" + (f": {moves}" if moves else "")
    if d["regions"] is not None:
        lines["dispatch"] += f"; {d['regions']} region(s) of (k, n, rows) move"
    return lines


# ----------------------------------------------------------------------------- text

def to_text(report: Report, style: Style = _plain, *, summary_only: bool = False) -> str:
    # A label is what the command line named (a file name may hold a line break or a
    # terminal's escape sequence): shown escaped, as every message shows a path.
    lines = [f"topkgen diff {printable(report.old.label)} -> {printable(report.new.label)}",
             f"  old: {_clip(report.old.origin)}", f"  new: {_clip(report.new.origin)}", "", "kernel counts:"]
    for arch, (o, n) in report.counts.items():
        mark = "" if o == n else style(f"  ({n - o:+d})", fg="yellow")
        lines.append(f"  {arch:<8} {o} -> {n}{mark}")
    lines += [f"{title}: {text}" for title, text in _summary_lines(report).items()]
    lines.append(style("differ", fg="yellow", bold=True) if report.differs else "same")
    if summary_only or not report.differs and not report.over_budget:
        return "\n".join(lines)

    def section(title: str, items: list[str]) -> None:
        if items:
            lines.extend(["", f"{title} ({len(items)}):", *items])

    section("kernels added", [style(f"  + {k['name']}", fg="green") for k in report.added])
    section("kernels removed", [style(f"  - {k['name']}", fg="red") for k in report.removed])
    section("kernels changed", [f"  {style('~ ' + c['name'], fg='yellow')}: {change_text(c)}" for c in report.changed])
    section("JIT kernels changed in source", [f"  {style('~ ' + c['name'], fg='yellow')}: {_templates_text(c)}"
                                              for c in report.jit_changed])
    section("kernels over budget", [f"  {style('! ' + b['name'], fg='red')}: {_budget_text(b)}"
                                    for b in report.over_budget])
    section("JIT-only tiers added", [style(f"  + {t['rule']}: {t['reason']}", fg="green") for t in report.tiers_added])
    section("JIT-only tiers removed",
            [style(f"  - {t['rule']}: {t['reason']}", fg="red") for t in report.tiers_removed])
    section("JIT-only tiers changed",
            [f"  {style('~ ' + t['rule'], fg='yellow')}: {tier_change_text(t)}" for t in report.tiers_changed])
    if report.regions is None:  # --shapes: the workload's own shapes
        section("dispatch changes, shapes grouped by move",
                [f"  {g['where']}: {_choice_text(g['old'])} -> {_choice_text(g['new'])}  "
                 f"{style('[' + g['moves'] + ']', fg='magenta')}  {len(g['shapes'])} shape(s): {', '.join(g['shapes'])}"
                 for g in dispatch_groups(report)])
    else:
        section("dispatch changes, regions grouped by move",
                [f"  {g['where']}: {_choice_text(g['old'])} -> {_choice_text(g['new'])}  "
                 f"{style('[' + g['moves'] + ']', fg='magenta')}  {'; '.join(g['ranges'])}"
                 for g in region_groups(report.regions)])
    return "\n".join(lines)


# ----------------------------------------------------------------------------- markdown

# Markdown's specials behind a backslash (CommonMark escapes any ASCII punctuation), so a
# reason renders as the words it holds; `<` and `>` are HTML entities already, and `_` only
# where it could start or end emphasis (not within a word: sm_90 stays as it reads). GitHub
# links `@name` and `#1` in the rendered text, whatever escaped them in the source: a
# zero-width space after `@` and `#` keeps a reason from notifying anyone or citing an issue.
# GitHub also turns `:rocket:` into an emoji, a bare `https://...` or `www.` into a link and
# `GH-1` into a reference to issue 1: the same zero-width space after the colon that opens a
# shortcode or a scheme's `//`, and after `www` and `GH`, keeps them as the characters they are.
MARKDOWN_ESCAPES = str.maketrans({**{c: "\\" + c for c in "\\*[]()!|`~"}, "#": "\\#&#8203;", "@": "@&#8203;"})
EMPHASIS_UNDERSCORE = re.compile(r"(?<![^\W_])_|_(?![^\W_])")
AUTOLINKS = re.compile(r":(?=[\w+-]+:)|:(?=//)|(?<![^\W_])(?:www(?=\.)|gh(?=-[0-9]))", re.IGNORECASE)


def _md(text: str) -> str:
    """Free text (rule reasons, labels) as inert markdown inside a table cell or list, on
    one line (a line break would end the row)."""
    text = " ".join(text.splitlines()).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").translate(MARKDOWN_ESCAPES)
    text = AUTOLINKS.sub(lambda m: m[0] + "&#8203;", text)
    return EMPHASIS_UNDERSCORE.sub(r"\\_", text)


def _code(text: str) -> str:
    """A name or a side's label as inline code, on one line (a line break in a file's name
    ended the heading and started a table)."""
    return f"`{_clip(printable(text)).replace('`', chr(39))}`"


def _markdown_summary(report: Report) -> str:
    out = [f"### topkgen diff {_code(report.old.label)} → {_code(report.new.label)}: "
           f"{'differ' if report.differs else 'same'}", "",
           f"old: {_md(_clip(report.old.origin))}<br>new: {_md(_clip(report.new.origin))}", "",
           "| arch | old | new | change |", "|---|---:|---:|---:|"]
    out += [f"| {_md(a)} | {o} | {n} | {n - o:+d} |" for a, (o, n) in report.counts.items()]
    out.append("")
    out += [f"- **{title[0].upper() + title[1:]}**: {_md(text)}" for title, text in _summary_lines(report).items()]
    return "\n".join(out) + "\n"


def _markdown_sections(report: Report) -> list[tuple[str, list[str], list[str]]]:
    """(title, header lines, rows) per details block."""
    def shapes(group: dict[str, Any]) -> str:
        listed = group["shapes"][:SHAPES_PER_ROW]
        more = len(group["shapes"]) - len(listed)
        return ", ".join(listed) + (f", +{more} more" if more else "")

    def ranges(group: dict[str, Any]) -> str:
        listed = group["ranges"][:SHAPES_PER_ROW]
        more = len(group["ranges"]) - len(listed)
        return "; ".join(listed) + (f"; +{more} more" if more else "")

    table = ["| kernel | change |", "|---|---|"]
    groups = dispatch_groups(report)
    if report.regions is None:
        dispatch = (f"Dispatch: {len(report.dispatch)} shapes change, in {len(groups)} groups",
                    ["| shapes | old | new | move | which |", "|---|---|---|---|---|"],
                    [f"| {_md(g['where'])} | {_md(_choice_text(g['old']))} | {_md(_choice_text(g['new']))} "
                     f"| {_md(g['moves'])} | {len(g['shapes'])}: {shapes(g)} |" for g in groups])
    else:
        by_move = region_groups(report.regions)
        dispatch = (f"Dispatch: {len(report.regions)} regions move, in {len(by_move)} groups",
                    ["| where | old | new | move | regions (k, n, rows) |", "|---|---|---|---|---|"],
                    [f"| {_md(g['where'])} | {_md(_choice_text(g['old']))} | {_md(_choice_text(g['new']))} "
                     f"| {_md(g['moves'])} | {_md(ranges(g))} |" for g in by_move])
    return [
        (f"Kernels added: {len(report.added)}", [], [f"- {_code(k['name'])}" for k in report.added]),
        (f"Kernels removed: {len(report.removed)}", [], [f"- {_code(k['name'])}" for k in report.removed]),
        (f"Kernels changed: {len(report.changed)}", table,
         [f"| {_code(c['name'])} | {_md(change_text(c))} |" for c in report.changed]),
        (f"JIT kernels changed in source: {len(report.jit_changed)}", table,
         [f"| {_code(c['name'])} | {_md(_templates_text(c))} |" for c in report.jit_changed]),
        (f"Kernels over budget: {len(report.over_budget)}", table,
         [f"| {_code(b['name'])} | {_md(_budget_text(b))} |" for b in report.over_budget]),
        (f"JIT-only tiers added: {len(report.tiers_added)}", [],
         [f"- {_code(t['rule'])}: {_md(_clip(str(t['reason']), 400))}" for t in report.tiers_added]),
        (f"JIT-only tiers removed: {len(report.tiers_removed)}", [],
         [f"- {_code(t['rule'])}: {_md(_clip(str(t['reason']), 400))}" for t in report.tiers_removed]),
        (f"JIT-only tiers changed: {len(report.tiers_changed)}", ["| tier | change |", "|---|---|"],
         [f"| {_code(t['rule'])} | {_md(_clip(tier_change_text(t), 800))} |" for t in report.tiers_changed]),
        dispatch,
    ]


def to_markdown(report: Report, *, summary_only: bool = False, limit: int = MARKDOWN_LIMIT) -> str:
    """Summary first, then one <details> block per non-empty section, cut to stay under
    `limit` characters with a count of the rows left out."""
    out = [_markdown_summary(report)]
    size = len(out[0])
    if summary_only:
        return out[0]
    closing = "\n</details>\n"
    section_note = "\n_{} more left out._\n"
    final_note = ("\n_{} rows left out to stay under {:,} characters; `topkgen diff --format json` lists "
                  "everything._\n")
    reserve = len(final_note) + 20  # the final note, whatever its count
    left_out = 0
    for title, header, rows in _markdown_sections(report):
        if not rows:
            continue
        opening = "\n".join(["", f"<details><summary>{_md(title)}</summary>", "", *header, ""])
        tail = len(closing) + len(section_note) + 10
        if size + len(opening) + tail + reserve >= limit:
            left_out += len(rows)
            continue
        out.append(opening)
        size += len(opening)
        shown = 0
        for row in rows:
            if size + len(row) + 1 + tail + reserve >= limit:
                break
            out.append(row + "\n")
            size += len(row) + 1
            shown += 1
        if shown < len(rows):
            note = section_note.format(len(rows) - shown)
            out.append(note)
            size += len(note)
            left_out += len(rows) - shown
        out.append(closing)
        size += len(closing)
    if left_out:
        out.append(final_note.format(left_out, limit))
    return "".join(out)

