"""The consumer side: load a bundle, pick kernels by looking them up in the manifest's
dispatch table (`select`'s answers as data: no rule is evaluated per call), and
JIT-compile what the bundle leaves to JIT from the CUDA source it ships (or, for an arch
the bundle lacks, from the same templates and the policy the manifest embeds).

Backends: "cuda" loads cubins with cuda.core and launches on the caller's stream; it takes
any array exposing __cuda_array_interface__ or DLPack (torch, cupy) without importing torch.
"emulator" runs the same rendered source on the CPU (numpy arrays), which is how CI proves
the whole runtime path. Both launch what `topkgen.policy.split.stages` plans: one launch, or a
split's two through a workspace (the caller's, or one allocated on the stream), with
arguments passed by the names and in the order of the kernel's manifest `params`.
"""

from __future__ import annotations

import hashlib
import math
import os
import sys
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np
from numpy.lib.array_utils import byte_bounds

from topkgen.build import bundle as bundles
from topkgen.manifest import reading as manifests
from topkgen.policy import dispatch_table
from topkgen.common import settings
from topkgen.policy.dispatch_table import Choice
from topkgen.common.errors import InputError
from topkgen.manifest.checks import entries
from topkgen.policy.explain import Explanation, explain
from topkgen.policy import DTYPE_SIZES, DispatchError, all_kernels, as_flag, as_integer
from topkgen.build.render import params, render
from topkgen.policy.split import WORKSPACE_ALIGNMENT, ChunkPlan, Stage, stages
from topkgen.common import suggest
from topkgen.common.suggest import did_you_mean

BACKENDS = ("cuda", "emulator")
# The C types of the non-pointer parameters (topkgen.build.render.PARAM_TYPES) as numpy scalars,
# which both backends pass with their C types.
SCALAR_TYPES = {"int": np.int32, "long long": np.int64}


class TopKError(InputError, RuntimeError):
    """A shape, array or bundle the runtime cannot serve; the message says which and why."""


class NoGpuError(TopKError):
    """The cuda backend found no usable GPU (no driver, no device): the emulator backend
    runs the same kernels on the CPU."""


def gpu_unavailable() -> str | None:
    """Why no CUDA GPU can be used here, or None when one can."""
    try:
        from cuda.bindings import driver
    except ImportError as err:
        return f"cuda-bindings is not installed ({err})"
    try:
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return f"the CUDA driver is not usable ({err.name})"
        err, count = driver.cuDeviceGetCount()
        if err != driver.CUresult.CUDA_SUCCESS or count < 1:
            return "no CUDA device"
    except Exception as err:  # libcuda missing entirely
        return f"the CUDA driver is not installed ({err})"
    return None


def jit_disabled() -> bool:
    return settings.flag("TOPKGEN_DISABLE_JIT")


@dataclass(frozen=True)
class Launch:
    """A kernel's launch configuration, as the manifest gives it."""

    threads: int
    rows_per_block: int
    dynamic_shared_bytes: int

    @classmethod
    def of(cls, record: dict) -> "Launch":
        launch = record["launch"]
        return cls(launch["threads_per_block"], launch["rows_per_block"], launch["dynamic_shared_bytes"])

    def grid(self, rows: int) -> int:
        return (rows + self.rows_per_block - 1) // self.rows_per_block


def arguments(params: list[dict[str, str]], stage: Stage, pointers: dict[str, Any], null: Any) -> list[Any]:
    """A stage's arguments in the order of the kernel's `params`: pointers from `pointers` by
    buffer name (`null` for none), the others as numpy scalars of their C type."""
    out = []
    for param in params:
        name, ctype = param["name"], param["ctype"]
        if ctype.endswith("*"):
            buffer = stage.buffers[name]
            out.append(null if buffer is None else pointers[buffer])
        else:
            out.append(SCALAR_TYPES[ctype](stage.scalars[name]))
    return out


@dataclass(frozen=True)
class _Work:
    """What a call launches: the kernel, its launch configuration and parameters, and the
    stages (none for an empty batch); `plan` when the rows are split."""

    kernel: Any  # None for an empty batch
    name: str
    launch: Launch
    params: list[dict[str, str]]
    stages: list[Stage]
    plan: ChunkPlan | None


def launch_arguments(spec: Any, x: Any, values: Any, indices: Any, rows: int, n: int, k: int, largest: bool) -> list[Any]:
    """The arguments of one unsplit launch of a kernel (a KernelSpec), for code that launches
    kernels itself (tests, benchmarks), by the same rule as every runtime launch."""
    (stage,) = stages(rows, n, k, largest, None)
    return arguments(params(spec), stage, {"x": x, "values": values, "indices": indices}, None)


class TopK:
    """Top-k over the last dimension, served by the kernels of a bundle (or JIT)."""

    def __init__(self, bundle: str | os.PathLike, *, arch: str | None = None, backend: str = "cuda") -> None:
        """`bundle`: the bundle's directory (or its manifest.json); `arch`: the arch whose
        kernels serve the calls ("sm_90"; default the GPU's, which the emulator has none of);
        `backend`: "cuda" or "emulator". Each is checked before anything is read."""
        if not isinstance(bundle, (str, os.PathLike)):
            raise TopKError(f"bundle: expected a path (str or os.PathLike), got {type(bundle).__name__} {bundle!r}")
        if arch is not None and not isinstance(arch, str):
            raise TopKError(f"arch: expected a name such as 'sm_90' (a str), got {type(arch).__name__} {arch!r}")
        if not isinstance(backend, str) or backend not in BACKENDS:
            raise TopKError(f"backend: {backend!r} is not one of {', '.join(BACKENDS)}")
        try:
            self.manifest, self.root = manifests.load_manifest(bundle)
            self.policy = manifests.manifest_policy(self.manifest, str(bundle))
        except manifests.ManifestError as err:
            raise TopKError(str(err)) from None
        if "shard" in self.manifest:
            shard = self.manifest["shard"]
            raise TopKError(f"{self.root / manifests.MANIFEST}: shard: part {shard['index']}/{shard['count']} of a "
                            f"sharded build, not a bundle; assemble the parts with `topkgen merge` first")
        if backend == "emulator" and arch is None:
            raise TopKError("arch: the emulator backend needs an explicit arch (sm_90, sm_100, ...)")
        self._backend: _Backend = _EmulatorBackend() if backend == "emulator" else _CudaBackend()
        self.arch = arch if arch is not None else self._backend.current_arch()
        if self.arch not in self.policy.archs:
            raise TopKError(f"arch: {self.arch!r} is not in the bundle's policy (knows {', '.join(self.policy.archs)})"
                            f"{did_you_mean(self.arch, self.policy.archs)}")
        if backend == "cuda" and arch is not None:
            self._check_gpu_runs(arch)
        self._specs = {spec.name: spec for spec in all_kernels(self.policy, self.arch)}
        self._table, self.in_bundle = dispatch_table.serving_table(self.manifest, self.policy, self.arch)
        if self.in_bundle:
            self._entries = {e.record["name"]: e.record for e in entries(self.manifest) if e.record["arch"] == self.arch}
            try:  # every file checked now (sha256, ELF machine, SM) and kept: nothing is re-read later
                self._files = manifests.read_files(self.root, self.manifest, [self.arch])
            except manifests.ManifestError as err:
                raise TopKError(str(err)) from None
        else:  # an arch the bundle lacks: served by JIT
            self._entries = {name: bundles.spec_entry(spec) for name, spec in self._specs.items()}
            self._files = {}
        self._loaded: dict[str, Any] = {}

    def _check_gpu_runs(self, arch: str) -> None:
        """An arch named to the cuda backend must be one whose cubins this GPU runs: the same
        major compute capability, its minor at most the GPU's. Else the first call failed in
        the driver's cubin load (no binary for this GPU), not naming the argument."""
        major, minor = self.policy.archs[arch].capability
        gpu_major, gpu_minor = self._backend.device.compute_capability
        if major != gpu_major or minor > gpu_minor:
            gpu = self._backend.current_arch()
            raise TopKError(f"arch: {arch!r} kernels do not run on this GPU ({gpu}); pass arch={gpu!r} or leave "
                            f"arch out (the backend takes the GPU's)")

    # ------------------------------------------------------------------ choosing
    def choose(self, dtype: str, k: int, n: int, deterministic: bool = False, rows: int | None = None) -> Choice:
        """The kernel for a shape, and its chunks per row for a batch of `rows` (None: the
        batch is unknown, served unsplit): one lookup in the dispatch table."""
        dtype, k, n, rows = _request(dtype, k, n, rows)
        deterministic = _flag("deterministic", deterministic)
        jit = not jit_disabled()
        if not jit and not self.in_bundle:
            raise TopKError(f"TOPKGEN_DISABLE_JIT is set and the bundle {self.root} has no kernels for {self.arch}")
        try:
            choice = self._table.lookup(dtype, k, n, deterministic, jit, rows)
        except DispatchError as err:
            raise TopKError(f"{err}{' (TOPKGEN_DISABLE_JIT is set)' if not jit else ''}") from None
        return choice if self.in_bundle else replace(choice, source="jit")

    def plan(self, dtype: str, k: int, n: int, rows: int, deterministic: bool = False) -> ChunkPlan | None:
        """How a batch of `rows` rows is split (None: it is not), so that a caller can size
        the workspace it passes (`workspace_bytes`). A batch of 0 rows launches nothing, as a
        call on one does: it is not split (the C++ loader's plan says the same)."""
        dtype, k, n, rows = _request(dtype, k, n, rows)
        if rows is None:  # choose's "batch unknown": never split, but a call on 1 row of 262144 is
            raise TopKError("rows: expected the batch's row count (an integer), got None: how a batch splits, "
                            "and the workspace it needs, depend on it")
        choice = self.choose(dtype, k, n, deterministic, rows)
        return ChunkPlan(rows, n, k, choice.chunks, DTYPE_SIZES[dtype]) if choice.chunks > 1 else None

    def workspace_bytes(self, dtype: str, k: int, n: int, rows: int, deterministic: bool = False) -> int:
        """The workspace a call on rows x n elements needs (0: none). Pass at least this many
        bytes as `workspace=` and the call allocates nothing (CUDA graphs can capture it)."""
        plan = self.plan(dtype, k, n, rows, deterministic)
        return plan.workspace_bytes if plan else 0

    def explain(self, dtype: str, k: int, n: int, deterministic: bool = False, rows: int | None = None) -> Explanation:
        """The kernel that serves a shape and why: the table's choice, whose str() is what
        `topkgen explain` prints for the bundle's policy (an arch the bundle lacks is
        served by JIT, and says so)."""
        dtype, k, n, rows = _request(dtype, k, n, rows)
        choice = self.choose(dtype, k, n, deterministic, rows)  # checks deterministic is a bool
        answer = explain(self.policy, self.arch, dtype, k, n, deterministic=deterministic, jit=not jit_disabled(),
                         rows=rows)
        sel = answer.selection
        if (sel.kernel.name, sel.chunks) != (choice.kernel, choice.chunks):
            raise TopKError(f"the bundle's dispatch table sends {dtype} k={k} n={n}"
                            f"{'' if rows is None else f' rows={rows}'} to {choice.kernel} in {choice.chunks} "
                            f"chunk(s) per row but its policy to {sel.kernel.name} in {sel.chunks}; rebuild the bundle")
        if sel.source != choice.source:
            reason = f"{sel.reason}; the bundle has no {self.arch} kernel: jit"
            sel = replace(sel, source=choice.source, why=lambda: reason)
            answer = replace(answer, selection=sel)
        return answer

    # ------------------------------------------------------------------ running
    def __call__(self, x: Any, k: int, *, largest: bool = True, deterministic: bool = False,
                 out: tuple[Any, Any] | None = None, dtype: str | None = None, stream: Any = None,
                 workspace: Any = None):
        """Returns (values, indices) of the k largest (or smallest) along the last dimension.
        A small batch of long rows may be split (two launches on the stream): `workspace`, an
        array of at least `workspace_bytes(...)` bytes, serves it without an allocation;
        without one the backend allocates it on the stream. Nothing waits for the GPU.
        `out`: (values, indices), contiguous, of x's leading shape and k; values of x's type
        (or uint16 bits for 16-bit types), indices int64. Neither `out` nor `workspace` may
        share memory with x or with each other. `dtype` (short spellings too: bf16, fp16)
        says what raw uint16 input holds. Every argument is checked before a kernel is loaded
        (or JIT-compiled), in the same order by both backends: a refused call costs no compile."""
        view = self._backend.view(x, dtype)
        k, largest = _integer("k", k), _flag("largest", largest)
        self._backend.check_stream(stream)
        choice = self.choose(view.dtype, k, view.n, deterministic, view.rows)
        plan = ChunkPlan(view.rows, view.n, k, choice.chunks, DTYPE_SIZES[view.dtype]) if choice.chunks > 1 else None
        arrays = self._backend.check(view, k, out, workspace, plan)
        kernel = self._kernel(choice) if view.rows else None  # an empty batch loads and compiles nothing
        entry = self._entries[choice.kernel]
        work = _Work(kernel, choice.kernel, Launch.of(entry), entry["params"],
                     stages(view.rows, view.n, k, largest, plan) if view.rows else [], plan)
        return self._backend.run(work, view, k, arrays, stream)


    def _kernel(self, choice: Choice) -> Any:
        name = choice.kernel
        if name in self._loaded:
            return self._loaded[name]
        entry = self._entries[name]
        if choice.source == "aot":
            source = render(self._specs[name])
            if hashlib.sha256(source.encode()).hexdigest() != entry["source_sha256"]:
                raise TopKError(f"kernel {name}: the bundle was built from other source than this "
                                f"topkgen renders; rebuild the bundle")
            loaded = self._backend.load_aot(name, self._files[name], entry["symbol"], source)
        elif name in self._files:  # the source the bundle ships, sha256 checked at load
            loaded = self._backend.load_jit(name, self._files[name].decode())
        else:
            loaded = self._backend.load_jit(name, render(self._specs[name]))
        self._loaded[name] = loaded
        return loaded


def _integer(label: str, value: Any) -> int:
    """An integer argument as an int, by the rule the policy's own checks apply (any
    integral type, numpy's too; not a bool)."""
    try:
        return as_integer(label, value)
    except DispatchError as err:
        raise TopKError(str(err)) from None


def _flag(label: str, value: Any) -> bool:
    """A yes/no argument as a bool, by the rule `select` applies (policy.as_flag): `largest="no"`
    or `deterministic=None` would quietly have served the other request."""
    try:
        return as_flag(label, value)
    except DispatchError as err:
        raise TopKError(str(err)) from None


def _check_stream(stream: Any) -> None:
    """A stream argument the cuda backend can launch on (the emulator takes the same, and
    ignores it): None (torch's current stream for torch input, else the device's default),
    a stream handle as a non-negative int, or an object with __cuda_stream__ (cuda.core's
    Stream, torch.cuda.Stream) or an int `cuda_stream` (an older torch's Stream). Anything
    else reached cuda.core only after the kernel was loaded, and failed there with its own
    exception, not one naming the argument."""
    if stream is None or hasattr(stream, "__cuda_stream__") or isinstance(getattr(stream, "cuda_stream", None), int):
        return
    if isinstance(stream, int) and not isinstance(stream, bool) and stream >= 0:
        return
    raise TopKError(f"stream: expected a CUDA stream (a cuda.core Stream, an object with __cuda_stream__ such as "
                    f"torch.cuda.Stream, or a stream handle as an int >= 0), got {type(stream).__name__} {stream!r}")


def _dtype(dtype: Any) -> str:
    """A dtype argument with the short spellings the CLI takes (fp32, bf16, fp16, ...: one
    table, topkgen.common.suggest's), so that code and command lines name types alike."""
    if not isinstance(dtype, str):
        raise TopKError(f"dtype: expected a name such as 'float32' or 'bf16', got {dtype!r}")
    return suggest.dtype(dtype)


def _request(dtype: str, k: Any, n: Any, rows: Any) -> tuple[str, int, int, int | None]:
    """A request's arguments as `choose`, `plan`, `workspace_bytes` and `explain` all take
    them: the dtype's short spellings expanded, k, n and rows as ints whatever integral type
    they came as (what `__call__` takes too). The ranges are the dispatch table's to check,
    with the messages every loader gives (rows 0, an empty batch, is served unsplit)."""
    dtype, k, n = _dtype(dtype), _integer("k", k), _integer("n", n)
    return dtype, k, n, None if rows is None else _integer("rows", rows)


class _View:
    """An input seen as rows x n, whatever library it comes from."""

    def __init__(self, array: Any, dtype: str, shape: tuple[int, ...], ptr: int = 0) -> None:
        self.array, self.dtype, self.shape, self.ptr = array, dtype, shape, ptr
        if not shape:
            raise TopKError(f"x: expected at least one dimension of size >= 1, got shape {shape}")
        if shape[-1] < 1:  # the CLI's words for an .npy of this shape
            raise TopKError(f"x: n (its last dimension) must be >= 1, got shape {shape}")
        self.n = int(shape[-1])
        # Python's integers: numpy's int64 product wraps, and (2^32, 2^32, n) would be 0 rows,
        # an empty batch served by launching nothing.
        self.rows = math.prod(int(size) for size in shape[:-1])
        if self.rows >= 2**31:
            raise TopKError(f"x: {self.rows} rows is more than the kernels' 2^31 - 1")


@dataclass(frozen=True)
class _Arrays:
    """A call's `out` and `workspace` once a backend's `check` has passed them: `out` the pair
    or None (the backend allocates it), `workspace` the caller's (a numpy array; on the cuda
    backend its (address, bytes)) or None, `pointers` the device addresses of x and of the
    caller's outputs (cuda backend)."""

    out: tuple[Any, Any] | None
    workspace: Any
    pointers: dict[str, int]


class _Backend:
    def current_arch(self) -> str:
        raise NotImplementedError

    def view(self, x: Any, dtype: str | None) -> _View:
        raise NotImplementedError

    def check(self, view: _View, k: int, out: Any, workspace: Any, plan: ChunkPlan | None) -> _Arrays:
        """Every check of `out` and `workspace` (`plan`: how the call splits, None when it
        does not), made before the kernel is loaded: nothing is compiled for a call that is
        refused."""
        raise NotImplementedError

    def load_aot(self, name: str, cubin: bytes, symbol: str, source: str) -> Any:
        raise NotImplementedError

    def load_jit(self, name: str, source: str) -> Any:
        raise NotImplementedError

    def run(self, work: _Work, view: _View, k: int, arrays: _Arrays, stream: Any):
        """The launches, with the arrays `check` passed."""
        raise NotImplementedError

    def check_stream(self, stream: Any) -> None:
        _check_stream(stream)


OUT_LABELS = ("out[0] (values)", "out[1] (indices)")
# Both backends refuse a masked x (numpy.ma, or a __cuda_array_interface__ with a mask): the
# kernels read every element, so a masked one could be returned as a top value.
MASKED = ("a masked array: the kernels would read its masked elements as values; fill them first "
          "(x.filled(-inf) for the largest)")


def _out_pair(out: Any) -> tuple[Any, Any]:
    """`out`'s two arrays: a pair (values, indices), as a tuple or a list."""
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        what = f"{type(out).__name__} of {len(out)}" if isinstance(out, (tuple, list)) else type(out).__name__
        raise TopKError(f"out: expected a pair of arrays (values, indices), got a {what}")
    return out[0], out[1]


def _value_types(dtype: str) -> tuple[str, ...]:
    """The element types an `out` values array may hold for input of `dtype`, in both
    backends: the input's, or for a 16-bit type raw uint16 bits (the convention raw 16-bit
    input follows). The kernels write k elements of x's size per row: an `out` of another
    size would be written past its end, or short of it."""
    return (dtype, "uint16") if DTYPE_SIZES[dtype] == 2 else (dtype,)


def _check_out(label: str, shape: tuple[int, ...], found_shape: tuple[int, ...], contiguous: bool,
               dtypes: tuple[str, ...], found: str) -> None:
    """An output array as both backends need it: `shape`, contiguous (the kernels write
    rows of k elements back to back), and holding one of `dtypes`."""
    if found_shape != shape or not contiguous:
        raise TopKError(f"{label}: expected a contiguous array of shape {list(shape)}, got "
                        f"{'a non-contiguous one of ' if found_shape == shape else ''}{list(found_shape)}")
    if found not in dtypes:
        raise TopKError(f"{label}: expected {' or '.join(dtypes)} elements, got {found}")


def _check_disjoint(extents: list[tuple[str, int, int]]) -> None:
    """Refuse a call whose arrays share memory, from each one's (label, start, end) bytes as
    its backend finds them (numpy's byte bounds; a device array's pointer and size). The
    launches read x while CTAs write the candidates and the outputs in no order: on a GPU any
    overlap is a race, and a workspace over x overwrites the caller's input. Bounds, not
    elements: arrays that interleave within each other's span are refused too."""
    for i, (label, start, end) in enumerate(extents):
        for other, other_start, other_end in extents[:i]:
            if start < end and other_start < other_end and start < other_end and other_start < end:
                raise TopKError(f"{label}: shares memory with {other}; the kernels write {label} while they read or "
                                f"write {other}: pass separate arrays")


def _check_x_contiguous(contiguous: bool) -> None:
    """Both backends take x as the kernels read it: rows of n elements back to back. The cuda
    backend could serve another layout only through a copy the caller did not ask for (a
    device allocation and a copy kernel on their stream), so it refuses one; the emulator,
    which stands for the cuda backend on the CPU, refuses it too rather than copying (it
    once did: a strided x passed there and failed on the GPU)."""
    if not contiguous:
        raise TopKError("x: must be contiguous (its rows back to back, as the kernels read them); pass a "
                        "contiguous copy: x.contiguous() (torch, cupy: cupy.ascontiguousarray(x)) or "
                        "numpy.ascontiguousarray(x)")


def _check_workspace_size(nbytes: int, plan: ChunkPlan) -> None:
    if nbytes < plan.workspace_bytes:
        raise TopKError(f"workspace: {nbytes} bytes, this call needs {plan.workspace_bytes} (TopK.workspace_bytes)")


def _check_alignment(address: int) -> None:
    """The kernels read the workspace's candidates with 16-byte vector loads and its int64
    indices with 8-byte ones: an address off a 16-byte boundary faults on the GPU."""
    if address % WORKSPACE_ALIGNMENT:
        raise TopKError(f"workspace: must start at a multiple of {WORKSPACE_ALIGNMENT} bytes")


# ----------------------------------------------------------------------------- emulator

class _EmulatorBackend(_Backend):
    """numpy arrays on the CPU emulator: float32, float16, bfloat16 (ml_dtypes or raw uint16)."""

    def view(self, x: Any, dtype: str | None) -> _View:
        if not isinstance(x, np.ndarray):
            raise TopKError(f"x: the emulator backend takes numpy arrays, got {type(x).__name__}")
        if isinstance(x, np.ma.MaskedArray):
            raise TopKError(f"x: {MASKED}")
        name = dtype_name(str(x.dtype), dtype)
        _check_x_contiguous(x.flags.c_contiguous)
        return _View(x, name, x.shape)

    def load_aot(self, name: str, cubin: bytes, symbol: str, source: str) -> Any:
        return self.load_jit(name, source)  # the very source the cubin was compiled from

    def load_jit(self, name: str, source: str) -> Any:
        from topkgen.emulator import compile_source

        return compile_source(source, name=name)

    def check(self, view: _View, k: int, out: Any, workspace: Any, plan: ChunkPlan | None) -> _Arrays:
        shape = (*view.shape[:-1], k)
        if out is not None:
            out = _out_pair(out)
            for array, dtypes, label in zip(out, (_value_types(view.dtype), ("int64",)), OUT_LABELS):
                _host_array(array, label)
                _check_out(label, shape, array.shape, array.flags.c_contiguous, dtypes, str(array.dtype))
        if workspace is not None:
            _host_array(workspace, "workspace")
            if workspace.dtype.hasobject:  # references to Python objects, not bytes to write candidates into
                raise TopKError(f"workspace: an array of {workspace.dtype} cannot hold the candidates; pass bytes "
                                f"(a uint8 array)")
            if not workspace.flags.c_contiguous:
                raise TopKError("workspace: must be contiguous")
            if workspace.nbytes:  # as on the GPU (an empty one is never touched), though the emulator copies it
                _check_alignment(workspace.ctypes.data)
            if plan is not None:
                _check_workspace_size(workspace.nbytes, plan)
        arrays = [("x", view.array), *zip(OUT_LABELS, out or ()), ("workspace", workspace)]
        _check_disjoint([(label, *byte_bounds(array)) for label, array in arrays if array is not None])
        return _Arrays(out, workspace, {})

    def run(self, work: _Work, view: _View, k: int, arrays: _Arrays, stream: Any):
        shape, out = (*view.shape[:-1], k), arrays.out
        x = view.array.reshape(view.rows, view.n)  # contiguous (view): a view, not a copy
        values = np.empty((view.rows, k), dtype=x.dtype)
        indices = np.empty((view.rows, k), dtype=np.int64)
        pointers = {"x": x, "values": values, "indices": indices}
        if work.plan is not None:
            pointers.update(self._candidates(work.plan, x.dtype, arrays.workspace))
        for stage in work.stages:
            work.kernel.launch(work.name, work.launch.grid(stage.grid_rows), work.launch.threads,
                               arguments(work.params, stage, pointers, None),
                               shared_bytes=work.launch.dynamic_shared_bytes)
        if out is not None:  # the bits, into uint16 values too
            out[0][...] = values.reshape(shape).view(out[0].dtype)
            out[1][...] = indices.reshape(shape)
            return out
        return values.reshape(shape), indices.reshape(shape)

    @staticmethod
    def _candidates(plan: ChunkPlan, dtype: np.dtype, workspace: Any) -> dict[str, np.ndarray]:
        """The workspace's candidate indices and values (topkgen.policy.split's layout), in the
        caller's array (its size checked by `check`) or a new one."""
        if workspace is None:
            workspace = np.empty(plan.workspace_bytes, dtype=np.uint8)
        raw = workspace.reshape(-1).view(np.uint8)
        count = plan.rows * plan.candidates
        return {"candidate_indices": raw[:count * 8].view(np.int64),
                "candidate_values": raw[plan.values_offset:plan.values_offset + count * dtype.itemsize].view(dtype)}


def _host_array(array: Any, label: str) -> None:
    """An array the emulator backend writes: a writeable numpy array."""
    if not isinstance(array, np.ndarray):
        raise TopKError(f"{label}: the emulator backend takes numpy arrays, got {type(array).__name__}")
    if not array.flags.writeable:
        raise TopKError(f"{label}: the array is read-only")


# ----------------------------------------------------------------------------- cuda

@lru_cache(maxsize=1)
def _cuda_core() -> Any:
    """cuda.core's objects, wherever this version keeps them, looked up once (every launch
    asks for them): the package itself where it holds them (1.0 removed
    cuda.core.experimental, the releases before it keep that only to warn, as 0.7 does),
    else experimental (0.4). `view_dlpack(obj)` views a DLPack array without stream
    ordering: by the from_dlpack classmethod where there is one (0.5 deprecated the
    constructor), else by the constructor."""
    import types

    import cuda.core

    core = cuda.core
    if hasattr(core, "Device"):
        from cuda.core.utils import StridedMemoryView
    else:
        from cuda.core import experimental as core
        from cuda.core.experimental.utils import StridedMemoryView
    if hasattr(StridedMemoryView, "from_dlpack"):
        def view_dlpack(obj: Any) -> Any:
            return StridedMemoryView.from_dlpack(obj, stream_ptr=-1)
    else:
        def view_dlpack(obj: Any) -> Any:
            return StridedMemoryView(obj, stream_ptr=-1)
    return types.SimpleNamespace(Device=core.Device, ObjectCode=core.ObjectCode, LaunchConfig=core.LaunchConfig,
                                 launch=core.launch, Stream=core.Stream, view_dlpack=view_dlpack)


def _kernel_handle(kernel: Any) -> Any:
    """The driver handle of a cuda.core Kernel: its public `handle` where the release has one
    (0.7 and 1.x do; some releases that hold a C++ handle keep no `_handle` that Python can
    read), else the private `_handle` (0.4)."""
    return kernel.handle if hasattr(kernel, "handle") else kernel._handle


def allow_dynamic_shared(handle: Any, nbytes: int, device_id: int) -> None:
    """Set a kernel's dynamic shared memory limit to `nbytes` (needed once static plus
    dynamic shared memory pass 48 KiB) on one device. cuda.core loads cubins as libraries
    (cuLibraryLoadData: 0.4 does where the driver is CUDA 12 or newer, 1.x always), so its
    handles are CUkernels, which take cuKernelSetAttribute with a device; a module's
    CUfunction (0.4 on an older driver) takes cuFuncSetAttribute. A handle that is neither
    is the address of a CUkernel."""
    from cuda.bindings import driver

    attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    if isinstance(handle, driver.CUfunction):
        (err,) = driver.cuFuncSetAttribute(handle, attribute, nbytes)
    else:
        if not isinstance(handle, driver.CUkernel):
            handle = driver.CUkernel(int(handle))
        (err,) = driver.cuKernelSetAttribute(attribute, nbytes, handle, device_id)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise TopKError(f"this GPU cannot give a kernel {nbytes} bytes of dynamic shared memory ({err.name}); "
                        f"lower the policy's shared_row_bytes for this arch and rebuild")


class _CudaBackend(_Backend):
    """Device arrays through __cuda_array_interface__ or DLPack, kernels through cuda.core."""

    def __init__(self) -> None:
        try:
            Device = _cuda_core().Device

            self.device = Device()
            self.device.set_current()
        except Exception as err:  # no driver, no GPU
            raise NoGpuError(f"backend 'cuda': no usable GPU ({err})") from None
        self.device_id: int = self.device.device_id  # every array of a call must be this device's
        self._shared_allowed: dict[int, tuple[Any, int]] = {}  # id(kernel) -> (kernel, bytes allowed)

    def check_stream(self, stream: Any) -> None:
        if not isinstance(stream, _cuda_core().Stream):  # cuda.core's own, taken by type
            _check_stream(stream)

    def current_arch(self) -> str:
        major, minor = self.device.compute_capability
        return f"sm_{major}{minor}"

    def view(self, x: Any, dtype: str | None) -> _View:
        ptr, shape, strides, found = _device_array(x, "x")
        check_device("x", x, self.device_id)
        name = dtype_name(found, dtype)
        _check_x_contiguous(_c_contiguous(shape, strides))
        return _View(x, name, shape, ptr)

    def load_aot(self, name: str, cubin: bytes, symbol: str, source: str) -> Any:
        ObjectCode = _cuda_core().ObjectCode

        # By its symbol: get_kernel encodes a name it does not find in symbol_mapping, but
        # passes a mapped one as is to cuLibraryGetKernel, whose char* refuses a str.
        return ObjectCode.from_cubin(cubin).get_kernel(symbol)

    def load_jit(self, name: str, source: str) -> Any:
        from topkgen.build.compile import compile_kernel

        arch = self.current_arch()
        compiled = compile_kernel(source, name, arch)  # cached on disk, shared by processes
        return self.load_aot(name, compiled.cubin, compiled.symbol, source)

    def check(self, view: _View, k: int, out: Any, workspace: Any, plan: ChunkPlan | None) -> _Arrays:
        shape = (*view.shape[:-1], k)
        size = DTYPE_SIZES[view.dtype]  # of uint16 values too
        pointers = {"x": int(view.ptr)}
        extents = [("x", view.ptr, view.ptr + view.rows * view.n * size)]
        if out is None:
            if _torch_of(view.array) is None:
                raise TopKError("out: pass (values, indices) device arrays for inputs that are not torch tensors")
        else:
            out = _out_pair(out)
            for array, dtypes, label, itemsize in zip(out, (_value_types(view.dtype), ("int64",)), OUT_LABELS,
                                                      (size, 8)):
                ptr, found_shape, strides, found = _device_array(array, label, written=True)
                check_device(label, array, self.device_id)
                _check_out(label, shape, found_shape, _c_contiguous(found_shape, strides), dtypes, found)
                pointers[label] = ptr
                extents.append((label, ptr, ptr + math.prod(shape) * itemsize))
        space = None  # (address, bytes) of the caller's workspace, checked whether or not this call splits
        if workspace is not None:
            space = _device_bytes(workspace, "workspace")
            check_device("workspace", workspace, self.device_id)
            if space[1]:  # an empty one is never read or written, wherever it points
                _check_alignment(space[0])
            if plan is not None:
                _check_workspace_size(space[1], plan)
            extents.append(("workspace", space[0], space[0] + space[1]))
        _check_disjoint(extents)
        return _Arrays(out, space, pointers)

    def run(self, work: _Work, view: _View, k: int, arrays: _Arrays, stream: Any):
        core = _cuda_core()

        torch = _torch_of(view.array)
        if arrays.out is None:  # torch input (check refused any other): outputs on x's device
            shape = (*view.shape[:-1], k)
            values = torch.empty(shape, dtype=view.array.dtype, device=view.array.device)
            indices = torch.empty(shape, dtype=torch.int64, device=view.array.device)
            pointers = {"x": arrays.pointers["x"], "values": values.data_ptr(), "indices": indices.data_ptr()}
        else:
            values, indices = arrays.out
            pointers = {"x": arrays.pointers["x"], "values": arrays.pointers[OUT_LABELS[0]],
                        "indices": arrays.pointers[OUT_LABELS[1]]}
        if not work.stages:  # an empty batch launches nothing
            return values, indices
        cuda_stream = self._stream(stream, view.array)
        release = None
        if work.plan is not None:
            base, release = self._workspace(work.plan, arrays.workspace, cuda_stream, torch, view.array)
            pointers["candidate_indices"], pointers["candidate_values"] = base, base + work.plan.values_offset
        # The driver's default limit on dynamic shared memory is 48 KiB less the kernel's
        # static shared memory (cuda.h, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), so
        # any kernel launched with some gets its limit set, once.
        nbytes = work.launch.dynamic_shared_bytes
        if nbytes and self._shared_allowed.get(id(work.kernel), (None, 0))[1] < nbytes:
            self._allow_dynamic_shared(work.kernel, nbytes)
            self._shared_allowed[id(work.kernel)] = (work.kernel, nbytes)
        for stage in work.stages:
            config = core.LaunchConfig(grid=work.launch.grid(stage.grid_rows), block=work.launch.threads,
                                       shmem_size=work.launch.dynamic_shared_bytes)
            # cuda.core passes Python ints as pointers (0: null) and numpy scalars with their C types.
            core.launch(cuda_stream, config, work.kernel, *arguments(work.params, stage, pointers, 0))
        if release is not None:
            release()
        return values, indices

    def _workspace(self, plan: ChunkPlan, space: tuple[int, int] | None, cuda_stream: Any, torch: Any, array: Any):
        """The workspace's device address, and what to call once the launches are enqueued.
        The caller's array costs no allocation. Otherwise the allocation is ordered on the
        launch stream and nothing waits: for torch inputs torch's caching allocator, with the
        launch stream current (it hands the block out again only to work queued after ours on
        that stream); else a cuda.core buffer from the device's memory pool, freed on the
        stream behind the launches."""
        if space is not None:  # its size checked by `check`
            return space[0], None
        if torch is not None:
            with torch.cuda.stream(torch.cuda.ExternalStream(int(cuda_stream.handle), device=array.device)):
                buffer = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device=array.device)
            return buffer.data_ptr(), lambda: None  # dropped after the launches: reused in stream order
        buffer = self.device.allocate(plan.workspace_bytes, stream=cuda_stream)
        return int(buffer.handle), lambda: buffer.close(cuda_stream)

    def _allow_dynamic_shared(self, kernel: Any, nbytes: int) -> None:
        allow_dynamic_shared(_kernel_handle(kernel), nbytes, self.device.device_id)

    def _stream(self, stream: Any, array: Any) -> Any:
        Stream = _cuda_core().Stream

        if isinstance(stream, Stream):
            return stream
        if stream is None:
            torch = sys.modules.get("torch")
            if torch is not None and isinstance(array, torch.Tensor):
                stream = torch.cuda.current_stream(array.device).cuda_stream
            else:
                return self.device.default_stream
        if not isinstance(stream, int) and not hasattr(stream, "__cuda_stream__") \
                and isinstance(getattr(stream, "cuda_stream", None), int):
            stream = stream.cuda_stream  # a torch.cuda.Stream of a torch without the stream protocol
        if isinstance(stream, int):
            return Stream.from_handle(stream)
        return self.device.create_stream(stream)


def _device_bytes(x: Any, label: str) -> tuple[int, int]:
    """(pointer, size in bytes) of a contiguous device array of any element type, read as
    _device_array reads every device array (so a cuda.core Buffer, DLPack only, serves too)."""
    ptr, shape, strides, name = _device_array(x, label, written=True)
    if not _c_contiguous(shape, strides):
        raise TopKError(f"{label}: expected a contiguous device array")
    if hasattr(x, "element_size"):  # torch
        itemsize = x.element_size()
    elif hasattr(x, "__cuda_array_interface__"):
        itemsize = int(x.__cuda_array_interface__["typestr"][2:])
    else:  # DLPack: StridedMemoryView's numpy dtype, by name (bfloat16 is ml_dtypes')
        import ml_dtypes  # noqa: F401 - registers bfloat16 with numpy

        itemsize = np.dtype(name).itemsize
    return ptr, math.prod(shape) * itemsize


def _torch_of(array: Any) -> Any:
    """torch, when `array` is a torch tensor (without importing torch: a caller that passes
    tensors has), else None."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and isinstance(array, torch.Tensor) else None


# DLPack's device types (dlpack.h): kDLCUDA is one device's memory; kDLCUDAHost (pinned host)
# and kDLCUDAManaged memory are read by every device, so their ids name no device to check.
DLPACK_CUDA = 2


def array_device(x: Any) -> int | None:
    """The CUDA device whose memory holds a device array, as its exporter says: a torch
    tensor's x.device.index, a DLPack device (kDLCUDA, id); a bare __cuda_array_interface__
    names none (its pointer's context is implied), so the driver is asked of the pointer
    (`pointer_device`). None: memory every device reads (pinned host, managed), or an
    exporter or driver that does not say."""
    if type(x).__module__.startswith("torch") and hasattr(x, "data_ptr"):
        return x.device.index
    dlpack_device = getattr(x, "__dlpack_device__", None)
    if dlpack_device is not None:
        kind, ordinal = dlpack_device()
        return int(ordinal) if int(kind) == DLPACK_CUDA else None
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        return pointer_device(int(cai["data"][0]))
    return None


def pointer_device(ptr: int) -> int | None:
    """The device ordinal of the device memory at `ptr` (cuPointerGetAttributes), or None:
    managed or host memory (every device reads it), an address no context knows, or no
    driver. The refusal this serves is a courtesy; an unknown address fails at launch as
    it always did."""
    try:
        from cuda.bindings import driver

        attribute = driver.CUpointer_attribute
        asked = [attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, attribute.CU_POINTER_ATTRIBUTE_IS_MANAGED,
                 attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL]
        err, (memory_type, managed, ordinal) = driver.cuPointerGetAttributes(len(asked), asked, ptr)
        if err != driver.CUresult.CUDA_SUCCESS or managed:
            return None
        if int(memory_type) != int(driver.CUmemorytype.CU_MEMORYTYPE_DEVICE):
            return None
        return int(ordinal)
    except Exception:  # no cuda-bindings, no libcuda: nothing to ask
        return None


def check_device(label: str, array: Any, device_id: int) -> None:
    """Refuse an array (x, out, workspace) on another GPU than the backend's: the kernels,
    launched in device `device_id`'s context, would read or write another device's
    addresses (a fault, or without one, some other memory)."""
    found = array_device(array)
    if found is not None and found != device_id:
        raise TopKError(f"{label}: on CUDA device {found}, but this TopK runs on device {device_id} (the device "
                        f"current when it was created): move it to device {device_id}, or use a TopK created "
                        f"while device {found} is current")


def _device_array(x: Any, label: str,
                  written: bool = False) -> tuple[int, tuple[int, ...], tuple[int, ...] | None, str]:
    """(pointer, shape, strides in elements or None, dtype name) of a device array; one
    the call writes (`written`: out, workspace) must not be marked read-only by its exporter.

    torch tensors are read through their own attributes (without importing torch): cuda.core
    cannot view bfloat16 through DLPack yet. Then __cuda_array_interface__, then DLPack."""
    if type(x).__module__.startswith("torch") and hasattr(x, "data_ptr"):
        if not x.is_cuda:
            raise TopKError(f"{label}: expected a CUDA tensor, got one on {x.device}")
        return x.data_ptr(), tuple(x.shape), tuple(x.stride()), str(x.dtype).removeprefix("torch.")
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        itemsize = int(cai["typestr"][2:])
        if cai.get("strides") is not None and any(s % itemsize for s in cai["strides"]):
            # Elements off their own size's boundaries (a field of a record array): in
            # elements, floored, such strides would pass for contiguous rows.
            raise TopKError(f"{label}: strides {tuple(cai['strides'])} bytes are not multiples of its "
                            f"{itemsize}-byte elements: pass a contiguous array")
        if cai.get("mask") is not None:
            raise TopKError(f"{label}: {MASKED}")
        strides = None if cai.get("strides") is None else tuple(s // itemsize for s in cai["strides"])
        try:
            name = str(np.dtype(cai["typestr"]))  # "<u2": uint16, raw bfloat16 or float16 bits; ">f4" stays
        except TypeError:
            name = cai["typestr"]
        if written and cai["data"][1]:  # the interface's read-only flag
            raise TopKError(f"{label}: the array is read-only")
        return int(cai["data"][0]), tuple(cai["shape"]), strides, name
    if hasattr(x, "__dlpack__"):
        try:
            smv = _cuda_core().view_dlpack(x)
        except Exception as err:
            raise TopKError(f"{label}: cannot view the array through DLPack: {err}") from None
        if smv.is_device_accessible:
            if written and getattr(smv, "readonly", False):  # DLPack 1.0's read-only flag
                raise TopKError(f"{label}: the array is read-only")
            return smv.ptr, tuple(smv.shape), smv.strides, str(smv.dtype)
    raise TopKError(f"{label}: expected a device array (__cuda_array_interface__ or DLPack), got {type(x).__name__}")


def _c_contiguous(shape: tuple[int, ...], strides: tuple[int, ...] | None) -> bool:
    """Whether strides (in elements) lay the array out in C order, as numpy's
    flags.c_contiguous says of a host array: dimensions of size 1 may have any stride, and an
    empty array, which holds no element, is contiguous whatever its strides."""
    if strides is None or 0 in shape:
        return True
    expect = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size > 1 and stride != expect:
            return False
        expect *= size
    return True


def dtype_name(found: str, requested: str | None) -> str:
    """The topkgen dtype of an array whose element type is `found` (numpy's str of it:
    "float32", or ">f4" for a byte order other than the machine's); raw uint16 holds
    bfloat16 (the default) or float16 bits, as `requested` says (short spellings too)."""
    if found.startswith((">", "<")):  # numpy spells only a non-native byte order so
        endian = "big" if found[0] == ">" else "little"
        raise TopKError(f"x: byte order: its elements are {endian}-endian ({found}), the kernels read the machine's; "
                        f"convert with x.astype(x.dtype.newbyteorder('='))")
    shown = repr(requested)  # as the caller spelled it, and what that means
    if requested is not None and _dtype(requested) not in DTYPE_SIZES:  # not "does not match the array's"
        raise TopKError(f"dtype: {suggest.unknown_dtype(requested, DTYPE_SIZES)}")
    if requested is not None and _dtype(requested) != requested:
        requested = _dtype(requested)
        shown = f"{shown} ({requested})"
    name = found
    if name == "uint16":
        name = requested or "bfloat16"
        if name not in ("bfloat16", "float16"):
            raise TopKError(f"dtype: raw uint16 input must be bfloat16 or float16, got {shown}")
    if name not in DTYPE_SIZES:
        raise TopKError(f"x: dtype {found} is not supported ({', '.join(DTYPE_SIZES)})")
    if requested is not None and requested != name:
        raise TopKError(f"dtype: {shown} does not match the array's {name}")
    return name
