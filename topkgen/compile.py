"""CUDA source -> cubin with NVRTC (cuda-python), with ptxas resources and the lowered
symbol, through a content-addressed on-disk cache.

Headers come from the nvidia-cuda-* wheels, never from a system toolkit. The cache key is
the rendered source, the options and the NVRTC version, so an unchanged rebuild compiles
nothing; an entry whose cubin does not match its recorded sha256 is recompiled.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from topkgen.paths import atomic_write, cache_root, cuda_include_dir


class CompileError(RuntimeError):
    """NVRTC rejected a kernel: the message names it and carries NVRTC's log."""


@dataclass(frozen=True)
class Resources:
    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    static_shared_bytes: int
    barriers: int


@dataclass(frozen=True)
class CompiledKernel:
    name: str
    arch: str
    symbol: str
    cubin: bytes
    resources: Resources
    cached: bool


@lru_cache(maxsize=1)
def nvrtc_version() -> str:
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    _check(err, "nvrtcVersion")
    return f"{major}.{minor}"


def options(arch: str) -> list[str]:
    """NVRTC options. No -lineinfo or -G: the cubin must not depend on paths or time."""
    if not re.fullmatch(r"sm_[0-9]{2,3}a?", arch):
        raise CompileError(f"arch: {arch!r} is not an sm_XX architecture")
    return [f"--gpu-architecture={arch}", "-std=c++17", "--ptxas-options=-v", f"-I{cuda_include_dir()}"]


def portable_options(arch: str) -> list[str]:
    """The options without the include path, which is machine-specific: what a manifest
    ships for JIT sources (a loader adds its own -I for the CUDA headers)."""
    return [o for o in options(arch) if not o.startswith("-I")]


def _cache_key(source: str, arch: str, name: str) -> str:
    # The include path is machine-specific; the header contents are pinned by the wheel
    # versions, which the NVRTC version tracks.
    opts = [o for o in options(arch) if not o.startswith("-I")]
    payload = json.dumps({"source": source, "options": opts, "name": name, "nvrtc": nvrtc_version()},
                         sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def compile_kernel(source: str, name: str, arch: str, *, use_cache: bool = True) -> CompiledKernel:
    """Compile one kernel (an extern "C" function called `name`) for `arch`."""
    key = _cache_key(source, arch, name)
    entry = cache_root() / "nvrtc" / key[:2] / key
    if use_cache:
        hit = _read_entry(entry, name, arch)
        if hit is not None:
            return hit
    symbol, cubin, log = _nvrtc(source, name, arch)
    compiled = CompiledKernel(name, arch, symbol, cubin, parse_resources(log, symbol, name), cached=False)
    if use_cache:
        meta = {"name": name, "arch": arch, "symbol": symbol, "sha256": hashlib.sha256(cubin).hexdigest(),
                "resources": asdict(compiled.resources)}
        atomic_write(entry.with_suffix(".cubin"), cubin)
        atomic_write(entry.with_suffix(".json"), json.dumps(meta, sort_keys=True).encode())
    return compiled


def _read_entry(entry: Path, name: str, arch: str) -> CompiledKernel | None:
    try:
        meta = json.loads(entry.with_suffix(".json").read_text())
        cubin = entry.with_suffix(".cubin").read_bytes()
        if meta["name"] != name or meta["arch"] != arch or hashlib.sha256(cubin).hexdigest() != meta["sha256"]:
            return None
        return CompiledKernel(name, arch, meta["symbol"], cubin, Resources(**meta["resources"]), cached=True)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing or corrupt: compile again


def _check(err: object, what: str) -> None:
    from cuda.bindings import nvrtc

    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(f"{what} failed: {err}")


def _nvrtc(source: str, name: str, arch: str) -> tuple[str, bytes, str]:
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        (err,) = nvrtc.nvrtcAddNameExpression(prog, name.encode())
        _check(err, "nvrtcAddNameExpression")
        opts = [o.encode() for o in options(arch)]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        err, size = nvrtc.nvrtcGetProgramLogSize(prog)
        _check(err, "nvrtcGetProgramLogSize")
        buf = b" " * size
        (err,) = nvrtc.nvrtcGetProgramLog(prog, buf)
        log = buf.rstrip(b"\0 ").decode(errors="replace")
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(f"kernel {name} ({arch}) failed to compile:\n{log}")
        err, lowered = nvrtc.nvrtcGetLoweredName(prog, name.encode())
        _check(err, "nvrtcGetLoweredName")
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(err, "nvrtcGetCUBINSize")
        cubin = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        _check(err, "nvrtcGetCUBIN")
        return lowered.decode(), cubin, log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def parse_resources(log: str, symbol: str, name: str) -> Resources:
    """ptxas -v output for one entry function: registers, spills, stack, shared, barriers."""
    start = log.find(f"Compiling entry function '{symbol}'")
    if start < 0:
        raise CompileError(f"kernel {name}: ptxas reported no resources for {symbol}:\n{log}")
    block = log[start:]

    def number(pattern: str) -> int:
        m = re.search(pattern, block)
        return int(m.group(1)) if m else 0

    if not re.search(r"Used (\d+) registers", block):
        raise CompileError(f"kernel {name}: no register count in the ptxas log:\n{log}")
    return Resources(
        registers=number(r"Used (\d+) registers"),
        spill_stores=number(r"(\d+) bytes spill stores"),
        spill_loads=number(r"(\d+) bytes spill loads"),
        stack_bytes=number(r"(\d+) bytes stack frame"),
        static_shared_bytes=number(r"(\d+) bytes smem"),
        barriers=number(r"used (\d+) barriers"),
    )
