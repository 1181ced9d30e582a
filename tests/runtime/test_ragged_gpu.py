"""Ragged batches on a real GPU (issue 30): the cuda backend with device lengths and starts,
split and unsplit, check=True, and topkgen-cpp's launch with LENGTHS and STARTS, each row
against the reference over its window. Skipped cleanly where no GPU is present (CI and the
developers' machines); UNVERIFIED until a task with a GPU runs it."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from topkgen.runtime import TopKError, gpu_unavailable

from ..support.ragged_cases import check_row, draw_windows
from ..support.topk_cases import make_rows

REASON = gpu_unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no GPU: {REASON}")

SHAPES = [("float32", 10, 700, 9, True), ("bfloat16", 100, 20000, 9, False), ("float32", 64, 131072, 8, True),
          ("float32", 1000, 131072, 64, False), ("bfloat16", 5000, 9000, 8, True)]


@pytest.fixture(scope="module")
def gpu_bundle(tmp_path_factory):
    from topkgen.runtime.cuda_backend import _CudaBackend

    out = tmp_path_factory.mktemp("gpu") / "bundle"
    subprocess.run([sys.executable, "-m", "topkgen", "build", "--arch", _CudaBackend().current_arch(), "--out",
                    str(out)], check=True)
    return out


def _device(array):
    from topkgen.runtime.cuda_backend import _cuda_core
    from topkgen.runtime.gpu_arrays import DeviceArray

    device = _cuda_core().Device()
    return DeviceArray.from_host(np.ascontiguousarray(array), device, device.default_stream)


@pytest.mark.parametrize("dtype, k, n, rows, det", SHAPES)
def test_ragged_rows_on_the_gpu(gpu_bundle, dtype, k, n, rows, det):
    from topkgen.runtime import TopK
    from topkgen.runtime.cuda_backend import _cuda_core
    from topkgen.runtime.gpu_arrays import DeviceArray

    op = TopK(gpu_bundle, backend="cuda")
    rng = np.random.default_rng(n + k)
    plan = op.plan(dtype, k, n, rows, det)
    bounds = tuple(c * plan.chunk for c in range(1, plan.chunks)) if plan else ()
    lengths, starts = draw_windows(rows, k, n, rng, "int32", bounds[:2])
    x = make_rows(dtype, rows, n, seed=n)
    device = _cuda_core().Device()
    stream = device.default_stream
    values = DeviceArray.empty((rows, k), x.dtype, device, stream)
    indices = DeviceArray.empty((rows, k), np.dtype(np.int64), device, stream)
    op(_device(x), k, deterministic=det, out=(values, indices), stream=stream, lengths=_device(lengths),
       starts=_device(starts), check=True)
    stream.sync()
    got_v, got_i = values.to_host(stream), indices.to_host(stream)
    for r in range(rows):
        check_row(x[r], got_v[r], got_i[r], k, int(lengths[r]), int(starts[r]), True, det, dtype, f"row {r}")
    with pytest.raises(TopKError, match="lengths: row 0 has length"):
        op(_device(x), k, out=(values, indices), lengths=_device(np.full(rows, n + 1, np.int32)), check=True)


def test_the_cpp_loader_launches_a_ragged_batch(cpp, gpu_bundle, tmp_path):
    from topkgen.runtime.cuda_backend import _CudaBackend

    k, n, rows = 64, 131072, 8
    x = make_rows("float32", rows, n, seed=3)
    lengths, starts = draw_windows(rows, k, n, np.random.default_rng(3))
    for name, array in (("x", x), ("L", lengths.astype(np.int64)), ("S", starts.astype(np.int64))):
        array.tofile(tmp_path / f"{name}.bin")
    proc = subprocess.run([cpp, "launch", gpu_bundle, _CudaBackend().current_arch(), "float32", str(k), str(n),
                           str(rows), "deterministic", "0", "1", tmp_path / "x.bin", tmp_path / "v.bin",
                           tmp_path / "i.bin", tmp_path / "L.bin", tmp_path / "S.bin"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    values = np.fromfile(tmp_path / "v.bin", np.float32).reshape(rows, k)
    indices = np.fromfile(tmp_path / "i.bin", np.int64).reshape(rows, k)
    for r in range(rows):
        check_row(x[r], values[r], indices[r], k, int(lengths[r]), int(starts[r]), True, True, "float32", f"row {r}")
