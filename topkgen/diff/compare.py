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
from topkgen.common.errors import InputError
from topkgen.policy import MAX_POLICY_BYTES, DispatchError, KernelSpec, Policy, PolicyError, all_kernels, loads, \
    plan, read_file, rule_record, select
from topkgen.common.schema import describe
from topkgen.policy.split import ROWS_MAX
from topkgen.diff.worktree_files import WorktreeFileError, read_worktree_file
from topkgen.build.sources import MAX_TEMPLATE_BYTES, TEMPLATES_IN_REPO, GitRepo, SourceError, Templates, \
    directory_templates, installed_templates, repo_path

DEFAULT_POLICY_IN_REPO = "policies/topk.yaml"
DEFAULT_KS = (1, 16, 32, 64, 100, 128, 256, 512, 1024)
DEFAULT_NS = (64, 256, 1000, 1024, 2048, 4096, 8192, 16384, 32768, 131072)
DEFAULT_ROWS = (1, 64, 4096)  # a sampling step, a small batch, a large one: the split depends on rows
UNSUPPORTED = "unsupported"
MOVES = ("jit -> aot", "aot -> jit", "kernel -> kernel", "split", "served -> unsupported", "unsupported -> served")
ASPECTS = ("launch", "resources", "parameters", "source")

# Record fields with a short name and the aspect of a kernel they belong to, in the order a
# changed kernel lists them; any other field is a parameter named by its path.
FIELDS: dict[str, tuple[str, str]] = {
    "launch.threads_per_block": ("threads", "launch"),
    "launch.rows_per_block": ("rows per block", "launch"),
    "launch.min_ctas_per_sm": ("min CTAs/SM", "launch"),
    "launch.grid": ("grid", "launch"),
    "n_window.min": ("n min", "parameters"),
    "n_window.max": ("n max", "parameters"),
    "resources.registers": ("registers", "resources"),
    "resources.spill_stores": ("spill stores", "resources"),
    "resources.spill_loads": ("spill loads", "resources"),
    "resources.stack_bytes": ("stack", "resources"),
    "resources.static_shared_bytes": ("static smem", "resources"),
    "launch.dynamic_shared_bytes": ("dynamic smem", "resources"),
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

    @property
    def differs(self) -> bool:
        return bool(self.added or self.removed or self.changed or self.jit_changed or self.tiers_added
                    or self.tiers_removed or self.tiers_changed
                    or self.dispatch or any(a != b for a, b in self.counts.values()))

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
                         "moves": {m: sum(1 for d in self.dispatch if d["moves"] == m) for m in MOVES}},
        }


# ----------------------------------------------------------------------------- loading sides

def load_side(spec: str, *, policy_in_repo: str = DEFAULT_POLICY_IN_REPO, cwd: Path | None = None) -> Side:
    """A side named on the command line: a bundle or manifest, a policy file, or a revision."""
    path = Path(cwd or ".") / spec
    try:
        if path.is_dir() or (path.is_file() and path.suffix == ".json"):
            return _manifest_side(spec, path)
        if path.exists():  # a policy file, or a pipe: diff <(git show main:policies/topk.yaml) policies/topk.yaml
            policy = loads(read_file(path, spec), source=spec)
            return _rendered_side(spec, "policy", "policy file, installed templates", policy, installed_templates())
        return _revision_side(spec, policy_in_repo, cwd)
    except (PolicyError, SourceError) as err:
        raise DiffInputError(str(err)) from None
    except OSError as err:
        raise DiffInputError(f"{spec}: cannot read: {err.strerror}") from None


def _range_parts(spec: str, cwd: Path | None) -> tuple[str, str, str] | None:
    """(A, the dots, B) of a range A..B or A...B; None when `spec` is a file or a revision: a
    ref's name never holds `..` (git check-ref-format), and no revision begins or ends with
    '/', so an end that does makes the whole a path (../policy.yaml), named as given by its
    reader."""
    if ".." not in spec or (Path(cwd or ".") / spec).exists():
        return None
    parts = spec.partition("...") if "..." in spec else spec.partition("..")
    return None if any(end.startswith("/") or end.endswith("/") for end in parts[::2]) else parts


def is_range(spec: str, cwd: Path | None = None) -> bool:
    """Whether `spec` is a range (A..B, A...B) rather than a file or a revision."""
    return _range_parts(spec, cwd) is not None


def revision_range(spec: str, cwd: Path | None = None) -> tuple[str, str] | None:
    """OLD and NEW of a range as `git diff` reads one: `A..B` is A against B, `A...B` is B
    against the commit where A and B meet (an empty end is HEAD); None when `spec` is no
    range (see _range_parts)."""
    parts = _range_parts(spec, cwd)
    if parts is None:
        return None
    old, dots, new = parts
    old, new = old or "HEAD", new or "HEAD"
    if dots == "..":
        return old, new
    try:
        return GitRepo.around(cwd, spec).merge_base(old, new), new
    except SourceError as err:
        raise DiffInputError(str(err)) from None


def load_worktree_side(*, policy_in_repo: str = DEFAULT_POLICY_IN_REPO, cwd: Path | None = None) -> Side:
    """The working tree of the repository around `cwd`, as `git diff REV` compares with."""
    try:
        repo = GitRepo.around(cwd, WORKTREE)
        policy_path = repo_path(policy_in_repo, "--policy")
        try:  # as a revision's: a regular file, through no symbolic link (a FIFO hung, a link out leaked)
            data = read_worktree_file(repo.root, policy_path, MAX_POLICY_BYTES, f"{WORKTREE}: {policy_path}")
        except WorktreeFileError as err:
            raise DiffInputError(err.strerror) from None
        policy = loads(data, source=policy_path)
        folder = repo.root / TEMPLATES_IN_REPO
        if folder.is_dir():
            templates, where = directory_templates(folder, f"{TEMPLATES_IN_REPO}/"), f"{TEMPLATES_IN_REPO}/"
        else:
            templates, where = installed_templates(), "installed templates"
        return _rendered_side(WORKTREE, "worktree", f"working tree: {policy_path}, {where}", policy, templates)
    except (PolicyError, SourceError) as err:
        raise DiffInputError(str(err)) from None


def _revision_side(rev: str, policy_in_repo: str, cwd: Path | None) -> Side:
    repo = GitRepo.around(cwd, rev)
    commit = repo.commit(rev)
    policy_path = repo_path(policy_in_repo, "--policy")
    files = repo.read(commit, {policy_path: MAX_POLICY_BYTES, TEMPLATES_IN_REPO: MAX_TEMPLATE_BYTES}, label=rev)
    if policy_path not in files:
        raise DiffInputError(f"{rev}: no {policy_path} at that revision")
    policy = loads(files[policy_path], source=f"{rev}:{policy_path}")
    prefix = f"{TEMPLATES_IN_REPO}/"
    template_files = {name[len(prefix):]: data for name, data in files.items() if name.startswith(prefix)}
    if template_files:
        templates, where = Templates(f"{rev}:{prefix}", template_files), prefix
    else:  # a repository of policies alone: the installed templates render them
        templates, where = installed_templates(), f"installed templates (no {prefix} at that revision)"
    return _rendered_side(rev, "revision", f"revision {commit[:12]}: {policy_path}, {where}", policy, templates)


def _rendered_side(label: str, kind: str, origin: str, policy: Policy, templates: Templates) -> Side:
    specs = {s.name: s for arch in policy.archs for s in plan(policy, arch)}
    side = Side(label, kind, origin, policy, list(policy.archs), {},
                {r.name: rule_record(r) for r in policy.jit_only_rules()}, templates, specs)
    for name, spec in specs.items():
        source, used = templates.render(spec)
        side.kernels[name] = {**spec.record(), "source_sha256": _sha256(source)}
        side.sources[name], side.loads[name] = source, used
    _render_jit_kernels(side, templates)
    return side


def _render_jit_kernels(side: Side, templates: Templates) -> None:
    """Every kernel of every rule and dtype that the side does not hold ahead of time."""
    side.jit_templates = templates
    for arch in side.policy.archs:
        for spec in all_kernels(side.policy, arch):
            if spec.name not in side.kernels:
                source, used = templates.render(spec)
                side.jit_kernels[spec.name] = {"arch": arch, "source_sha256": _sha256(source)}
                side.loads[spec.name] = used


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _manifest_side(label: str, path: Path) -> Side:
    from topkgen.build import bundle, shards  # with NVRTC's module: only when a side is a bundle

    try:
        manifest, root = bundle.load_manifest(path, versions=(1, 2, 3))  # diff still reads older bundles
        part = shards.part_of(manifest)
        if part is not None:  # as the loaders refuse it: compared whole, it would lose most of its kernels
            raise DiffInputError(f"{label}: a part of a sharded build ({part}), not a bundle; merge the parts "
                                 f"first: topkgen merge PART... --out DIR")
        if path.is_dir() and manifest["schema_version"] == bundle.SCHEMA_VERSION:
            bundle.read_files(root, manifest)  # a bundle whose files would not load is not "the same"
        policy = bundle.manifest_policy(manifest, label)
    except bundle.ManifestError as err:
        raise DiffInputError(str(err)) from None
    archs = list(manifest["archs"])
    side = Side(label, "manifest", f"bundle for {', '.join(archs) or 'no arch'}, NVRTC {manifest['nvrtc_version']}",
                policy, archs, {k["name"]: k for k in manifest["kernels"]},
                # every arch's tiers, from the policy the manifest embeds: an arch the bundle lacks
                # keeps its JIT-only tiers (the runtime serves it all by JIT from that policy)
                {r.name: rule_record(r) for r in policy.jit_only_rules()}, built=True, manifest=manifest)
    _render_jit_kernels(side, installed_templates())  # what this topkgen's runtime compiles for it
    return side


def build_sides(sides: list[Side], jobs: int = 1,
                progress: Callable[[KernelSpec, Any, float], None] | None = None) -> None:
    """Compile every side not built yet through the compile cache (NVRTC in parallel); its
    kernel records become what its manifest would carry: resources, cubin size and hash."""
    from topkgen.build import bundle

    for side in sides:
        if side.built:
            continue
        specs = list(side.specs.values())
        results = bundle.compile_specs(specs, jobs, progress, source_of=lambda spec, s=side: s.sources[spec.name])
        side.kernels = {spec.name: bundle.kernel_entry(spec, compiled, source)
                        for spec, (source, compiled) in zip(specs, results)}
        side.built = True


def kernels_to_build(sides: list[Side]) -> int:
    return sum(len(s.specs) for s in sides if not s.built)


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


def movement(before: dict[str, Any], after: dict[str, Any]) -> str:
    if before["source"] == UNSUPPORTED:
        return "unsupported -> served"
    if after["source"] == UNSUPPORTED:
        return "served -> unsupported"
    if before["source"] != after["source"]:
        return f"{before['source']} -> {after['source']}"
    return "kernel -> kernel" if before["kernel"] != after["kernel"] else "split"


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
    if shapes is None:
        shapes = default_shapes(policy_archs, dtypes)
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
                  tiers_removed, tiers_changed, dispatch, len(shapes))


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
