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
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from topkgen import __version__
from topkgen.common import errors
from topkgen.build import cache, workers
from topkgen.policy import dispatch_table
from topkgen.manifest import checks as manifest_checks
from topkgen.build.compile import CompiledKernel, compile_kernel, compile_ptx, portable_options, toolchain
from topkgen.common.destinations import check_bundle_destination, locked
from topkgen.common.files import claim, remove_abandoned
from topkgen.policy import SHARED_BYTES_PER_BLOCK, KernelSpec, Policy, in_policy_order, jit_plan, plan, rule_record
from topkgen.build.render import render
from topkgen.manifest.params import params
from topkgen.policy.split import SHARED_BYTES_RULE
from topkgen.common.schema import load_schema, validate
from topkgen.manifest import serving
from topkgen.manifest.reading import MANIFEST, MANIFEST_OPTIONS, SCHEMAS, SCHEMA_VERSION
GRID_RULE = "ceil_div(rows, rows_per_block)"


class BuildError(RuntimeError):
    """A build that must not produce a bundle (compile error, resources over budget)."""


class BundleDiskFull(BuildError, errors.DiskFull):
    """The bundle could not be written for want of room: the environment (exit 2), not a failed build."""


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
    return {**record, "launch": {**record["launch"], "grid": GRID_RULE, "shared_bytes": SHARED_BYTES_RULE},
            "params": params(spec)}


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


def kernel_entry(spec: KernelSpec, compiled: CompiledKernel, source: str, ptx: bytes | None = None) -> dict:
    entry = {**planned_entry(spec, source, compiled.key),
             "symbol": compiled.symbol,
             "sha256": hashlib.sha256(compiled.cubin).hexdigest(),
             "size_bytes": len(compiled.cubin),
             "resources": asdict(compiled.resources)}
    if ptx is not None:  # schema 5: the arch ships PTX (policy ship_ptx)
        entry["ptx"] = {"path": ptx_path(spec), "sha256": hashlib.sha256(ptx).hexdigest(), "size_bytes": len(ptx)}
    return entry


def ptx_path(spec: KernelSpec) -> str:
    return f"{spec.arch}/{spec.name}.ptx"


def jit_entry(spec: KernelSpec, source: str) -> dict:
    """A kernel left to JIT: its rendered source, shipped so that any loader with NVRTC
    compiles exactly what topkgen would."""
    data = source.encode()
    return {**spec_entry(spec),
            "symbol": spec.name,  # extern "C"
            "source": jit_path(spec),
            "sha256": hashlib.sha256(data).hexdigest(),
            "size_bytes": len(data),
            "nvrtc_options": portable_options(spec.nvrtc_target)}


# Told of each kernel as it finishes: the kernel, its compile (or cache hit), seconds taken.
Progress = Callable[[KernelSpec, CompiledKernel, float], None]


def compile_specs(specs: list[KernelSpec], jobs: int = 1, progress: Progress | None = None,
                  source_of: Callable[[KernelSpec], str] = render,
                  verify_percent: float = 0) -> list[tuple[str, CompiledKernel]]:
    """Render and compile kernels in parallel, each compile in a process of its own
    (compile._nvrtc), started from threads that a Ctrl-C does not wait for
    (topkgen.build.workers). `source_of` renders from other templates than the installed ones
    (topkgen diff --build); `verify_percent` as for compile_kernel."""

    def one(spec: KernelSpec) -> tuple[str, CompiledKernel, float]:
        start = time.perf_counter()
        source = source_of(spec)
        compiled = compile_kernel(source, spec.name, spec.nvrtc_target, verify_percent=verify_percent)
        return source, compiled, time.perf_counter() - start

    def finished(spec: KernelSpec, result: tuple[str, CompiledKernel, float]) -> None:
        if progress:
            progress(spec, result[1], result[2])

    return [(source, compiled) for source, compiled, _ in workers.run_all(one, specs, jobs, finished)]


@dataclass(frozen=True)
class BuildResult:
    manifest: dict
    cache: cache.Stats  # local hits, remote hits, compiled, remote traffic
    provenance: tuple[dict, ...] = ()  # where each kernel came from (build --provenance)


def provenance_entry(compiled: CompiledKernel) -> dict:
    """One kernel's line of `build --provenance`: its key and cubin, and where it came from."""
    return {"name": compiled.name, "arch": compiled.arch, "key": compiled.key,
            "cubin_sha256": hashlib.sha256(compiled.cubin).hexdigest(), "origin": compiled.outcome.origin,
            "verified_by_recompiling": compiled.outcome.verified}


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
        "options": MANIFEST_OPTIONS,
        "split_rules": serving.split_rules(policy, archs),
        "load_order": serving.load_order(policy, archs, kernels),
    }
    if shard is not None:
        manifest["shard"] = shard
    validate(manifest, load_schema(SCHEMAS[SCHEMA_VERSION]))
    manifest_checks.check_manifest(manifest)
    return manifest, {jit_path(s): src.encode() for s, src in zip(jit_specs, jit_sources)}


def build(policy: Policy, archs: list[str], out: Path, *, jobs: int = 1, allow_over_budget: bool = False,
          force: bool = False, progress: Progress | None = None,
          warn: Callable[[str], None] | None = None, shard: tuple[int, int] | None = None,
          verify_percent: float = 0) -> BuildResult:
    """Compile every planned kernel (or shard `(index, count)`'s share of them) and write the
    bundle to `out`, atomically. `out` is checked first (destinations.DestinationError) and
    again under the lock before the swap; `force` lets the build replace a directory that is
    not a bundle; never the policy's own file (nor anything holding it)."""
    from topkgen.build import shards

    inputs = (Path(policy.path),) if Path(policy.path).is_file() else ()
    check_bundle_destination(out, force=force, inputs=inputs)
    cache.remote_store()  # a TOPKGEN_CACHE_URL that cannot be opened fails before any compile
    cache.cache_trust.pins()  # so does a TOPKGEN_CACHE_PINS that names no file of pins
    archs = in_policy_order(policy, archs)
    specs = [spec for arch in archs for spec in plan(policy, arch)]
    shard_record = None
    if shard is not None:
        shard_record = shards.shard_record(specs, archs, *shard)
        specs = shards.share(specs, *shard)
    sources, compiled = zip(*compile_specs(specs, jobs, progress, verify_percent=verify_percent)) if specs else ((), ())
    ptx_specs = [s for s in specs if s.ship_ptx]
    ptx = dict(zip((s.name for s in ptx_specs), workers.run_all(lambda s: compile_ptx(render(s), s.name, s.arch),
                                                                ptx_specs, jobs)))
    problems = [p for p in (over_budget(s, c) for s, c in zip(specs, compiled)) if p]
    if problems and not allow_over_budget:
        raise BuildError("\n".join(problems))
    for problem in problems:
        if warn:
            warn(problem)
    manifest, jit_files = manifest_document(policy, policy_record(policy), archs,
                                            [kernel_entry(s, c, src, ptx.get(s.name))
                                             for s, c, src in zip(specs, compiled, sources)],
                                            toolchain(), shard_record)
    files = {cubin_path(s): c.cubin for s, c in zip(specs, compiled)} | {ptx_path(s): ptx[s.name] for s in ptx_specs}
    write_bundle(out, manifest, files | jit_files, force=force, inputs=inputs)
    return BuildResult(manifest, cache.Stats.of(c.outcome for c in compiled), tuple(map(provenance_entry, compiled)))


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
        lie = cache.resources_lie(entry.record, files[entry.path]) if entry.aot else None
        if lie is not None:  # a part of a merge, or a cache record, that lies about its cubin
            raise BuildError(f"not writing {out}: {entry.field} ({entry.record['name']}): {lie}")
    with locked(out):
        check_bundle_destination(out, force=force, inputs=inputs)  # another process may have written there meanwhile
        try:
            _write_atomically(out, manifest, files)
        except OSError as err:
            where = f" ({err.filename})" if err.filename else ""
            message = f"cannot write the bundle {out}: {err.strerror}{where}"
            raise (BundleDiskFull if err.errno in errors.DISK_FULL else BuildError)(message) from None


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
