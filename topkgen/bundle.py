"""Bundles: build (render + NVRTC), write atomically, and read back and verify manifests.

A bundle is DIR/<arch>/<kernel>.cubin plus DIR/manifest.json, described by
schemas/manifest.schema.json so that any loader can use it without topkgen. Builds go to a
temporary directory beside DIR and are swapped into place, under a lock, so a failed or
killed build never leaves a half-written bundle.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import shutil
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

from topkgen import __version__
from topkgen.compile import CompiledKernel, compile_kernel, nvrtc_version
from topkgen.policy import SHARED_BYTES_PER_BLOCK, KernelSpec, Policy, plan, rule_record
from topkgen.render import params, render
from topkgen.schema import SchemaViolation, format_path, load_schema, validate

MANIFEST = "manifest.json"
SCHEMA_VERSION = 1
GRID_RULE = "ceil_div(rows, rows_per_block)"


class BuildError(RuntimeError):
    """A build that must not produce a bundle (compile error, resources over budget)."""


class ManifestError(ValueError):
    """A manifest or bundle that cannot be used; the message names the file and the key."""


def elf_sm(cubin: bytes) -> int:
    """The SM version a cubin's ELF header names (e_flags; its layout depends on the ABI)."""
    if cubin[:4] != b"\x7fELF" or struct.unpack_from("<H", cubin, 18)[0] != 190:
        raise ManifestError("not a CUDA ELF (EM_CUDA) file")
    flags = struct.unpack_from("<I", cubin, 48)[0]
    return (flags >> 8) & 0xFF if cubin[8] >= 8 else flags & 0xFF


def over_budget(spec: KernelSpec, compiled: CompiledKernel) -> str | None:
    r = compiled.resources
    problems = []
    if r.registers > spec.max_registers:
        problems.append(f"{r.registers} registers > budget {spec.max_registers}")
    if not spec.spills_allowed and (r.spill_stores or r.spill_loads):
        problems.append(f"spills {r.spill_stores} bytes stored / {r.spill_loads} loaded, budget allows none")
    shared = r.static_shared_bytes + spec.dynamic_shared_bytes
    if shared > SHARED_BYTES_PER_BLOCK.get(spec.arch, shared):
        problems.append(f"{r.static_shared_bytes} bytes of static and {spec.dynamic_shared_bytes} of dynamic shared "
                        f"memory exceed {spec.arch}'s {SHARED_BYTES_PER_BLOCK[spec.arch]} per block")
    return f"kernel {spec.name} is over its resource budget: {'; '.join(problems)}" if problems else None


def kernel_entry(spec: KernelSpec, compiled: CompiledKernel, source: str) -> dict:
    entry = spec.record()
    entry["launch"] = {**entry["launch"], "grid": GRID_RULE}
    entry.update({
        "symbol": compiled.symbol,
        "cubin": f"{spec.arch}/{spec.name}.cubin",
        "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
        "sha256": hashlib.sha256(compiled.cubin).hexdigest(),
        "size_bytes": len(compiled.cubin),
        "resources": asdict(compiled.resources),
        "budget": {"max_registers": spec.max_registers, "spills_allowed": spec.spills_allowed},
        "params": params(spec),
    })
    return entry


def compile_specs(specs: list[KernelSpec], jobs: int = 1,
                  progress: Callable[[KernelSpec], None] | None = None) -> list[tuple[str, CompiledKernel]]:
    """Render and compile kernels in parallel (NVRTC runs without the GIL)."""

    def one(spec: KernelSpec) -> tuple[str, CompiledKernel]:
        source = render(spec)
        compiled = compile_kernel(source, spec.name, spec.arch)
        if progress:
            progress(spec)
        return source, compiled

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, specs))


@dataclass(frozen=True)
class BuildResult:
    manifest: dict
    compiled: int     # kernels NVRTC compiled in this build
    from_cache: int   # kernels taken from the compile cache


def build(policy: Policy, archs: list[str], out: Path, *, jobs: int = 1, allow_over_budget: bool = False,
          progress: Callable[[KernelSpec], None] | None = None,
          warn: Callable[[str], None] | None = None) -> BuildResult:
    """Compile every planned kernel and write the bundle to `out`, atomically."""
    specs = [spec for arch in archs for spec in plan(policy, arch)]
    sources, compiled = zip(*compile_specs(specs, jobs, progress)) if specs else ((), ())
    problems = [p for p in (over_budget(s, c) for s, c in zip(specs, compiled)) if p]
    if problems and not allow_over_budget:
        raise BuildError("\n".join(problems))
    for problem in problems:
        if warn:
            warn(problem)
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "generator": {"name": "topkgen", "version": __version__},
        "nvrtc_version": nvrtc_version(),
        "policy": {"path": policy.display_path, "name": policy.name, "sha256": policy.sha256, "text": policy.text},
        "archs": archs,
        "kernels": [kernel_entry(s, c, src) for s, c, src in zip(specs, compiled, sources)],
        "jit_only": [rule_record(r) for r in policy.jit_only_rules(archs)],
    }
    validate(manifest, load_schema("manifest.schema.json"))
    with _locked(out):
        _write_atomically(out, manifest, {f"{s.arch}/{s.name}.cubin": c.cubin for s, c in zip(specs, compiled)})
    cached = sum(1 for c in compiled if c.cached)
    return BuildResult(manifest, len(compiled) - cached, cached)


def manifest_bytes(manifest: dict) -> bytes:
    return (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()


@contextlib.contextmanager
def _locked(out: Path) -> Iterator[None]:
    """Serialise builds into one directory (the lock file sits beside it)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    lock = out.parent / f".{out.name}.lock"
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write_atomically(out: Path, manifest: dict, files: dict[str, bytes]) -> None:
    staging = out.parent / f".{out.name}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
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

def load_manifest(path: str | Path) -> tuple[dict, Path]:
    """Read and validate a manifest (a file or a bundle directory); returns it and the
    bundle root that its cubin paths are relative to."""
    path = Path(path)
    file = path / MANIFEST if path.is_dir() else path
    try:
        doc = json.loads(file.read_text())
    except OSError as err:
        raise ManifestError(f"{file}: cannot read manifest: {err.strerror}") from None
    except ValueError as err:
        raise ManifestError(f"{file}: not valid JSON: {err}") from None
    if isinstance(doc, dict) and doc.get("schema_version") != SCHEMA_VERSION:
        raise ManifestError(f"{file}: schema_version: {doc.get('schema_version')!r} is not supported "
                            f"(this topkgen reads version {SCHEMA_VERSION})")
    try:
        validate(doc, load_schema("manifest.schema.json"))
    except SchemaViolation as err:
        raise ManifestError(f"{file}: {format_path(err.path)}: {err.message}") from None
    return doc, file.parent


def manifest_policy(manifest: dict, label: str) -> Policy:
    """The policy a bundle was built from, loaded by the same code as any policy file."""
    from topkgen.policy import PolicyError, loads

    text = manifest["policy"]["text"]
    if hashlib.sha256(text.encode()).hexdigest() != manifest["policy"]["sha256"]:
        raise ManifestError(f"{label}: policy.text does not match policy.sha256")
    try:
        return loads(text, source=f"{label}:policy")
    except PolicyError as err:
        raise ManifestError(str(err)) from None


def read_cubin(root: Path, entry: dict) -> bytes:
    """A kernel's cubin, after checking that its path stays inside the bundle and that its
    sha256 matches the manifest."""
    base = root.resolve()
    path = (base / entry["cubin"]).resolve()
    if base not in path.parents:
        raise ManifestError(f"kernel {entry['name']}: cubin path {entry['cubin']!r} leaves the bundle directory")
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ManifestError(f"kernel {entry['name']}: cannot read {entry['cubin']}: {err.strerror}") from None
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise ManifestError(f"kernel {entry['name']}: {entry['cubin']} does not match its sha256 in the manifest")
    return data

