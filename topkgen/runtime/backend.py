"""What both backends share: the errors, how a kernel's launch and arguments are read from its
manifest entry, the arrays of one call, and the checks of x, out= and workspace= that each
backend makes in the same words before anything is loaded or compiled."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from topkgen.common.errors import InputError
from topkgen.policy import DTYPE_SIZES
from topkgen.manifest.params import params
from topkgen.policy.split import WORKSPACE_ALIGNMENT, ChunkPlan, SharedMemory, Stage, stages
from topkgen.common import suggest
# The C types of the non-pointer parameters (topkgen.build.render.PARAM_TYPES) as numpy scalars,
# which both backends pass with their C types.
SCALAR_TYPES = {"int": np.int32, "long long": np.int64}


class TopKError(InputError, RuntimeError):
    """A shape, array or bundle the runtime cannot serve; the message says which and why."""


class NoGpuError(TopKError):
    """The cuda backend found no usable GPU (no driver, no device): the emulator backend
    runs the same kernels on the CPU."""


@dataclass(frozen=True)
class Launch:
    """A kernel's launch configuration, as the manifest gives it: `dynamic_shared_bytes` is the
    most any launch gets (the function's limit is raised to it), `shared` the rule each launch's
    own follows (launch.shared_bytes: Stage.shared_bytes)."""

    threads: int
    rows_per_block: int
    dynamic_shared_bytes: int
    shared: SharedMemory = SharedMemory(0, 0, 1)

    @classmethod
    def of(cls, record: dict) -> "Launch":
        launch = record["launch"]
        return cls(launch["threads_per_block"], launch["rows_per_block"], launch["dynamic_shared_bytes"],
                   SharedMemory(launch["dynamic_shared_bytes"], launch["shared_buffer_bytes"],
                                DTYPE_SIZES[record["dtype"]]))

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


def takes_tickets(params: list[dict[str, str]]) -> bool:
    """Whether the kernel runs a split in one launch (its `tickets` parameter, schema 7)."""
    return any(param["name"] == "tickets" for param in params)


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
    index_dtype: str = "int64"  # the indices the caller gets, written by the kernels
    scratch_bytes: int = 0      # the large-k path's candidates with int32 indices (workspace or allocated)
    windows: dict[str, Any] = field(default_factory=dict)  # a ragged batch's lengths (and starts) buffers


def launch_arguments(spec: Any, x: Any, values: Any, indices: Any, rows: int, n: int, k: int, largest: bool) -> list[Any]:
    """The arguments of one unsplit launch of a kernel (a KernelSpec), for code that launches
    kernels itself (tests, benchmarks), by the same rule as every runtime launch; its dynamic
    shared memory is launch_shared_bytes(spec, n)."""
    (stage,) = stages(rows, n, k, largest, None, shared=spec.shared)
    return arguments(params(spec), stage, {"x": x, "values": values, "indices": indices}, None)


def launch_shared_bytes(spec: Any, n: int) -> int:
    """The dynamic shared memory of one unsplit launch of a kernel (a KernelSpec) over rows of n:
    what launch_arguments passes as its `shared_bytes` (split.SharedMemory)."""
    return spec.shared.bytes_for(n)


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

    def sm_count(self) -> int | None:
        """The GPU's SM count, which the split plan fills (None: no GPU, the policy's count)."""
        return None

    def view(self, x: Any, dtype: str | None) -> _View:
        raise NotImplementedError

    def check(self, view: _View, k: int, out: Any, workspace: Any, plan: ChunkPlan | None,
              index_dtype: str = "int64", scratch_bytes: int = 0) -> _Arrays:
        """Every check of `out` and `workspace` (`plan`: how the call splits, None when it
        does not; `index_dtype`: what out[1] holds; `scratch_bytes`: the large-k path's
        scratch the workspace serves), made before the kernel is loaded: nothing is compiled
        for a call that is refused."""
        raise NotImplementedError

    def windows(self, view: _View, lengths: Any, starts: Any, check: bool) -> Any:
        """A ragged batch's lengths (and starts) checked (topkgen.runtime.ragged.Windows, or
        None for dense rows): their layout always, their values where the backend holds them
        on the host or the call asks (`check`)."""
        raise NotImplementedError

    def load_aot(self, name: str, cubin: bytes, symbol: str, source: str) -> Any:
        raise NotImplementedError

    def load_jit(self, name: str, source: str) -> Any:
        raise NotImplementedError

    def load_ptx(self, name: str, ptx: bytes, symbol: str, source: str) -> Any:
        """A kernel from its shipped PTX, compiled for the GPU by the driver's JIT."""
        raise NotImplementedError

    def run(self, work: _Work, view: _View, k: int, arrays: _Arrays, stream: Any):
        """The launches, with the arrays `check` passed."""
        raise NotImplementedError

    def check_stream(self, stream: Any) -> None:
        _check_stream(stream)


OUT_LABELS = ("out[0] (values)", "out[1] (indices)")
INDEX_DTYPES = ("int64", "int32")  # int64: torch's; the kernels write either (their `flags`)


def index_dtype_of(value: Any) -> str:
    """The index_dtype argument, checked: "int64" (the default) or "int32"."""
    if not isinstance(value, str) or value not in INDEX_DTYPES:
        raise TopKError(f"index_dtype: expected 'int64' or 'int32', got {value!r}")
    return value
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


def workspace_need(plan: ChunkPlan | None, scratch_bytes: int) -> int:
    """The workspace bytes a call needs: a split's candidates, or the large-k path's scratch
    (int32 indices); 0 for none."""
    return plan.workspace_bytes if plan is not None else scratch_bytes


def _check_workspace_size(nbytes: int, needed: int) -> None:
    if nbytes < needed:
        raise TopKError(f"workspace: {nbytes} bytes, this call needs {needed} (TopK.workspace_bytes)")


def _check_alignment(address: int) -> None:
    """The kernels read the workspace's candidates with 16-byte vector loads and its int64
    indices with 8-byte ones: an address off a 16-byte boundary faults on the GPU."""
    if address % WORKSPACE_ALIGNMENT:
        raise TopKError(f"workspace: must start at a multiple of {WORKSPACE_ALIGNMENT} bytes")


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
