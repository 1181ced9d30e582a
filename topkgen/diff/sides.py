"""The two sides of a diff: a policy file, a manifest or bundle, a git revision (its policy and
templates read through git, never from the work tree) or the working tree, each loaded into
the same Side, its kernels rendered so that a template change shows without compiling, and
compiled through the compile cache when resources are compared (`build_sides`)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from topkgen.common.errors import InputError
from topkgen.policy import MAX_POLICY_BYTES, KernelSpec, Policy, PolicyError, all_kernels, loads, \
    plan, read_file, rule_record
from topkgen.diff.worktree_files import WorktreeFileError, read_worktree_file
from topkgen.manifest.params import params
from topkgen.build.sources import MAX_TEMPLATE_BYTES, TEMPLATES_IN_REPO, GitRepo, SourceError, Templates, \
    directory_templates, display_name, installed_templates, repo_path

DEFAULT_POLICY_IN_REPO = "policies/topk.yaml"
WORKTREE = "working tree"


class DiffInputError(InputError, ValueError):
    """A side or a workload file that cannot be read; exit status 2."""


@dataclass
class Side:
    label: str
    kind: str    # policy | manifest | revision | worktree
    origin: str  # where its policy and templates come from, in words
    policy: Policy
    archs: list[str]                     # the archs whose AOT kernels the side holds
    kernels: dict[str, dict[str, Any]]   # name -> record (a built side's carry resources)
    jit_tiers: dict[str, dict[str, Any]]
    templates: Templates | None = None   # what its AOT kernels render from; None for a bundle
    specs: dict[str, KernelSpec] = field(default_factory=dict)      # what --build compiles
    sources: dict[str, str] = field(default_factory=dict)           # name -> rendered source
    loads: dict[str, tuple[str, ...]] = field(default_factory=dict)  # name -> template files read
    built: bool = False
    # The kernels its runtime would compile (JIT-only tiers, JIT dtypes, archs a bundle lacks):
    # name -> {arch, source_sha256}, rendered from jit_templates (a bundle's: the installed ones).
    jit_kernels: dict[str, dict[str, str]] = field(default_factory=dict)
    jit_templates: Templates | None = None
    manifest: dict[str, Any] | None = None  # a bundle side's manifest
    tables: dict[str, Any] = field(default_factory=dict)  # arch -> (its dispatch table, held)


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
        if folder.is_symlink():
            raise DiffInputError(f"{WORKTREE}: {TEMPLATES_IN_REPO}: a symbolic link in the working tree (to "
                                 f"{display_name(os.readlink(folder))}); diff reads a working tree's regular files "
                                 f"only, as a revision's")
        if folder.is_dir():
            where = f"{TEMPLATES_IN_REPO}/"
            templates = directory_templates(folder, where, bounded=True)
        else:
            templates, where = installed_templates(), "installed templates"
        return _rendered_side(WORKTREE, "worktree", f"working tree: {policy_path}, {where}", policy, templates)
    except (PolicyError, SourceError) as err:
        raise DiffInputError(str(err)) from None


def _revision_side(rev: str, policy_in_repo: str, cwd: Path | None) -> Side:
    repo = GitRepo.around(cwd, rev)
    commit = repo.commit(rev)
    policy_path = repo_path(policy_in_repo, "--policy")
    files = repo.read(commit, {policy_path: MAX_POLICY_BYTES, TEMPLATES_IN_REPO: MAX_TEMPLATE_BYTES}, label=rev,
                      folders=(TEMPLATES_IN_REPO,))
    if policy_path not in files:
        raise DiffInputError(f"{rev}: no {policy_path} at that revision")
    policy = loads(files[policy_path], source=f"{rev}:{policy_path}")
    prefix = f"{TEMPLATES_IN_REPO}/"
    template_files = {name[len(prefix):]: data for name, data in files.items() if name.startswith(prefix)}
    if template_files:
        templates, where = Templates(f"{rev}:{prefix}", template_files, bounded=True), prefix
    else:  # a repository of policies alone: the installed templates render them
        templates, where = installed_templates(), f"installed templates (no {prefix} at that revision)"
    return _rendered_side(rev, "revision", f"revision {commit[:12]}: {policy_path}, {where}", policy, templates)


def _rendered_side(label: str, kind: str, origin: str, policy: Policy, templates: Templates) -> Side:
    specs = {s.name: s for arch in policy.archs for s in plan(policy, arch)}
    side = Side(label, kind, origin, policy, list(policy.archs), {},
                {r.name: rule_record(r) for r in policy.jit_only_rules()}, templates, specs)
    templates.prepare([*specs.values(), *(s for arch in policy.archs for s in all_kernels(policy, arch))])
    for name, spec in specs.items():
        source, used = templates.render(spec)
        # its parameters as its manifest entry lists them: a loader passes arguments by them
        side.kernels[name] = {**spec.record(), "params": params(spec), "source_sha256": _sha256(source)}
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
    from topkgen.build import shards  # with NVRTC's module: only when a side is a bundle
    from topkgen.manifest import reading as manifests

    try:
        manifest, root = manifests.load_manifest(path, versions=tuple(manifests.SCHEMAS))  # older bundles too
        part = shards.part_of(manifest)
        if part is not None:  # as the loaders refuse it: compared whole, it would lose most of its kernels
            raise DiffInputError(f"{label}: a part of a sharded build ({part}), not a bundle; merge the parts "
                                 f"first: topkgen merge PART... --out DIR")
        if path.is_dir() and manifest["schema_version"] == manifests.SCHEMA_VERSION:
            manifests.read_files(root, manifest)  # a bundle whose files would not load is not "the same"
        policy = manifests.manifest_policy(manifest, label)
    except manifests.ManifestError as err:
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
