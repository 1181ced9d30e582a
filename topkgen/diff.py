"""Compare two kernel sets: counts, kernels added/removed/changed, JIT-only tiers, and
dispatch over a grid of shapes. Each side is a policy file, a manifest file, a bundle
directory, or a git revision of the current repository (read through git, never from the
work tree). Kernels are matched by name, which encodes every parameter; dispatch on both
sides is decided by topkgen.policy.select, the one dispatch rule.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from topkgen import bundle
from topkgen.policy import DTYPE_SIZES, DispatchError, Policy, PolicyError, loads, plan, rule_record, select

DEFAULT_POLICY_IN_REPO = "policies/topk.yaml"
DEFAULT_KS = (1, 16, 32, 64, 100, 128, 256, 512, 1024)
DEFAULT_NS = (64, 256, 1000, 1024, 2048, 4096, 8192, 16384, 32768, 131072)
PARAM_FIELDS = ("family", "rule", "dtype", "k", "k_min", "n_window", "mode", "work", "work_rung", "launch",
                "vector_tail", "loads_in_flight")
BUILT_FIELDS = ("resources", "size_bytes")


class DiffInputError(ValueError):
    """A side or a workload file that cannot be read; exit status 2."""


@dataclass
class Side:
    label: str
    kind: str  # policy | manifest | revision
    policy: Policy
    archs: list[str]
    kernels: dict[str, dict[str, Any]]  # name -> record (manifest entries carry resources)
    jit_tiers: dict[str, dict[str, Any]]
    schema_version: int | None = None

    @property
    def built(self) -> bool:
        return self.kind == "manifest"


@dataclass(frozen=True)
class Shape:
    arch: str
    dtype: str
    k: int
    n: int
    deterministic: bool = False

    def record(self) -> dict[str, Any]:
        return {"arch": self.arch, "dtype": self.dtype, "k": self.k, "n": self.n,
                "deterministic": self.deterministic}


@dataclass
class Report:
    old: Side
    new: Side
    counts: dict[str, tuple[int, int]]
    added: list[dict]
    removed: list[dict]
    changed: list[dict]
    tiers_added: list[dict]
    tiers_removed: list[dict]
    dispatch: list[dict]
    shapes_checked: int

    @property
    def differs(self) -> bool:
        return bool(self.added or self.removed or self.changed or self.tiers_added or self.tiers_removed
                    or self.dispatch or any(a != b for a, b in self.counts.values()))


# ----------------------------------------------------------------------------- loading sides

def load_side(spec: str, *, policy_in_repo: str = DEFAULT_POLICY_IN_REPO, cwd: Path | None = None) -> Side:
    path = Path(cwd or ".") / spec
    if path.is_dir() or (path.is_file() and path.suffix == ".json"):
        return _manifest_side(spec, path)
    if path.is_file():
        try:
            return _policy_side(spec, "policy", loads(path.read_bytes(), source=spec))
        except PolicyError as err:
            raise DiffInputError(str(err)) from None
    return _revision_side(spec, policy_in_repo, cwd)


def _policy_side(label: str, kind: str, policy: Policy) -> Side:
    archs = list(policy.archs)
    kernels = {s.name: s.record() for arch in archs for s in plan(policy, arch)}
    tiers = {r.name: rule_record(r) for r in policy.jit_only_rules()}
    return Side(label, kind, policy, archs, kernels, tiers)


def _manifest_side(label: str, path: Path) -> Side:
    try:
        manifest, _ = bundle.load_manifest(path)
        policy = bundle.manifest_policy(manifest, label)
    except bundle.ManifestError as err:
        raise DiffInputError(str(err)) from None
    kernels = {k["name"]: k for k in manifest["kernels"]}
    tiers = {t["rule"]: t for t in manifest["jit_only"]}
    return Side(label, "manifest", policy, list(manifest["archs"]), kernels, tiers, manifest["schema_version"])


def _git(args: list[str], cwd: Path | None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], capture_output=True, cwd=cwd)


def _revision_side(rev: str, policy_in_repo: str, cwd: Path | None) -> Side:
    if rev.startswith("-"):
        raise DiffInputError(f"{rev}: not a file, directory or git revision")
    top = _git(["rev-parse", "--show-toplevel"], cwd)
    if top.returncode != 0:
        raise DiffInputError(f"{rev}: not a file or directory, and not inside a git repository")
    root = Path(top.stdout.decode().strip())
    commit = _git(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], root)
    if commit.returncode != 0:
        raise DiffInputError(f"{rev}: not a file, directory or git revision of {root.name}")
    sha = commit.stdout.decode().strip()
    shown = _git(["show", f"{sha}:{policy_in_repo}"], root)
    if shown.returncode != 0:
        raise DiffInputError(f"{rev}: no {policy_in_repo} at that revision")
    label = f"{rev}:{policy_in_repo}"
    try:
        return _policy_side(rev, "revision", loads(shown.stdout, source=label))
    except PolicyError as err:
        raise DiffInputError(str(err)) from None


# ----------------------------------------------------------------------------- shapes

def default_shapes(archs: list[str]) -> list[Shape]:
    return [Shape(a, d, k, n, det) for a in archs for d in DTYPE_SIZES for k in DEFAULT_KS for n in DEFAULT_NS
            for det in (False, True) if k <= n]


def load_shapes(path: str) -> list[Shape]:
    """A workload file: YAML or JSON, a list of {arch, dtype, k, n, deterministic?}."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except OSError as err:
        raise DiffInputError(f"{path}: cannot read workload file: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise DiffInputError(f"{path}: not valid YAML or JSON: {err}") from None
    if not isinstance(doc, list) or not doc:
        raise DiffInputError(f"{path}: expected a non-empty list of shapes")
    shapes = []
    for i, item in enumerate(doc):
        where = f"{path}: shape #{i + 1}"
        if not isinstance(item, dict):
            raise DiffInputError(f"{where}: expected a mapping with arch, dtype, k, n")
        unknown = set(item) - {"arch", "dtype", "k", "n", "deterministic"}
        if unknown:
            raise DiffInputError(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
        for key in ("arch", "dtype", "k", "n"):
            if key not in item:
                raise DiffInputError(f"{where}: missing '{key}'")
        for key, kind in (("arch", str), ("dtype", str), ("k", int), ("n", int)):
            if not isinstance(item[key], kind) or isinstance(item[key], bool):
                raise DiffInputError(f"{where}: {key}: expected {'a string' if kind is str else 'an integer'}, "
                                     f"got {item[key]!r}")
        det = item.get("deterministic", False)
        if not isinstance(det, bool):
            raise DiffInputError(f"{where}: deterministic: expected true or false, got {det!r}")
        shapes.append(Shape(item["arch"], item["dtype"], item["k"], item["n"], det))
    return shapes


def _choice(policy: Policy, shape: Shape) -> dict[str, Any]:
    if shape.arch not in policy.archs:
        return {"kernel": None, "source": "none", "rule": None, "note": f"{shape.arch} not in the policy"}
    sel = select(policy, shape.arch, shape.dtype, shape.k, shape.n, deterministic=shape.deterministic)
    return {"kernel": sel.kernel.name, "source": sel.source, "rule": sel.rule}


# ----------------------------------------------------------------------------- comparing

def compare(old: Side, new: Side, shapes: list[Shape] | None = None, *, workload: str | None = None) -> Report:
    if old.schema_version is not None and new.schema_version is not None and old.schema_version != new.schema_version:
        raise DiffInputError(f"manifests of different schema versions: {old.label} has {old.schema_version}, "
                             f"{new.label} has {new.schema_version}")
    archs = list(dict.fromkeys(old.archs + new.archs))
    counts = {a: (sum(1 for k in old.kernels.values() if k["arch"] == a),
                  sum(1 for k in new.kernels.values() if k["arch"] == a)) for a in archs}
    counts["total"] = (len(old.kernels), len(new.kernels))
    added = [new.kernels[n] for n in new.kernels if n not in old.kernels]
    removed = [old.kernels[n] for n in old.kernels if n not in new.kernels]
    fields = PARAM_FIELDS + (BUILT_FIELDS if old.built and new.built else ())
    changed = []
    for name in old.kernels.keys() & new.kernels.keys():
        delta = {f: {"old": old.kernels[name].get(f), "new": new.kernels[name].get(f)} for f in fields
                 if old.kernels[name].get(f) != new.kernels[name].get(f)}
        if delta:
            changed.append({"name": name, "arch": new.kernels[name]["arch"], "changes": delta})
    changed.sort(key=lambda c: c["name"])
    tiers_added = [new.jit_tiers[r] for r in new.jit_tiers if r not in old.jit_tiers]
    tiers_removed = [old.jit_tiers[r] for r in old.jit_tiers if r not in new.jit_tiers]

    if shapes is None:
        shapes = default_shapes([a for a in archs if a in old.policy.archs and a in new.policy.archs])
    dispatch = []
    for i, shape in enumerate(shapes):
        try:
            if shape.arch not in old.policy.archs and shape.arch not in new.policy.archs:
                raise DispatchError(f"arch: '{shape.arch}' is in neither side's policy")
            before, after = _choice(old.policy, shape), _choice(new.policy, shape)
        except DispatchError as err:
            where = f"{workload}: shape #{i + 1}" if workload else f"shape {shape.record()}"
            raise DiffInputError(f"{where}: {err}") from None
        if (before["kernel"], before["source"]) != (after["kernel"], after["source"]):
            dispatch.append({"shape": shape.record(), "old": before, "new": after,
                             "moves": f"{before['source']} -> {after['source']}"
                             if before["source"] != after["source"] else None})
    return Report(old, new, counts, added, removed, changed, tiers_added, tiers_removed, dispatch, len(shapes))


# ----------------------------------------------------------------------------- output

def to_json(report: Report) -> dict[str, Any]:
    def side(s: Side) -> dict[str, Any]:
        return {"label": s.label, "kind": s.kind, "policy_sha256": s.policy.sha256, "archs": s.archs, "built": s.built}

    return {
        "format": "topkgen-diff", "format_version": 1,
        "old": side(report.old), "new": side(report.new), "differs": report.differs,
        "counts": {a: {"old": o, "new": n} for a, (o, n) in report.counts.items()},
        "kernels": {"added": [k["name"] for k in report.added], "removed": [k["name"] for k in report.removed],
                    "changed": report.changed},
        "jit_only": {"added": report.tiers_added, "removed": report.tiers_removed},
        "dispatch": {"shapes_checked": report.shapes_checked, "changed": report.dispatch},
    }


def _shape_text(s: dict[str, Any]) -> str:
    return f"{s['arch']} {s['dtype']} k={s['k']} n={s['n']}{' det' if s['deterministic'] else ''}"


def _choice_text(c: dict[str, Any]) -> str:
    return f"{c['kernel']} ({c['source'].upper()})" if c["kernel"] else f"- ({c.get('note', 'none')})"


def _change_text(changes: dict[str, Any]) -> str:
    return "; ".join(f"{f}: {json.dumps(d['old'], sort_keys=True)} -> {json.dumps(d['new'], sort_keys=True)}"
                     for f, d in changes.items())


def to_text(report: Report, style=lambda text, **_: text) -> str:
    lines = [f"topkgen diff {report.old.label} -> {report.new.label}", "", "kernel counts:"]
    for arch, (o, n) in report.counts.items():
        mark = "" if o == n else style(f"  ({n - o:+d})", fg="yellow")
        lines.append(f"  {arch:<8} {o} -> {n}{mark}")
    lines.append("")
    lines.append(f"kernels added: {len(report.added)}")
    lines += [style(f"  + {k['name']}", fg="green") for k in report.added]
    lines.append(f"kernels removed: {len(report.removed)}")
    lines += [style(f"  - {k['name']}", fg="red") for k in report.removed]
    lines.append(f"kernels changed: {len(report.changed)}")
    lines += [style(f"  ~ {c['name']}: {_change_text(c['changes'])}", fg="yellow") for c in report.changed]
    lines.append("")
    lines.append(f"JIT-only tiers added: {len(report.tiers_added)}")
    lines += [style(f"  + {t['rule']}: {t['reason']}", fg="green") for t in report.tiers_added]
    lines.append(f"JIT-only tiers removed: {len(report.tiers_removed)}")
    lines += [style(f"  - {t['rule']}: {t['reason']}", fg="red") for t in report.tiers_removed]
    lines.append("")
    lines.append(f"dispatch: {len(report.dispatch)} of {report.shapes_checked} shapes change")
    for d in report.dispatch:
        move = style(f"  [{d['moves']}]", fg="magenta") if d["moves"] else ""
        lines.append(f"  {_shape_text(d['shape'])}: {_choice_text(d['old'])} -> {_choice_text(d['new'])}{move}")
    lines.append("")
    lines.append("differ" if report.differs else "same")
    return "\n".join(lines)


def to_markdown(report: Report) -> str:
    out = [f"### topkgen diff `{report.old.label}` → `{report.new.label}`", "",
           "| arch | old | new | change |", "|---|---:|---:|---:|"]
    out += [f"| {a} | {o} | {n} | {n - o:+d} |" for a, (o, n) in report.counts.items()]
    out.append("")
    for title, items in (("Kernels added", [k["name"] for k in report.added]),
                         ("Kernels removed", [k["name"] for k in report.removed])):
        out.append(f"**{title}: {len(items)}**")
        out += [f"- `{name}`" for name in items]
        out.append("")
    out.append(f"**Kernels changed: {len(report.changed)}**")
    if report.changed:
        out += ["", "| kernel | change |", "|---|---|"]
        out += [f"| `{c['name']}` | {_change_text(c['changes']).replace('|', '/')} |" for c in report.changed]
    out.append("")
    for title, tiers in (("JIT-only tiers added", report.tiers_added), ("JIT-only tiers removed", report.tiers_removed)):
        out.append(f"**{title}: {len(tiers)}**")
        out += [f"- `{t['rule']}`: {t['reason']}" for t in tiers]
        out.append("")
    out.append(f"**Dispatch: {len(report.dispatch)} of {report.shapes_checked} shapes change**")
    if report.dispatch:
        out += ["", "| shape | old | new |", "|---|---|---|"]
        out += [f"| {_shape_text(d['shape'])} | {_choice_text(d['old'])} | {_choice_text(d['new'])} |"
                for d in report.dispatch]
    return "\n".join(out) + "\n"
