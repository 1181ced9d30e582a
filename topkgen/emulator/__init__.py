"""Run CUDA C++ kernels on the CPU.

`compile_source` compiles the very text that NVRTC gets with the host C++ compiler and the
SIMT header `include/topkgen_sim.h`; `Module.launch` runs a kernel with every CUDA thread as
a fiber. Faults (partial or divergent barriers, deadlocks, bad warp masks, out-of-bounds
global or dynamic shared accesses, a launch that outlives the watchdog) raise
EmulationError naming the kernel, block and thread or lane; so do misaligned accesses
(a 16-byte vector load off a 16-byte boundary), which x86 would tolerate and a GPU does not.

`launch(..., counters=True)` returns the launch's traffic counters (emulator/counters.py):
bytes through the kernels' global-memory helpers, atomics, shared-memory bank lanes per warp
atomic instruction, barriers, shuffles and votes, in total and per phase.

`launch(..., check_ordering=True)` checks how blocks hand data to one another within a launch
(the last block of a row merging what the others wrote): a read of another block's write
fails unless the writer fenced before its global atomic, the reader fenced after its own, and
the read was not through the read-only path (the header's "inter-CTA ordering check").

Limits: kernels must not spin-wait on another CTA (reported as a watchdog timeout);
__activemask() returns the lanes that had not returned when the warp last synchronised; reads that stay inside
the few bytes of guard zone beside a buffer are not detected (writes there are).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import threading
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from topkgen.common.errors import OutOfMemory
from topkgen.common.files import atomic_write
from topkgen.common.paths import cuda_include_dir
from topkgen.emulator.counters import Counters, PhaseStats, from_phases, site_paths
from topkgen.emulator.object_cache import cache_dir, cache_writes, compile_lock, intact, no_room, record

INCLUDE_DIR = Path(__file__).resolve().parent / "include"
# The alignment sanitizer in trap mode makes a misaligned access trap as it faults on a GPU.
# -fno-gnu-unique keeps each module's kernel registry and static shared memory its own (the
# header explains which few objects it still shares across the process, and why).
# -O1: a radix kernel compiled in about 5 s where -O2 took 9-10 s (with its copy of the
# runtime, before the runtime became a shared object of its own: now 3.4-3.9 s), and the emulator's test
# files (tests/emulator, tests/templates, test_split, test_large_k) ran in 198 s against 216 s
# on modules already compiled; a cold `make test` (most of it g++) had grown past CI's 30 minutes.
CXX_FLAGS = ("-std=c++17", "-O1", "-fPIC", "-shared", "-pthread", "-w", "-fno-strict-aliasing",
             "-fsanitize=alignment", "-fsanitize-undefined-trap-on-error", "-fno-gnu-unique")
DEFAULT_TIMEOUT_S = 120.0
MAX_THREADS_PER_BLOCK = 1024


class EmulationError(RuntimeError):
    """A fault found while compiling or running a kernel on the emulator."""


class EmulatorOutOfMemory(EmulationError, OutOfMemory):
    """The host refused the memory a launch's arguments need: the machine, not a bug (exit 2)."""


@dataclass(frozen=True)
class KernelInfo:
    index: int
    symbol: str      # extern "C" name, or the mangled name of a template instance
    display: str     # the name as written in the source
    signature: str   # one code per parameter: p pointer, i int32, I uint32, l int64, f float, b bool ...


_SCALAR_CODES = {("i", 1): "c", ("i", 2): "h", ("i", 4): "i", ("i", 8): "l",
                 ("u", 1): "C", ("u", 2): "H", ("u", 4): "I", ("u", 8): "L",
                 ("f", 4): "f", ("f", 8): "d", ("b", 1): "b"}
_CODE_NAMES = {"p": "pointer", "c": "int8", "h": "int16", "i": "int32", "l": "int64", "C": "uint8",
               "H": "uint16", "I": "uint32", "L": "uint64", "f": "float32", "d": "float64", "b": "bool",
               "?": "unsupported type"}

_EXTERN_SHARED = re.compile(
    r"extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s*)?([A-Za-z_][\w:]*(?:\s+[A-Za-z_][\w:]*)*?)"
    r"\s*(?:__align__\s*\(\s*\d+\s*\)\s*)?\b([A-Za-z_]\w*)\s*\[\s*\]\s*;")
_GLOBAL = re.compile(r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+"
                     r"(?:__launch_bounds__\s*\([^)]*\)\s*)?([A-Za-z_]\w*)\s*(<[^;{()]*>)?\s*\(")


def _prepare(source: str, name: str) -> str:
    """The translation unit: SIMT header, the source (with `extern __shared__` arrays bound to
    the block's guarded dynamic shared memory) and a registration of every kernel."""

    def bind_shared(m: re.Match) -> str:
        depth = source[:m.start()].count("{") - source[:m.start()].count("}")
        if depth <= 0:
            raise EmulationError(f"{name}: declare `extern __shared__` arrays inside the kernel for the emulator")
        ctype, var = m.group(1).strip(), m.group(2)
        return f"{ctype}* const {var} = reinterpret_cast<{ctype}*>(::tk::dynamic_shared());"

    body = _EXTERN_SHARED.sub(bind_shared, source)
    kernels: list[str] = []
    for m in _GLOBAL.finditer(source):
        before = source[:m.start()].rstrip()
        is_instantiation = re.search(r"\btemplate$", before) is not None
        is_template_definition = before.endswith(">")
        if is_template_definition and not is_instantiation:
            continue
        if is_instantiation != (m.group(2) is not None):
            continue
        expr = m.group(1) + (m.group(2) or "")
        if expr not in kernels:
            kernels.append(expr)
    registration = "\n".join(
        f'static int tk_registered_{i} = ::tk::register_kernel(&{expr}, "{expr}");'
        for i, expr in enumerate(kernels))
    return (f'#include "topkgen_sim.h"\n#line 1 "{name}.cu"\n{body}\n'
            f'#line 1 "{name}.registration"\n{registration}\n')


def _compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise EmulationError("no C++ compiler found (install g++ or set CXX)")
    return cxx


@lru_cache(maxsize=None)
def _toolchain(cxx: str) -> str:
    """What besides the source decides the shared object: compiler, flags and SIMT header."""
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    return "\0".join((version, " ".join(CXX_FLAGS), (INCLUDE_DIR / "topkgen_sim.h").read_text()))


def _cache_key(unit: str, cxx: str) -> str:
    h = hashlib.sha256()
    for part in (unit, _toolchain(cxx)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _cuda_header_dirs() -> list[Path]:
    """The CUDA include folder, then its cccl/ where there is one: a CUDA 13 toolkit (what
    TOPKGEN_CUDA_INCLUDE may name) keeps nv/target, which cuda_fp16.h includes, only there;
    NVRTC has it built in, g++ does not. The wheels have it in both, the first one wins."""
    include = cuda_include_dir()
    return [include, *([include / "cccl"] if (include / "cccl").is_dir() else [])]


_loaded: dict[str, "Module"] = {}


def compile_source(source: str, *, name: str = "kernel", defines: Sequence[str] = (),
                   announce: Callable[[str], None] | None = None) -> "Module":
    """Compile CUDA C++ source for the emulator. The shared object is cached on disk by the
    hash of the translation unit, compiler and header; concurrent processes are safe (each
    compiles to a private file and renames it into place; one compiles a unit while the others
    wait for it, compile_lock). defines: NAME=INTEGER macros set
    before the SIMT header (TK_COUNTERS=0 compiles the counting hooks out). announce: called
    with `name` just before g++ runs (a cache miss: about 1.5-4 s a kernel, and 2 s more the
    first time on a cache, for the runtime), once, never for a cached one."""
    if not re.fullmatch(r"[A-Za-z_][\w.-]{0,99}", name):
        raise EmulationError(f"name: {name!r} is not a plain file name")
    for define in defines:
        if not re.fullmatch(r"[A-Za-z_]\w{0,63}=-?[0-9]{1,9}", define):
            raise EmulationError(f"defines: {define!r} is not NAME=INTEGER")
    unit = "".join(f"#define {d.replace('=', ' ', 1)}\n" for d in defines) + _prepare(source, name)
    cxx = _compiler()
    key = _cache_key(unit, cxx)
    if key in _loaded:
        return _loaded[key]
    announced: list[str] = []

    def announce_once(_: str) -> None:  # the module and the runtime it needs: one notice, the module's
        if announce is not None and not announced:
            announced.append(name)
            announce(name)

    cache = cache_dir()
    so_path = cache / f"{key}.so"
    rt_key = _cache_key(_RUNTIME_UNIT, cxx)
    image = intact(so_path, key)
    if image is None or rt_key not in _runtimes:
        # One process compiles what is missing, the runtime included (its lock is taken inside
        # the module's, never the other way round); the others wait for it and load its entries.
        with compile_lock(key):
            _runtime(cxx, rt_key, announce_once)
            image = intact(so_path, key)
            if image is None:
                image = _compile(unit, name, cxx, cache, so_path, key, announce_once)
    module = Module(so_path, name, image, _runtimes[rt_key])
    _loaded[key] = module
    return module


# The emulator's runtime (the header's TK_RUNTIME part: scheduler, fault handlers, block
# execution): compiled once per header and compiler into the emulator cache, loaded once per
# process and bound to every module, which no longer compiles a copy of its own.
_RUNTIME_UNIT = '#define TK_RUNTIME 1\n#include "topkgen_sim.h"\n'
_runtimes: dict[str, "Runtime"] = {}


def _runtime(cxx: str, rt_key: str, announce: Callable[[str], None]) -> None:
    """Load the runtime for `rt_key` into _runtimes, compiled first where the cache lacks it."""
    if rt_key in _runtimes:
        return
    cache = cache_dir()
    so_path = cache / f"{rt_key}.so"
    image = intact(so_path, rt_key)
    if image is None:
        with compile_lock(rt_key):
            image = intact(so_path, rt_key)
            if image is None:
                image = _compile(_RUNTIME_UNIT, "topkgen_sim_runtime", cxx, cache, so_path, rt_key, announce)
    _runtimes[rt_key] = Runtime(so_path, image)


def _compile(unit: str, name: str, cxx: str, cache: Path, so_path: Path, key: str,
             announce: Callable[[str], None]) -> bytes:
    """g++ on the translation unit into the cache entry (a private file renamed into place)."""
    from topkgen.build.cache import require_directories

    require_directories((cache.parent, cache), what="the emulator cache")
    tmp_dir = cache / f".build-{os.getpid()}-{os.urandom(4).hex()}"
    src, out = tmp_dir / f"{name}.cpp", tmp_dir / "module.so"
    announce(name)
    try:
        with cache_writes(cache):
            tmp_dir.mkdir()
            src.write_text(unit)
        cmd = [cxx, *CXX_FLAGS, f"-I{INCLUDE_DIR}", *(f"-I{d}" for d in _cuda_header_dirs()), str(src), "-o",
               str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            no_room(proc.stderr, cache)
            raise EmulationError(f"host compilation of '{name}' failed:\n{proc.stderr.strip()}")
        with cache_writes(cache):
            image = out.read_bytes()
            atomic_write(so_path, image)
            atomic_write(so_path.with_suffix(".sha256"), record(key, image).encode())
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return image


_ENTRY_POINTS = ("tk_kernel_signature", "tk_kernel_display", "tk_kernel_symbol", "tk_region_alloc", "tk_region_data",
                 "tk_region_check", "tk_region_free", "tk_launch", "tk_cancel", "tk_kernel_count", "tk_max_phases",
                 "tk_bind_runtime")


def _load_image(path: Path, name: str, image: bytes, entry_points: Sequence[str], what: str) -> tuple[int, Any]:
    """The very bytes verified, loaded from an anonymous file: what replaces the cache entry
    after the check is never loaded. Its descriptor stays open with the library: dlopen knows
    a library by its name, and /proc/self/fd/N names another file once N is reused.
    RTLD_LOCAL: a module's symbols must bind to its own definitions, never another module's."""
    fd = os.memfd_create(f"topkgen-emulator-{name}", os.MFD_CLOEXEC)
    os.write(fd, image)
    lib = ctypes.CDLL(f"/proc/self/fd/{fd}", mode=os.RTLD_LOCAL)
    missing = [fn for fn in entry_points if not hasattr(lib, fn)]
    if missing:
        raise EmulationError(f"{path}: not a topkgen emulator {what} (no {', '.join(missing)})")
    return fd, lib


class Runtime:
    """The emulator's runtime (the header's TK_RUNTIME part), loaded once per process."""

    def __init__(self, path: Path, image: bytes) -> None:
        self._image_fd, self._lib = _load_image(path, "runtime", image, ("tk_runtime_launch",), "runtime")
        self.launch = self._lib.tk_runtime_launch


class Module:
    """A compiled emulator module: look kernels up by name and launch them."""

    def __init__(self, path: Path, name: str, image: bytes, runtime: Runtime) -> None:
        self.path, self.name = path, name
        self._image_fd, lib = _load_image(path, name, image, _ENTRY_POINTS, "module")
        self.runtime = runtime  # bound below: it must outlive the module
        lib.tk_bind_runtime.argtypes = [ctypes.c_void_p]
        lib.tk_bind_runtime(ctypes.cast(runtime.launch, ctypes.c_void_p))
        for fn, res in (("tk_kernel_signature", ctypes.c_char_p), ("tk_kernel_display", ctypes.c_char_p),
                        ("tk_kernel_symbol", ctypes.c_char_p), ("tk_region_alloc", ctypes.c_void_p),
                        ("tk_region_data", ctypes.c_void_p), ("tk_region_check", ctypes.c_int),
                        ("tk_launch", ctypes.c_int), ("tk_kernel_count", ctypes.c_int),
                        ("tk_site_count", ctypes.c_ulonglong),
                        ("tk_max_phases", ctypes.c_int)):
            getattr(lib, fn).restype = res
        lib.tk_region_alloc.argtypes = [ctypes.c_size_t]
        for fn in ("tk_region_data", "tk_region_check", "tk_region_free"):
            getattr(lib, fn).argtypes = [ctypes.c_void_p]
        lib.tk_launch.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint),
                                  ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p),
                                  ctypes.POINTER(ctypes.c_char_p), ctypes.c_int, ctypes.c_size_t, ctypes.c_int,
                                  ctypes.c_ulonglong, ctypes.c_double, ctypes.c_int, ctypes.c_char_p,
                                  ctypes.c_size_t, ctypes.c_int, ctypes.POINTER(PhaseStats),
                                  ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        self._lib = lib
        self.kernels: dict[str, KernelInfo] = {}
        for i in range(lib.tk_kernel_count()):
            info = KernelInfo(i, lib.tk_kernel_symbol(i).decode(), lib.tk_kernel_display(i).decode(),
                              lib.tk_kernel_signature(i).decode())
            self.kernels[info.symbol] = info
            self.kernels.setdefault(info.display, info)

    def launch(self, symbol: str, grid: int | Sequence[int], block: int | Sequence[int], args: Sequence[Any], *,
               shared_bytes: int = 0, schedule_seed: int | None = None,
               timeout: float = DEFAULT_TIMEOUT_S, workers: int | None = None,
               counters: bool = False, check_ordering: bool = False) -> Counters | None:
        """Run a kernel. Arrays are passed as device pointers (writes land in them), None as a
        null pointer; numpy scalars carry their C type. schedule_seed shuffles the order in which threads run
        between barriers; None runs them in thread order. counters=True returns the launch's
        traffic counters (the same under every schedule seed and worker count).
        check_ordering=True runs the blocks one at a time (in an order the schedule seed shuffles)
        and fails any read of global memory another block wrote in the launch unless the
        writer released it (stores, __threadfence(), global atomic), the reader acquired it
        (global atomic, __threadfence()) and read it through load_global, not load_global_nc
        (the header's ordering check says why each).

        Kept whole: argument marshalling, the launch and the guard-zone checks share the
        regions it allocates and must free in one finally."""
        kernel = self.kernels.get(symbol)
        if kernel is None:
            known = ", ".join(sorted({k.symbol for k in self.kernels.values()})) or "none"
            raise EmulationError(f"{self.name}: no kernel '{symbol}' (kernels: {known})")
        grid3, block3 = _dim3(grid, "grid"), _dim3(block, "block")
        if block3[0] * block3[1] * block3[2] > MAX_THREADS_PER_BLOCK:
            raise EmulationError(f"block: {block3} has more than {MAX_THREADS_PER_BLOCK} threads")
        if len(args) != len(kernel.signature):
            raise EmulationError(f"kernel '{symbol}' takes {len(kernel.signature)} arguments, got {len(args)}")
        lib = self._lib
        argv = (ctypes.c_void_p * max(1, len(args)))()
        keep: list[Any] = []
        regions: list[tuple[int, int, np.ndarray]] = []  # (region, arg index, array)
        try:
            for i, (arg, code) in enumerate(zip(args, kernel.signature)):
                if isinstance(arg, np.ndarray):
                    if code != "p":
                        raise EmulationError(f"argument #{i} of '{symbol}' is {_CODE_NAMES[code]}, got an array")
                    region = lib.tk_region_alloc(max(1, arg.nbytes))
                    if not region:
                        raise EmulatorOutOfMemory(f"the emulator cannot allocate {arg.nbytes} bytes for argument #{i} "
                                                  f"({arg.dtype}[{arg.size}]) of '{symbol}': out of memory")
                    regions.append((region, i, arg))
                    data = lib.tk_region_data(region)
                    ctypes.memmove(data, np.ascontiguousarray(arg).ctypes.data, arg.nbytes)
                    cell = ctypes.c_void_p(data)
                elif arg is None:  # a null pointer
                    if code != "p":
                        raise EmulationError(f"argument #{i} of '{symbol}' is {_CODE_NAMES[code]}, got None")
                    cell = ctypes.c_void_p(0)
                elif isinstance(arg, np.generic):
                    got = _SCALAR_CODES.get((arg.dtype.kind, arg.dtype.itemsize))
                    if got != code:
                        raise EmulationError(f"argument #{i} of '{symbol}' is {_CODE_NAMES[code]}, "
                                             f"got numpy {arg.dtype}")
                    cell = np.array(arg)
                else:
                    raise EmulationError(f"argument #{i} of '{symbol}': pass a numpy array or a numpy scalar "
                                         f"(np.int32, np.float32, ...), got {type(arg).__name__}")
                keep.append(cell)
                argv[i] = ctypes.addressof(cell) if isinstance(cell, ctypes.c_void_p) else cell.ctypes.data
            names = [f"argument #{i} ({a.dtype}[{a.size}])".encode() for _, i, a in regions]
            region_ptrs = (ctypes.c_void_p * max(1, len(regions)))(*[r for r, _, _ in regions])
            region_names = (ctypes.c_char_p * max(1, len(regions)))(*names)
            err = ctypes.create_string_buffer(2048)
            phases = (PhaseStats * lib.tk_max_phases())()
            nphases = ctypes.c_int(0)
            status = _cancellable(lambda: lib.tk_launch(
                kernel.index, (ctypes.c_uint * 3)(*grid3), (ctypes.c_uint * 3)(*block3), argv, region_ptrs,
                region_names, len(regions), shared_bytes, int(schedule_seed is not None),
                (schedule_seed or 0) & (2**64 - 1), timeout, workers or os.cpu_count() or 1, err, len(err),
                int(counters), phases, ctypes.byref(nphases), int(check_ordering)), lib.tk_cancel)
            if status != 0:
                raise EmulationError(err.value.decode(errors="replace"))
            for region, i, arr in regions:
                damage = lib.tk_region_check(region)
                if damage:
                    side = "before the start" if damage == 1 else "past the end"
                    raise EmulationError(f"out-of-bounds global write {side} of argument #{i} "
                                         f"({arr.dtype}[{arr.size}]) of kernel '{kernel.display}', found in "
                                         f"its guard zone after the launch")
            for region, i, arr in regions:
                if arr.flags.writeable and arr.nbytes:
                    view = np.ctypeslib.as_array((ctypes.c_ubyte * arr.nbytes).from_address(lib.tk_region_data(region)))
                    arr[...] = view.view(arr.dtype).reshape(arr.shape)
            if not counters:
                return None
            counts = from_phases(list(phases[:nphases.value]))
            nsites = lib.tk_site_count()
            if nsites:
                rows = (ctypes.c_ulonglong * (7 * nsites))()
                lib.tk_site_read(rows)
                sites, copies, full = site_paths([tuple(rows[7 * i:7 * i + 7]) for i in range(nsites)])
                counts = replace(counts, warp_sites=sites, site_entries=copies, full_warp_sites=full)
            return counts
        finally:
            for region, _, _ in regions:
                lib.tk_region_free(region)


def _cancellable(launch: Callable[[], int], cancel: Callable[[], None]) -> int:
    """Run `launch` (tk_launch, which holds no GIL) on a thread of its own while this one waits,
    so that a Ctrl-C or a SIGTERM (topkgen.cli.stops) is taken at once, not when a kernel on a
    GiB of data returns: the launch is then cancelled (tk_cancel: its blocks stop at their next
    watchdog poll), waited for, so that its regions are freed only once nothing uses them, and
    the interruption goes on up."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(launch())
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
            outcome.append(err)

    worker = threading.Thread(target=run, name="topkgen-emulator-launch", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.05)
    except BaseException:
        while worker.is_alive():
            cancel()  # again and again: the launch clears the flag as it starts
            worker.join(0.05)
        raise
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def _dim3(value: int | Sequence[int], label: str) -> tuple[int, int, int]:
    dims = [value] if isinstance(value, (int, np.integer)) else list(value)
    if not 1 <= len(dims) <= 3 or any(int(d) < 1 or int(d) >= 2**31 for d in dims):
        raise EmulationError(f"{label}: expected 1 to 3 positive dimensions, got {value!r}")
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))  # type: ignore[return-value]
