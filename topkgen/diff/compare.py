"""Compare two kernel sets: counts, kernels added, removed and changed (parameters, launch,
rendered source, and resources when both sides are built), JIT-only tiers, and dispatch over
a grid of shapes.

A side is a policy file, a manifest file, a bundle directory, a git revision (its policy and
templates read through git, never from the work tree) or the working tree. Every side that
has templates renders its kernels, so a template change shows as changed source without
compiling; `build_sides` compiles them through the compile cache to compare resources.
Kernels are matched by name, which encodes every parameter; dispatch on both sides is
decided by topkgen.policy.select, the one dispatch rule, over the union of both sides' archs
and dtypes, so a shape one side does not serve is a change and never an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from topkgen.common import reader, suggest
from topkgen.policy import DispatchError, Policy, select
from topkgen.common.schema import describe
from topkgen.policy.split import ROWS_MAX
from topkgen.build.sources import Templates
from topkgen.diff.regions import UNSUPPORTED, dispatch_regions, movement
from topkgen.diff.sides import DiffInputError, Side
# k above 1024 too (issue 29): the K=2048 and 4096 rungs, and 10000 and 40000 on the large-k path
DEFAULT_KS = (1, 16, 32, 64, 100, 128, 256, 512, 1024, 2048, 4096, 10000, 40000)
DEFAULT_NS = (64, 256, 1000, 1024, 2048, 4096, 8192, 16384, 32768, 131072, 163840)
DEFAULT_ROWS = (1, 64, 4096)  # a sampling step, a small batch, a large one: the split depends on rows
MOVES = ("jit -> aot", "aot -> jit", "kernel -> kernel", "split", "served -> unsupported", "unsupported -> served")
ASPECTS = ("launch", "resources", "parameters", "source")

# Record fields with a short name and the aspect of a kernel they belong to, in the order a
# changed kernel lists them; any other field is a parameter named by its path.
FIELDS: dict[str, tuple[str, str]] = {
    "launch.threads_per_block": ("threads", "launch"),
    "launch.rows_per_block": ("rows per block", "launch"),
    "launch.min_ctas_per_sm": ("min CTAs/SM", "launch"),
    "launch.grid": ("grid", "launch"),
    "params": ("params", "parameters"),
    "n_window.min": ("n min", "parameters"),
    "n_window.max": ("n max", "parameters"),
    "resources.registers": ("registers", "resources"),
    "resources.spill_stores": ("spill stores", "resources"),
    "resources.spill_loads": ("spill loads", "resources"),
    "resources.stack_bytes": ("stack", "resources"),
    "resources.static_shared_bytes": ("static smem", "resources"),
    "launch.dynamic_shared_bytes": ("dynamic smem", "resources"),
    "launch.shared_buffer_bytes": ("smem buffer", "resources"),  # schema 6
    "launch.shared_bytes": ("smem rule", "launch"),
    "resources.barriers": ("barriers", "resources"),
    "size_bytes": ("cubin", "resources"),
    "sha256": ("cubin sha256", "resources"),
    "source_sha256": ("source", "source"),
}
IDENTITY = ("name", "arch")


@dataclass(frozen=True)
class Shape:
    arch: str
    dtype: str
    k: int
    n: int
    deterministic: bool = False
    rows: int | None = None  # the batch size; None: unknown, served unsplit
    where: str | None = field(default=None, compare=False)  # a workload file's: "FILE:LINE: shape #I"

    def record(self) -> dict[str, Any]:
        return {"arch": self.arch, "dtype": self.dtype, "k": self.k, "n": self.n, "rows": self.rows,
                "deterministic": self.deterministic}


@dataclass
class Report:
    old: Side
    new: Side
    counts: dict[str, tuple[int, int]]
    added: list[dict]
    removed: list[dict]
    changed: list[dict]      # {name, arch, aspects, changes: {field: {old, new}}, templates}
    jit_changed: list[dict]  # JIT kernels of both sides whose source differs: {name, arch, templates}
    over_budget: list[dict]  # {name, arch, old: [problem] | None, new: [problem] | None}
    tiers_added: list[dict]
    tiers_removed: list[dict]
    tiers_changed: list[dict]  # tiers of both sides whose record differs: {rule, changes: {field: {old, new}}}
    dispatch: list[dict]     # {shape, old, new, moves}
    shapes_checked: int
    # Exact regions that move (diff/regions.py), with the default grid; None with --shapes,
    # whose own shapes are what the report lists.
    regions: list[dict] | None = None

    @property
    def differs(self) -> bool:
        return bool(self.added or self.removed or self.changed or self.jit_changed or self.tiers_added
                    or self.tiers_removed or self.tiers_changed
                    or self.dispatch or self.regions or any(a != b for a, b in self.counts.values()))

    def summary(self) -> dict[str, Any]:
        """The counts a reviewer reads first; `--stat` prints this alone."""
        def over(which: str) -> int | None:
            built = (self.old if which == "old" else self.new).built
            return sum(1 for b in self.over_budget if b[which]) if built else None

        return {
            "counts": {a: {"old": o, "new": n} for a, (o, n) in self.counts.items()},
            "kernels": {"added": len(self.added), "removed": len(self.removed), "changed": len(self.changed),
                        "changed_in": {a: sum(1 for c in self.changed if a in c["aspects"]) for a in ASPECTS},
                        "jit_changed_in_source": len(self.jit_changed)},
            "over_budget": {"old": over("old"), "new": over("new")},
            "jit_only": {"added": len(self.tiers_added), "removed": len(self.tiers_removed),
                         "changed": len(self.tiers_changed)},
            "dispatch": {"shapes_checked": self.shapes_checked, "changed": len(self.dispatch),
                         "moves": {m: sum(1 for d in self.dispatch if d["moves"] == m) for m in MOVES},
                         "regions": None if self.regions is None else len(self.regions)},
        }


# ----------------------------------------------------------------------------- shapes

def default_shapes(archs: list[str], dtypes: list[str]) -> list[Shape]:
    return [Shape(a, d, k, n, det, rows) for a in archs for d in dtypes for k in DEFAULT_KS for n in DEFAULT_NS
            for rows in DEFAULT_ROWS for det in (False, True) if k <= n]


MAX_SHAPES_BYTES = 16 << 20  # JSON, read at C speed (reader.MAX_JSON_VALUES bounds its values)
# YAML is parsed an event at a time in Python (about 1 s a MiB): a 15 MiB file took 15 s to refuse.
# A workload of 10,000 shapes is about 600 KB of YAML.
MAX_SHAPES_YAML_BYTES = 1 << 20


def load_shapes(path: str) -> list[Shape]:
    """A workload file: YAML or JSON (read as JSON when named .json, so that its errors are
    JSON's), a list of {arch, dtype, k, n, rows?, deterministic?}; dtypes may be spelled as
    on the command line (fp32, bf16, ...). A shape listed again counts once (a list gathered
    from logs repeats its shapes): "2 of 3 shapes change" counts shapes, not lines."""
    try:
        if path.lower().endswith(".json"):
            document = reader.Document(reader.read_json(path, limit=MAX_SHAPES_BYTES, what="workload file"))
        else:
            document = reader.read_yaml(path, limit=MAX_SHAPES_YAML_BYTES, what="YAML workload file (JSON may be larger)")
    except reader.ReadError as err:
        raise DiffInputError(str(err)) from None
    doc = document.value
    if not isinstance(doc, list) or not doc:
        raise DiffInputError(f"{path}: expected a non-empty list of shapes")
    shapes: dict[Shape, None] = {}  # in the file's order; a Shape's `where` does not tell two apart
    for i, item in enumerate(doc):
        line = document.position((i,))[0]
        where = f"{path}{'' if line is None else f':{line}'}: shape #{i + 1}"
        if not isinstance(item, dict):
            raise DiffInputError(f"{where}: expected a mapping with arch, dtype, k, n")
        unknown = set(item) - {"arch", "dtype", "k", "n", "rows", "deterministic"}
        if unknown:
            raise DiffInputError(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
        for key in ("arch", "dtype", "k", "n"):
            if key not in item:
                raise DiffInputError(f"{where}: missing '{key}'")
        for key, kind in (("arch", str), ("dtype", str), ("k", int), ("n", int)):
            if not isinstance(item[key], kind) or isinstance(item[key], bool):
                raise DiffInputError(f"{where}: {key}: expected {'a string' if kind is str else 'an integer'}, "
                                     f"got {describe(item[key])}")
        det = item.get("deterministic", False)
        if not isinstance(det, bool):
            raise DiffInputError(f"{where}: deterministic: expected true or false, got {describe(det)}")
        rows = item.get("rows")
        if rows is not None and (not isinstance(rows, int) or isinstance(rows, bool) or not 0 <= rows <= ROWS_MAX):
            raise DiffInputError(f"{where}: rows: expected an integer in 0..{ROWS_MAX}, got {describe(rows)}")
        shapes.setdefault(Shape(item["arch"], suggest.dtype(item["dtype"]), item["k"], item["n"], det, rows, where))
    return list(shapes)


# ----------------------------------------------------------------------------- serving

def policy_serves(policy: Policy, shape: Shape) -> dict[str, Any]:
    """The kernel a policy picks for a shape, AOT or JIT, or `unsupported` when the policy
    has no such arch or dtype."""
    for value, known, what in ((shape.arch, policy.archs, "arch"), (shape.dtype, policy.dtypes, "dtype")):
        if value not in known:
            return {"kernel": None, "source": UNSUPPORTED, "rule": None, "note": f"{what} {value} not in the policy"}
    sel = select(policy, shape.arch, shape.dtype, shape.k, shape.n, deterministic=shape.deterministic, rows=shape.rows)
    return {"kernel": sel.kernel.name, "source": sel.source, "rule": sel.rule, "chunks": sel.chunks}


def bundle_serves(side: Side, shape: Shape) -> dict[str, Any]:
    """What a bundle serves for a shape, and how, as the runtime decides it: a lookup in the
    table the runtime uses (an arch the bundle lacks is compiled at run time)."""
    from topkgen.policy.dispatch_table import serving_table

    choice = policy_serves(side.policy, shape)  # the rule that chose it, or unsupported
    if choice["source"] == UNSUPPORTED:
        return choice
    if shape.arch not in side.tables:
        side.tables[shape.arch] = serving_table(side.manifest, side.policy, shape.arch)
    table, held = side.tables[shape.arch]
    found = table.lookup(shape.dtype, shape.k, shape.n, shape.deterministic, jit=True, rows=shape.rows)
    if not held:
        return {**choice, "kernel": found.kernel, "source": "jit", "chunks": found.chunks,
                "note": f"the bundle has no {shape.arch} kernel"}
    return {**choice, "kernel": found.kernel, "source": found.source, "chunks": found.chunks}


def serves(side: Side, shape: Shape) -> dict[str, Any]:
    return bundle_serves(side, shape) if side.kind == "manifest" else policy_serves(side.policy, shape)


# ----------------------------------------------------------------------------- comparing

def compare(old: Side, new: Side, shapes: list[Shape] | None = None) -> Report:
    archs = list(dict.fromkeys(old.archs + new.archs))
    counts = {a: (sum(1 for k in old.kernels.values() if k["arch"] == a),
                  sum(1 for k in new.kernels.values() if k["arch"] == a)) for a in archs}
    counts["total"] = (len(old.kernels), len(new.kernels))
    added = [new.kernels[n] for n in new.kernels if n not in old.kernels]
    removed = [old.kernels[n] for n in old.kernels if n not in new.kernels]
    changed = [c for c in (_kernel_change(old, new, name) for name in new.kernels if name in old.kernels)
               if c is not None]
    jit_changed = [{"name": name, "arch": kernel["arch"],
                    "templates": _changed_templates(old.jit_templates, new.jit_templates, old, new, name)}
                   for name, kernel in new.jit_kernels.items()
                   if name in old.jit_kernels and old.jit_kernels[name]["source_sha256"] != kernel["source_sha256"]]
    tiers_added = [new.jit_tiers[r] for r in new.jit_tiers if r not in old.jit_tiers]
    tiers_removed = [old.jit_tiers[r] for r in old.jit_tiers if r not in new.jit_tiers]
    tiers_changed = [c for c in (_tier_change(old.jit_tiers[r], tier) for r, tier in new.jit_tiers.items()
                                 if r in old.jit_tiers) if c is not None]

    policy_archs = list(dict.fromkeys([*old.policy.archs, *new.policy.archs]))
    dtypes = list(dict.fromkeys([*old.policy.dtypes, *new.policy.dtypes]))
    regions = None
    if shapes is None:
        shapes = default_shapes(policy_archs, dtypes)
        regions = dispatch_regions(old, new)
    dispatch = []
    for shape in shapes:
        try:
            if shape.arch not in policy_archs:
                raise DispatchError(f"arch: '{shape.arch}' is in neither side's policy")
            if shape.dtype not in dtypes:
                raise DispatchError(f"dtype: '{shape.dtype}' is in neither side's policy")
            before, after = serves(old, shape), serves(new, shape)
        except DispatchError as err:
            raise DiffInputError(f"{shape.where or f'shape {shape.record()}'}: {err}") from None
        if (before["kernel"], before["source"], before.get("chunks")) != (after["kernel"], after["source"],
                                                                         after.get("chunks")):
            dispatch.append({"shape": shape.record(), "old": before, "new": after, "moves": movement(before, after)})
    return Report(old, new, counts, added, removed, changed, jit_changed, _over_budget(old, new), tiers_added,
                  tiers_removed, tiers_changed, dispatch, len(shapes), regions)


def _tier_change(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any] | None:
    """A JIT-only tier both sides keep, with the fields of its record that differ (None: same):
    its reason too, which the manifest carries to every reader of `plan` and `explain`."""
    changes = {key: {"old": old.get(key), "new": new.get(key)} for key in dict.fromkeys([*old, *new])
               if old.get(key) != new.get(key)}
    return {"rule": new["rule"], "changes": changes} if changes else None


def _flatten(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def field_label(path: str) -> str:
    return FIELDS.get(path, (path, "parameters"))[0]


def field_aspect(path: str) -> str:
    return FIELDS.get(path, (path, "parameters"))[1]


def _kernel_change(old: Side, new: Side, name: str) -> dict[str, Any] | None:
    """Only the fields that differ, of those both sides record (a plan has no resources)."""
    a, b = _flatten(old.kernels[name]), _flatten(new.kernels[name])
    order = list(FIELDS)
    paths = sorted((p for p in b if p in a and p not in IDENTITY and a[p] != b[p]),
                   key=lambda p: (ASPECTS.index(field_aspect(p)), order.index(p) if p in order else len(order)))
    if not paths:
        return None
    change: dict[str, Any] = {"name": name, "arch": new.kernels[name]["arch"],
                              "aspects": [x for x in ASPECTS if any(field_aspect(p) == x for p in paths)],
                              "changes": {p: {"old": a[p], "new": b[p]} for p in paths}, "templates": None}
    if "source_sha256" in paths:
        change["templates"] = _changed_templates(old.templates, new.templates, old, new, name)
    return change


def _changed_templates(old_templates: Templates | None, new_templates: Templates | None, old: Side, new: Side,
                       name: str) -> list[str] | None:
    """The template files a kernel's render read whose content differs between the sides
    ([]: the policy's values changed its source); None when a side's templates are unknown."""
    if old_templates is None or new_templates is None:
        return None
    read = set(old.loads.get(name, ())) | set(new.loads.get(name, ()))
    return sorted(t for t in read if old_templates.digest(t) != new_templates.digest(t))


def _over_budget(old: Side, new: Side) -> list[dict[str, Any]]:
    """Kernels over their register or spill budget on either built side: per side its
    problems, [] within budget, None where the side is not built or lacks the kernel."""
    if not (old.built or new.built):
        return []
    from topkgen.build import bundle

    def problems(side: Side, name: str) -> list[str] | None:
        entry = side.kernels.get(name)
        if not side.built or entry is None:
            return None
        return bundle.budget_problems(entry["resources"], entry["budget"])

    rows = []
    for name in dict.fromkeys([*old.kernels, *new.kernels]):
        before, after = problems(old, name), problems(new, name)
        if before or after:
            arch = (new.kernels.get(name) or old.kernels[name])["arch"]
            rows.append({"name": name, "arch": arch, "old": before, "new": after})
    return rows
