"""The emulator backend: the same rendered CUDA source, compiled for the CPU, run on numpy arrays.
It is how CI proves the whole runtime path without a GPU."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from numpy.lib.array_utils import byte_bounds

from topkgen.policy.split import ChunkPlan
from topkgen.runtime.ragged import Windows, check_array, check_values
from topkgen.runtime.backend import (
    MASKED, OUT_LABELS, TopKError, _Arrays, _Backend, _View, _Work, _check_alignment, _check_disjoint,
    _check_out, _check_workspace_size, _check_x_contiguous, _out_pair, _value_types, arguments, dtype_name,
    workspace_need)


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

    def windows(self, view: _View, lengths: Any, starts: Any, check: bool) -> Windows | None:
        """numpy lengths (and starts); their values are checked on every call (`check` or not):
        the emulator refuses a window outside the row, naming the row."""
        if lengths is None:
            return None
        shape, arrays = view.shape[:-1], {}
        for label, array in (("lengths", lengths), ("starts", starts)):
            if array is None:
                continue
            if not isinstance(array, np.ndarray) or isinstance(array, np.ma.MaskedArray):
                raise TopKError(f"{label}: the emulator backend takes numpy arrays, got {type(array).__name__}")
            width = check_array(label, shape, array.shape, array.flags.c_contiguous, str(array.dtype),
                                None if label == "lengths" else str(lengths.dtype))
            arrays[label] = array.reshape(-1)
        check_values(arrays["lengths"], arrays.get("starts"), view.n)
        return Windows(width, arrays)

    def load_aot(self, name: str, cubin: bytes, symbol: str, source: str) -> Any:
        return self.load_jit(name, source)  # the very source the cubin was compiled from

    def load_ptx(self, name: str, ptx: bytes, symbol: str, source: str) -> Any:
        return self.load_jit(name, source)  # the very source the PTX was compiled from

    def load_jit(self, name: str, source: str) -> Any:
        from topkgen.emulator import compile_source

        return compile_source(source, name=name, announce=_announce)

    def check(self, view: _View, k: int, out: Any, workspace: Any, plan: ChunkPlan | None,
              index_dtype: str = "int64", scratch_bytes: int = 0) -> _Arrays:
        shape = (*view.shape[:-1], k)
        if out is not None:
            out = _out_pair(out)
            for array, dtypes, label in zip(out, (_value_types(view.dtype), (index_dtype,)), OUT_LABELS):
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
            if workspace_need(plan, scratch_bytes):
                _check_workspace_size(workspace.nbytes, workspace_need(plan, scratch_bytes))
        arrays = [("x", view.array), *zip(OUT_LABELS, out or ()), ("workspace", workspace)]
        _check_disjoint([(label, *byte_bounds(array)) for label, array in arrays if array is not None])
        return _Arrays(out, workspace, {})

    def run(self, work: _Work, view: _View, k: int, arrays: _Arrays, stream: Any):
        shape, out = (*view.shape[:-1], k), arrays.out
        x = view.array.reshape(view.rows, view.n)  # contiguous (view): a view, not a copy
        values = np.empty((view.rows, k), dtype=x.dtype)
        indices = np.empty((view.rows, k), dtype=np.dtype(work.index_dtype))  # the kernels write this type
        pointers = {"x": x, "values": values, "indices": indices, **work.windows}
        if work.plan is not None:
            pointers.update(workspace_arrays(work.plan, x.dtype, arrays.workspace))
        if work.scratch_bytes:
            space = arrays.workspace if arrays.workspace is not None else np.empty(work.scratch_bytes, np.uint8)
            pointers["scratch"] = space.reshape(-1).view(np.uint8)[:work.scratch_bytes]
        for stage in work.stages:
            work.kernel.launch(work.name, work.launch.grid(stage.grid_rows), work.launch.threads,
                               arguments(work.params, stage, pointers, None),
                               shared_bytes=stage.shared_bytes,
                               # a split in one launch: its CTAs hand candidates over, checked
                               check_ordering=stage.buffers.get("tickets") is not None)
        if out is not None:  # the bits, into uint16 values too
            out[0][...] = values.reshape(shape).view(out[0].dtype)
            out[1][...] = indices.reshape(shape)  # of out[1]'s type (check): a copy, no conversion
            return out
        return values.reshape(shape), indices.reshape(shape)


def workspace_arrays(plan: ChunkPlan, dtype: np.dtype, workspace: Any) -> dict[str, np.ndarray]:
    """The workspace's candidate indices and values, and a split in one launch's tickets,
    zeroed as the cuda backend's memset zeroes them (topkgen.policy.split's layout), in the
    caller's array (its size checked by `check`) or a new one: the buffers a split's stages
    name."""
    if workspace is None:
        workspace = np.empty(plan.workspace_bytes, dtype=np.uint8)
    raw = workspace.reshape(-1).view(np.uint8)
    count = plan.rows * plan.candidates
    out = {"candidate_indices": raw[:count * 8].view(np.int64),
           "candidate_values": raw[plan.values_offset:plan.values_offset + count * dtype.itemsize].view(dtype)}
    if plan.one_launch:
        out["tickets"] = raw[plan.tickets_offset:plan.workspace_bytes].view(np.uint32)
        out["tickets"][:] = 0
    return out


def _announce(name: str) -> None:
    """A kernel's first use on the emulator compiles it with g++ for about 2-6 s, which looked like
    a hang: say so on stderr, once per kernel (the shared object is cached, on disk too)."""
    print(f"topkgen: compiling {name} for the emulator (first use; cached)", file=sys.stderr, flush=True)


def _host_array(array: Any, label: str) -> None:
    """An array the emulator backend writes: a writeable numpy array."""
    if not isinstance(array, np.ndarray):
        raise TopKError(f"{label}: the emulator backend takes numpy arrays, got {type(array).__name__}")
    if not array.flags.writeable:
        raise TopKError(f"{label}: the array is read-only")
