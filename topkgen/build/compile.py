"""CUDA source -> cubin with NVRTC (cuda-python), with ptxas resources and the lowered
symbol, through the compile cache (topkgen.build.cache: local, then a shared remote). Each
compile runs in a fresh process (nvrtc_child): there NVRTC gave one cubin for one source in
every compile counted, where a process that had compiled before did not (_nvrtc).

Headers come from the nvidia-cuda-* wheels, never from a system toolkit. The cache key is
the rendered source, the options without include paths, the name, the arch and the exact
toolchain (topkgen.build.toolchain), so an unchanged rebuild compiles nothing and a machine with
other headers or another NVRTC never receives this machine's cubins.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from topkgen.build import cache, cache_trust, toolchain as tc, workers
from topkgen.common.paths import cuda_include_dir


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
    key: str                # the cache key (the manifest records it)
    outcome: cache.Outcome  # local hit, remote hit or compiled, and the remote traffic


@lru_cache(maxsize=1)
def nvrtc_version() -> str:
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    _check(err, "nvrtcVersion")
    return f"{major}.{minor}"


def _loaded_nvrtc() -> Path:
    """The libnvrtc this process compiles with (cuda.bindings loads it through pathfinder)."""
    nvrtc_version()  # loads it
    from cuda.pathfinder import load_nvidia_dynamic_lib

    path = load_nvidia_dynamic_lib("nvrtc").abs_path
    if path:
        return Path(path)
    with open("/proc/self/maps") as maps:  # loaded by other means: ask the kernel
        for line in maps:
            name = line.rsplit(" ", 1)[-1].strip()
            if "/libnvrtc.so" in name or "/libnvrtc.alt.so" in name:
                return Path(name)
    raise CompileError("cannot tell which libnvrtc this process loaded")


@lru_cache(maxsize=1)
def toolchain() -> dict[str, Any]:
    """The exact toolchain record (manifest and cache entries carry it)."""
    return tc.identify(nvrtc_version(), _loaded_nvrtc(), cuda_include_dir())


def portable_options(arch: str) -> list[str]:
    """NVRTC's options without the include path, which is machine-specific: what a cache
    key covers and a manifest ships for JIT sources (a loader adds its own -I for the CUDA
    headers). No -lineinfo or -G: the cubin must not depend on paths or time."""
    if not re.fullmatch(r"sm_[0-9]{2,3}a?", arch):
        raise CompileError(f"arch: {arch!r} is not an sm_XX architecture")
    return [f"--gpu-architecture={arch}", "-std=c++17", "--ptxas-options=-v"]


def options(arch: str) -> list[str]:
    """The options NVRTC gets: the portable ones and this machine's include path."""
    return [*portable_options(arch), f"-I{cuda_include_dir()}"]


def cache_key(source: str, name: str, arch: str, toolchain_record: dict[str, Any] | None = None) -> str:
    """The key of one compile with this machine's toolchain, or with `toolchain_record` (the
    one a bundle was built with). The include path is left out: the headers' contents are in
    the toolchain record, so installs at different paths share keys."""
    return cache.action_key(source=source, name=name, arch=arch, options=portable_options(arch),
                            toolchain_digest=tc.digest(toolchain_record or toolchain()))


def compile_kernel(source: str, name: str, arch: str, *, use_cache: bool = True,
                   verify_percent: float = 0) -> CompiledKernel:
    """Compile one kernel (an extern "C" function called `name`) for `arch`. `verify_percent`:
    recompile a cache hit when cache_trust chooses its key, and refuse it if the cubins differ."""
    key = cache_key(source, name, arch)
    miss = cache.Outcome("compiled")
    if use_cache:
        found = cache.lookup(key, source, name, arch)
        if isinstance(found, cache.Hit):
            hit = _from_record(found.record, found.cubin, found.outcome)
            if hit is not None and verify_percent and cache_trust.chosen_for_verification(key, verify_percent):
                hit = _verified(hit, source)
            if hit is not None:
                return hit
        else:
            miss = found
    symbol, cubin, log = _nvrtc(source, name, arch)
    resources = parse_resources(log, symbol, name)
    outcome = miss
    if use_cache:
        fields = {"name": name, "arch": arch, "symbol": symbol, "resources": asdict(resources), "toolchain": toolchain()}
        outcome = cache.store(key, fields, cubin, source, miss)
    return CompiledKernel(name, arch, symbol, cubin, resources, key, outcome)


def _verified(hit: CompiledKernel, source: str) -> CompiledKernel:
    """The hit, once a fresh compile of its source gave the very same cubin; CachePoisoned if not."""
    _, cubin, _ = _nvrtc(source, hit.name, hit.arch)
    if cubin != hit.cubin:
        store = cache.local_store() if hit.outcome.origin == "local" else cache.remote_store()
        label = store.label if store is not None else hit.outcome.origin
        raise cache.CachePoisoned(
            f"{label}/{cache.ac_path(hit.key)}: kernel {hit.name} ({hit.arch}): its cubin (sha256 "
            f"{cache.sha256(hit.cubin)[:16]}...) differs from a fresh compile ({cache.sha256(cubin)[:16]}...): other "
            f"code under this key; no bundle written: delete the entry, and run `topkgen cache verify` on that store")
    return replace(hit, outcome=replace(hit.outcome, verified=True))


def _from_record(record: dict[str, Any], cubin: bytes, outcome: cache.Outcome) -> CompiledKernel | None:
    """A cache hit as a compile (cache.lookup verified it is this kernel's, for its arch)."""
    try:
        return CompiledKernel(record["name"], record["arch"], record["symbol"], cubin, Resources(**record["resources"]),
                              record["key"], outcome)
    except TypeError:
        return None  # a record with other resource fields: compile again


def compile_ptx(source: str, name: str, arch: str) -> bytes:
    """The PTX of one kernel for `arch`'s virtual architecture (sm_90: compute_90), which the
    driver compiles for any GPU of that capability or later (policy ship_ptx). Not cached:
    NVRTC's front end alone, and deterministic."""
    from cuda.bindings import nvrtc

    if not re.fullmatch(r"sm_[0-9]{2,3}", arch):
        raise CompileError(f"arch: {arch!r} is not an sm_XX architecture")
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture=compute_{arch[3:]}".encode(), b"-std=c++17", f"-I{cuda_include_dir()}".encode()]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(f"kernel {name} (compute_{arch[3:]}) failed to compile to PTX")
        err, size = nvrtc.nvrtcGetPTXSize(prog)
        _check(err, "nvrtcGetPTXSize")
        ptx = b" " * size
        (err,) = nvrtc.nvrtcGetPTX(prog, ptx)
        _check(err, "nvrtcGetPTX")
        return ptx.rstrip(b"\0")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
        workers.python_handles_signals_again()


def _check(err: object, what: str) -> None:
    from cuda.bindings import nvrtc

    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(f"{what} failed: {err}")


def _nvrtc(source: str, name: str, arch: str) -> tuple[str, bytes, str]:
    """NVRTC's symbol, cubin and log for one kernel, compiled in a fresh process (nvrtc_child).
    In a process that had compiled before, NVRTC 13.0's ptxas now and then placed another
    convergence barrier and wrote another cubin for the same source (main's
    topk_radix_dyn_k256_fast_f32_sm_90: 1 of 40 compiles in one process, 0 of 40 each in a
    fresh one; benchmarks/nvrtc_history.py), so what a build's worker had compiled before
    decided a cubin's bytes. A process costs about 0.2 s a kernel against NVRTC's 3 s."""
    request = json.dumps({"source": source, "name": name, "options": options(arch)}).encode()
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("nvrtc_child.py"))], input=request,
                          capture_output=True, check=False)
    try:
        reply = json.loads(proc.stdout)
    except ValueError:
        reply = None
    if proc.returncode != 0 or not isinstance(reply, dict):
        said = proc.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise CompileError(f"kernel {name} ({arch}): the NVRTC process ended with status {proc.returncode}"
                           + (":\n" + "\n".join(said) if said else ""))
    if "failed" in reply:
        if reply["failed"] == "compile":
            raise CompileError(f"kernel {name} ({arch}) failed to compile:\n{reply['log']}")
        raise CompileError(f"kernel {name} ({arch}): {reply['failed']} failed")
    return reply["symbol"], base64.b64decode(reply["cubin"]), reply["log"]


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
