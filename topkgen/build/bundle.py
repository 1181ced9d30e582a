"""Bundles: build (render + NVRTC), write atomically, and read back and verify manifests.

A bundle is DIR/<arch>/<kernel>.cubin, DIR/jit/<arch>/<kernel>.cu (the kernels dispatch
leaves to JIT) and DIR/manifest.json, described by schemas/manifest.schema.json so that any
loader can use it without topkgen: its dispatch table is `select`'s answers as data.
Builds go to a temporary directory beside DIR and are swapped into place, under a lock, so
a failed or killed build never leaves a half-written bundle (and the next build of DIR
removes the staging directory a SIGKILL left beside it). The destination is checked
before anything is compiled (topkgen.common.destinations): a directory of the user's is never
replaced unasked.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import shutil
import stat
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable

from topkgen import __version__
from topkgen.build import cache, workers
from topkgen.policy import dispatch_table
from topkgen.manifest import checks as manifest_checks
from topkgen.common import reader
from topkgen.build.compile import CompiledKernel, compile_kernel, portable_options, toolchain
from topkgen.common.destinations import check_bundle_destination, locked
from topkgen.common.errors import InputError
from topkgen.common.files import claim, file_kind, read_to_limit, remove_abandoned
from topkgen.policy import SHARED_BYTES_PER_BLOCK, KernelSpec, Policy, in_policy_order, jit_plan, plan, rule_record
from topkgen.build.render import params, render
from topkgen.common.schema import SchemaViolation, format_path, load_schema, validate

MANIFEST = "manifest.json"
SCHEMA_VERSION = 3
SCHEMAS = {1: "manifest-1.schema.json", 2: "manifest-2.schema.json", 3: "manifest.schema.json"}
MAX_MANIFEST_BYTES = 64 << 20
MAX_FILE_BYTES = 64 << 20  # a cubin or a JIT source
GRID_RULE = "ceil_div(rows, rows_per_block)"


class BuildError(RuntimeError):
    """A build that must not produce a bundle (compile error, resources over budget)."""


class ManifestError(InputError, ValueError):
    """A manifest or bundle that cannot be used; the message names the file and the key."""


def budget_problems(resources: dict, budget: dict) -> list[str]:
    """How a kernel's ptxas resources break its family's budget (as a manifest records both)."""
    problems = []
    if resources["registers"] > budget["max_registers"]:
        problems.append(f"{resources['registers']} registers > budget {budget['max_registers']}")
    if not budget["spills_allowed"] and (resources["spill_stores"] or resources["spill_loads"]):
        problems.append(f"spills {resources['spill_stores']} bytes stored / {resources['spill_loads']} loaded, "
                        f"budget allows none")
    return problems


def over_budget(spec: KernelSpec, compiled: CompiledKernel) -> str | None:
    problems = budget_problems(asdict(compiled.resources),
                               {"max_registers": spec.max_registers, "spills_allowed": spec.spills_allowed})
    r = compiled.resources
    shared = r.static_shared_bytes + spec.dynamic_shared_bytes
    if shared > SHARED_BYTES_PER_BLOCK.get(spec.arch, shared):
        problems.append(f"{r.static_shared_bytes} bytes of static and {spec.dynamic_shared_bytes} of dynamic shared "
                        f"memory exceed {spec.arch}'s {SHARED_BYTES_PER_BLOCK[spec.arch]} per block")
    return f"kernel {spec.name} is over its resource budget: {'; '.join(problems)}" if problems else None


def spec_entry(spec: KernelSpec) -> dict:
    """What every manifest entry says of its kernel, AOT or JIT: the plan's record, how to
    launch it (schema: $defs/launch) and its parameters. The runtime serves an arch that a
    bundle lacks from these alone."""
    record = spec.record()
    return {**record, "launch": {**record["launch"], "grid": GRID_RULE}, "params": params(spec)}


def cubin_path(spec: KernelSpec) -> str:
    return f"{spec.arch}/{spec.name}.cubin"


def jit_path(spec: KernelSpec) -> str:
    return f"jit/{spec.arch}/{spec.name}.cu"


def planned_entry(spec: KernelSpec, source: str, cache_key: str) -> dict:
    """The part of a kernel's manifest entry that follows from the plan and the rendered
    source alone (a merge checks shards against it)."""
    return {**spec_entry(spec),
            "cubin": cubin_path(spec),
            "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
            "cache_key": cache_key,
            "budget": {"max_registers": spec.max_registers, "spills_allowed": spec.spills_allowed}}


def kernel_entry(spec: KernelSpec, compiled: CompiledKernel, source: str) -> dict:
    return {**planned_entry(spec, source, compiled.key),
            "symbol": compiled.symbol,
            "sha256": hashlib.sha256(compiled.cubin).hexdigest(),
            "size_bytes": len(compiled.cubin),
            "resources": asdict(compiled.resources)}


def jit_entry(spec: KernelSpec, source: str) -> dict:
    """A kernel left to JIT: its rendered source, shipped so that any loader with NVRTC
    compiles exactly what topkgen would."""
    data = source.encode()
    return {**spec_entry(spec),
            "symbol": spec.name,  # extern "C"
            "source": jit_path(spec),
            "sha256": hashlib.sha256(data).hexdigest(),
            "size_bytes": len(data),
            "nvrtc_options": portable_options(spec.arch)}


# Told of each kernel as it finishes: the kernel, its compile (or cache hit), seconds taken.
Progress = Callable[[KernelSpec, CompiledKernel, float], None]


def compile_specs(specs: list[KernelSpec], jobs: int = 1, progress: Progress | None = None,
                  source_of: Callable[[KernelSpec], str] = render) -> list[tuple[str, CompiledKernel]]:
    """Render and compile kernels in parallel (NVRTC runs without the GIL), in threads that
    a Ctrl-C does not wait for (topkgen.build.workers). `source_of` renders from other templates
    than the installed ones (topkgen diff --build)."""

    def one(spec: KernelSpec) -> tuple[str, CompiledKernel, float]:
        start = time.perf_counter()
        source = source_of(spec)
        return source, compile_kernel(source, spec.name, spec.arch), time.perf_counter() - start

    def finished(spec: KernelSpec, result: tuple[str, CompiledKernel, float]) -> None:
        if progress:
            progress(spec, result[1], result[2])

    return [(source, compiled) for source, compiled, _ in workers.run_all(one, specs, jobs, finished)]


@dataclass(frozen=True)
class BuildResult:
    manifest: dict
    cache: cache.Stats  # local hits, remote hits, compiled, remote traffic


def policy_record(policy: Policy) -> dict:
    return {**policy.reference(), "text": policy.text}


def manifest_document(policy: Policy, policy_rec: dict, archs: list[str], kernels: list[dict],
                      toolchain_record: dict, shard: dict | None = None) -> tuple[dict, dict[str, bytes]]:
    """The manifest and the JIT sources it ships, for a build and for a merge of shards (so
    that a merge is byte-identical to a full build). `policy_rec` is the policy as the
    manifest records it (a merge passes the parts' record unchanged)."""
    jit_specs = [spec for arch in archs for spec in jit_plan(policy, arch)]
    jit_sources = [render(spec) for spec in jit_specs]
    dispatch = dispatch_table.build(policy, archs)
    dispatch_table.check_against_select(policy, dispatch)  # never write a table that disagrees
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "generator": {"name": "topkgen", "version": __version__},
        "nvrtc_version": toolchain_record["nvrtc"],
        "toolchain": toolchain_record,
        "policy": policy_rec,
        "archs": archs,
        "kernels": kernels,
        "jit_kernels": [jit_entry(s, src) for s, src in zip(jit_specs, jit_sources)],
        "jit_only": [rule_record(r) for r in policy.jit_only_rules(archs)],
        "dispatch": dispatch,
    }
    if shard is not None:
        manifest["shard"] = shard
    validate(manifest, load_schema(SCHEMAS[SCHEMA_VERSION]))
    manifest_checks.check_manifest(manifest)
    return manifest, {jit_path(s): src.encode() for s, src in zip(jit_specs, jit_sources)}


def build(policy: Policy, archs: list[str], out: Path, *, jobs: int = 1, allow_over_budget: bool = False,
          force: bool = False, progress: Progress | None = None,
          warn: Callable[[str], None] | None = None, shard: tuple[int, int] | None = None) -> BuildResult:
    """Compile every planned kernel (or shard `(index, count)`'s share of them) and write the
    bundle to `out`, atomically. `out` is checked first (destinations.DestinationError) and
    again under the lock before the swap; `force` lets the build replace a directory that is
    not a bundle; never the policy's own file (nor anything holding it)."""
    from topkgen.build import shards

    inputs = (Path(policy.path),) if Path(policy.path).is_file() else ()
    check_bundle_destination(out, force=force, inputs=inputs)
    cache.remote_store()  # a TOPKGEN_CACHE_URL that cannot be opened fails before any compile
    archs = in_policy_order(policy, archs)
    specs = [spec for arch in archs for spec in plan(policy, arch)]
    shard_record = None
    if shard is not None:
        shard_record = shards.shard_record(specs, archs, *shard)
        specs = shards.share(specs, *shard)
    sources, compiled = zip(*compile_specs(specs, jobs, progress)) if specs else ((), ())
    problems = [p for p in (over_budget(s, c) for s, c in zip(specs, compiled)) if p]
    if problems and not allow_over_budget:
        raise BuildError("\n".join(problems))
    for problem in problems:
        if warn:
            warn(problem)
    manifest, jit_files = manifest_document(policy, policy_record(policy), archs,
                                            [kernel_entry(s, c, src) for s, c, src in zip(specs, compiled, sources)],
                                            toolchain(), shard_record)
    write_bundle(out, manifest, {cubin_path(s): c.cubin for s, c in zip(specs, compiled)} | jit_files,
                 force=force, inputs=inputs)
    return BuildResult(manifest, cache.Stats.of(c.outcome for c in compiled))


def write_bundle(out: Path, manifest: dict, files: dict[str, bytes], *, force: bool = False,
                 inputs: tuple[Path, ...] = ()) -> None:
    """Swap a complete bundle into `out` under the destination's lock; `inputs` as for
    destinations.check_bundle_destination. Each kernel's file is first checked as every
    loader checks it (manifest_checks.check_file), so no source of cubins (a cache, a part
    of a merge) can make a bundle the loaders refuse: the build fails instead."""
    for entry in manifest_checks.entries(manifest):
        try:
            manifest_checks.check_file(entry, files[entry.path])
        except dispatch_table.FieldError as err:
            raise BuildError(f"not writing {out}: it would hold what a loader refuses: {err}") from None
    with locked(out):
        check_bundle_destination(out, force=force, inputs=inputs)  # another process may have written there meanwhile
        try:
            _write_atomically(out, manifest, files)
        except OSError as err:
            where = f" ({err.filename})" if err.filename else ""
            raise BuildError(f"cannot write the bundle {out}: {err.strerror}{where}") from None


def manifest_bytes(manifest: dict) -> bytes:
    return (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()


def _write_atomically(out: Path, manifest: dict, files: dict[str, bytes]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    # the staging directories that builds of `out` killed mid-write left (a live writer's, one
    # in another pid namespace whose pid means nothing here, is never touched)
    remove_abandoned(out.parent, re.escape(f".{out.name}{_STAGING_INFIX}") + r"([0-9]+)-[0-9a-f]{8}")
    staging = out.parent / f".{out.name}{_STAGING_INFIX}{os.getpid()}-{os.urandom(4).hex()}"
    staging.mkdir()
    held = claim(staging)
    try:
        for rel, data in files.items():
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        (staging / MANIFEST).write_bytes(manifest_bytes(manifest))
        _fsync_tree(staging)
        if out.exists():
            _exchange(staging, out)  # staging now holds the previous bundle
        else:
            os.rename(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if held is not None:
            os.close(held)


_STAGING_INFIX = ".tmp-"  # a bundle is staged in .<out>.tmp-<pid>-<8 hex digits> beside <out>


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*"), reverse=True):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _exchange(a: Path, b: Path) -> None:
    """Swap two directories in one step (Linux renameat2 RENAME_EXCHANGE)."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    at_fdcwd, rename_exchange = -100, 2
    if renameat2 is not None and renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return
    # No atomic exchange here: move the old bundle aside, then the new one in.
    aside = b.parent / f".{b.name}.old-{os.getpid()}"
    os.rename(b, aside)
    os.rename(a, b)
    os.rename(aside, a)


# ----------------------------------------------------------------------------- reading

def load_manifest(path: str | Path, *, versions: Iterable[int] = (SCHEMA_VERSION,)) -> tuple[dict, Path]:
    """Read a manifest (a file or a bundle directory), validate it against its schema and,
    for the current schema, make every load check but the files'. Returns it and the bundle
    root that its paths are relative to. Only `diff` asks for older versions too."""
    path = Path(path)
    try:
        is_dir = path.is_dir()
    except OSError:  # a name too long to look up, say: then it names no directory (loaders/cpp reads it so)
        is_dir = False
    file = path / MANIFEST if is_dir else path
    try:
        raw = read_bundle_file(file.parent, file.name, MAX_MANIFEST_BYTES)
    except OSError as err:
        raise ManifestError(f"{file}: cannot read manifest: {err.strerror}") from None
    except ValueError as err:  # a NUL byte in the path
        raise ManifestError(f"{reader.printable(str(file))}: cannot read manifest: {err}") from None
    try:
        doc = reader.parse_json(reader.decode(raw, str(file)), str(file))
    except reader.ReadError as err:
        raise ManifestError(str(err)) from None
    version = doc.get("schema_version") if isinstance(doc, dict) else None
    if type(version) is not int or version not in versions:  # neither 3.0 nor true is 3 (or 1)
        raise ManifestError(f"{file}: {version_problem(version)}")
    try:
        validate(doc, load_schema(SCHEMAS[version]))
    except SchemaViolation as err:
        raise ManifestError(f"{file}: {format_path(err.path)}: {err.message}") from None
    if version == SCHEMA_VERSION:
        try:
            manifest_checks.check_manifest(doc)
        except dispatch_table.FieldError as err:
            raise ManifestError(f"{file}: {err}") from None
    else:  # an older schema (diff reads it): names are identities, a second entry would be silently lost
        for key, ident in (("kernels", "name"), ("jit_only", "rule")):
            seen: set[str] = set()
            for i, entry in enumerate(doc[key]):
                value = json.dumps(entry[ident], sort_keys=True)
                if value in seen:
                    raise ManifestError(f"{file}: {key}[{i}]: duplicate {ident} {value}")
                seen.add(value)
    return doc, file.parent


def version_problem(version: object) -> str:
    """Why a manifest's schema_version cannot be served (the C++ loader says the same)."""
    if type(version) is int and version == 1:
        return "schema_version: 1 has no dispatch table; rebuild the bundle (topkgen build)"
    if type(version) is int and version == 2:
        return "schema_version: 2 has no batch size in its dispatch table; rebuild the bundle (topkgen build)"
    return f"schema_version: {json.dumps(version)} is not supported (this topkgen reads version {SCHEMA_VERSION})"


def read_files(root: Path, manifest: dict, archs: Iterable[str] | None = None) -> dict[str, bytes]:
    """The files (cubins, JIT sources) of the kernels of `archs` (all when None) by kernel
    name, each checked as every loader checks it at load: sha256, and a cubin's ELF machine,
    SM and symbol. Paths were checked by load_manifest, and read_bundle_file follows no link:
    nothing read is outside the bundle."""
    label = root / MANIFEST
    wanted = None if archs is None else set(archs)
    files: dict[str, bytes] = {}
    for entry in manifest_checks.entries(manifest):
        if wanted is not None and entry.record["arch"] not in wanted:
            continue
        key = "cubin" if entry.aot else "source"
        try:
            data = read_bundle_file(root, entry.path, MAX_FILE_BYTES)
        except OSError as err:
            raise ManifestError(f"{label}: {entry.field}.{key}: cannot read {entry.path}: {err.strerror}") from None
        try:
            manifest_checks.check_file(entry, data)
        except dispatch_table.FieldError as err:
            raise ManifestError(f"{label}: {err}") from None
        files[entry.record["name"]] = data
    return files


def read_bundle_file(root: Path, rel: str, limit: int) -> bytes:
    """The bytes of the regular file `rel` ("sm_90/x.cubin") under the directory `root`
    (which may be reached through a link), reached through directories only and read no
    further than `limit` bytes. A bundle holds no symbolic links (one could lead out of it),
    FIFOs (which block), devices or sockets: any of them on the way is refused with an
    OSError whose strerror says what it is, as is a larger file (loaders/cpp says the same)."""
    parts = rel.split("/")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, name in enumerate(parts):
            last = i == len(parts) - 1
            what = "it" if last else "/".join(parts[:i + 1])
            mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
            if stat.S_ISLNK(mode):
                raise _refusal(f"{what} is a symbolic link; a bundle holds none")
            if not (stat.S_ISREG(mode) if last else stat.S_ISDIR(mode)):
                raise _refusal(f"{what} is {file_kind(mode)}, not {'a regular file' if last else 'a directory'}")
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | (0 if last else os.O_DIRECTORY)
            fd, parent = os.open(name, flags, dir_fd=fd), fd
            os.close(parent)
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # replaced since the lstat
            raise _refusal(f"it is {file_kind(mode)}, not a regular file")
        data = read_to_limit(fd, limit)
        if data is None:
            raise _refusal(f"it is larger than {limit} bytes")
        return data
    finally:
        os.close(fd)


def _refusal(reason: str) -> OSError:
    err = OSError(reason)
    err.strerror = reason
    return err


def manifest_policy(manifest: dict, label: str) -> Policy:
    """The policy a bundle was built from, loaded by the same code as any policy file."""
    from topkgen.policy import PolicyError, loads

    raw = manifest["policy"]["text"].encode("utf-8", "surrogatepass")  # the reader refused lone surrogates
    if hashlib.sha256(raw).hexdigest() != manifest["policy"]["sha256"]:
        raise ManifestError(f"{label}: policy.text does not match policy.sha256")
    try:
        return loads(raw, source=f"{label}:policy")
    except PolicyError as err:
        raise ManifestError(str(err)) from None
