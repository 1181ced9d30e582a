"""The runtime end to end through TopK(..., backend="emulator") against topkgen.runtime.reference."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from topkgen import policy as pol
from topkgen.runtime import cuda_backend, topk
from topkgen.runtime import TopK, TopKError

from ..support.topk_cases import check_topk, make_rows

ARCHS = ("sm_90", "sm_100")


def _shape_for(policy, rule, arch):
    """A (dtype, k, n, deterministic) that the policy sends to `rule` on `arch`."""
    for dtype in ("float32", "bfloat16", "float16"):
        for det in (False, True):
            for spec in pol.kernels_of_rule(policy, rule, arch, dtype):
                k = max(spec.k_min, min(spec.k, 7))
                for n in (spec.exact_n, min(spec.n_max, 40000), 3 * k + 5, 2500):
                    if n and spec.n_min <= n <= spec.n_max and k <= n:
                        sel = pol.select(policy, arch, dtype, k, n, deterministic=det)
                        if sel.rule == rule.name:
                            return dtype, k, n, det
    return None


@pytest.mark.parametrize("arch", ARCHS)
def test_every_rule_is_reached_and_matches_the_reference(built_bundle, arch):
    op = TopK(built_bundle, arch=arch, backend="emulator")
    reached = set()
    for rule in op.policy.rules:
        shape = _shape_for(op.policy, rule, arch)
        if shape is None:
            assert arch not in rule.archs
            continue
        dtype, k, n, det = shape
        for largest in (True, False):
            x = make_rows(dtype, 3, n, seed=n)
            sel = op.explain(dtype, k, n, det)
            values, indices = op(x, k, largest=largest, deterministic=det)
            check_topk(x, values, indices, k, largest, sel.kernel.mode == "deterministic", dtype,
                       what=f"{rule.name} {dtype} k={k} n={n}")
        assert sel.rule == rule.name
        assert sel.source == ("jit" if not rule.aot or dtype == "float16" else "aot")
        reached.add(rule.name)
    assert reached == {r.name for r in op.policy.rules if arch in r.archs}


def test_exact_tiers_go_to_jit_and_to_aot_without_it(built_bundle, monkeypatch):
    tiers = [("sm_90", 16, 2048), ("sm_100", 16, 2048), ("sm_90", 32, 256), ("sm_100", 32, 256), ("sm_100", 16, 1024)]
    for arch, k, n in tiers:
        op = TopK(built_bundle, arch=arch, backend="emulator")
        assert op.explain("float32", k, n).source == "jit"
    monkeypatch.setenv("TOPKGEN_DISABLE_JIT", "1")
    for arch, k, n in tiers:
        op = TopK(built_bundle, arch=arch, backend="emulator")
        sel = op.explain("bfloat16", k, n)
        assert sel.source == "aot" and sel.kernel.name in {e["name"] for e in op.manifest["kernels"]}
        x = make_rows("bfloat16", 2, n, seed=k)
        values, indices = op(x, k)
        check_topk(x, values, indices, k, True, sel.kernel.mode == "deterministic", "bfloat16")
    with pytest.raises(TopKError, match="float16.*JIT is disabled"):
        TopK(built_bundle, arch="sm_90", backend="emulator")(np.zeros((2, 64), np.float16), 4)


def test_float16_goes_to_jit_and_matches(built_bundle):
    op = TopK(built_bundle, arch="sm_90", backend="emulator")
    x = make_rows("float16", 4, 700, seed=3)
    sel = op.explain("float16", 40, 700, True)
    assert sel.source == "jit"
    values, indices = op(x, 40, deterministic=True)
    check_topk(x, values, indices, 40, True, True, "float16")


def test_leading_dims_out_and_raw_bfloat16(built_bundle):
    op = TopK(built_bundle, arch="sm_100", backend="emulator")
    x = make_rows("bfloat16", 6, 300, seed=9).reshape(2, 3, 300)
    values = np.empty((2, 3, 10), x.dtype)
    indices = np.empty((2, 3, 10), np.int64)
    op(x, 10, largest=False, deterministic=True, out=(values, indices))
    raw_values, raw_indices = op(x.view(np.uint16), 10, largest=False, deterministic=True)
    check_topk(x.reshape(6, 300), values.reshape(6, 10), indices.reshape(6, 10), 10, False, True, "bfloat16")
    assert np.array_equal(raw_indices, indices) and np.array_equal(raw_values, values.view(np.uint16))


def test_an_arch_the_bundle_lacks_is_served_by_jit(tmp_path):
    out = tmp_path / "sm90only"
    subprocess.run([sys.executable, "-m", "topkgen", "build", "--arch", "sm_90", "--out", str(out)],
                   check=True, capture_output=True)
    op = TopK(out, arch="sm_100", backend="emulator")
    sel = op.explain("float32", 100, 5000)
    assert sel.source == "jit" and "the bundle has no sm_100 kernel" in sel.reason
    x = make_rows("float32", 2, 5000, seed=1)
    check_topk(x, *op(x, 100), 100, True, False, "float32")


def test_bad_arrays_get_clear_errors(built_bundle):
    op = TopK(built_bundle, arch="sm_90", backend="emulator")
    with pytest.raises(TopKError, match="dtype float64 is not supported"):
        op(np.zeros((2, 8)), 2)
    with pytest.raises(TopKError, match=r"^x: must be contiguous \(its rows back to back"):
        op(np.zeros((8, 4), np.float32).T, 2)
    with pytest.raises(TopKError, match="k: must be <= n"):
        op(np.zeros((2, 8), np.float32), 9)
    values, indices = op(np.zeros((0, 50), np.float32), 5)
    assert values.shape == indices.shape == (0, 5)
    with pytest.raises(TopKError, match="emulator backend needs an explicit arch"):
        TopK(built_bundle, backend="emulator")


_EMPTY_BATCHES = """\
import sys
import numpy as np
from topkgen.runtime import TopK
op = TopK(sys.argv[1], arch="sm_100", backend="emulator")
for n, k in ((5000, 100), (2048, 16)):  # a kernel of the bundle, and one JIT-compiled (policy)
    values, indices = op(np.zeros((0, n), np.float32), k)
    assert values.shape == indices.shape == (0, k), (values.shape, indices.shape)
"""


def test_an_empty_batch_loads_and_compiles_no_kernel(built_bundle, tmp_path):
    """A call with no rows launches nothing, yet it loaded the kernel it would have launched
    (compiling it, where JIT serves the shape): seconds spent, and a compile that can fail,
    for a call that does nothing (the C++ loader never touched the driver for one)."""
    cache = tmp_path / "cache"
    proc = subprocess.run([sys.executable, "-c", _EMPTY_BATCHES, str(built_bundle)], capture_output=True, text=True,
                          env={**os.environ, "TOPKGEN_CACHE_DIR": str(cache)})
    assert proc.returncode == 0, proc.stderr
    assert not cache.exists() or list(cache.rglob("*.so")) == [], sorted(cache.rglob("*"))


def _jit_in_child(bundle: str, cache: str, queue) -> None:
    os.environ["TOPKGEN_CACHE_DIR"] = cache
    op = TopK(bundle, arch="sm_90", backend="emulator")
    x = make_rows("float32", 2, 2048, seed=5)
    values, indices = op(x, 16)
    check_topk(x, values, indices, 16, True, True, "float32")
    queue.put("ok")


def test_concurrent_jit_compiles_leave_one_good_cache_entry(built_bundle, tmp_path):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_jit_in_child, args=(str(built_bundle), str(tmp_path), queue)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    assert [queue.get(timeout=5) for _ in procs] == ["ok"] * 3
    # one entry for the kernel, one for the emulator's runtime
    assert sorted(p.suffix for p in (tmp_path / "emulator").iterdir()) == [".sha256"] * 2 + [".so"] * 2


def _nvrtc_in_child(cache: str, queue) -> None:
    os.environ["TOPKGEN_CACHE_DIR"] = cache
    from topkgen.build.compile import compile_kernel
    from topkgen.build.render import render
    policy = pol.load()
    spec = pol.select(policy, "sm_90", "float16", 16, 2048).kernel
    queue.put(compile_kernel(render(spec), spec.name, "sm_90").symbol)


def test_concurrent_nvrtc_jit_compiles_leave_one_good_entry(tmp_path):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_nvrtc_in_child, args=(str(tmp_path), queue)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    assert [queue.get(timeout=5) for _ in procs] == ["topk_register_n2048_k16_det_f16_sm_90"] * 3
    store = tmp_path / "nvrtc-store"  # one action record naming its cubin and source, no temporary files
    assert [p.suffix for p in (store / "ac").iterdir()] == [".json"]
    assert len(list((store / "cas").iterdir())) == 2


def test_topkgen_run_on_the_emulator(built_bundle, tmp_path):
    x = make_rows("float32", 5, 3000, seed=11)
    np.save(tmp_path / "in.npy", x)
    proc = subprocess.run([sys.executable, "-m", "topkgen", "run", "--bundle", str(built_bundle), "--arch", "sm_90",
                           "--backend", "emulator", "--k", "33", "--smallest", "--deterministic",
                           str(tmp_path / "in.npy"), "-o", str(tmp_path / "out.npz")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "by topk_radix_dyn_k64_det_f32_sm_90 (aot)" in proc.stdout
    result = np.load(tmp_path / "out.npz")
    check_topk(x, result["values"], result["indices"], 33, False, True, "float32")
    xb = make_rows("bfloat16", 3, 500, seed=12)
    np.save(tmp_path / "bf16.npy", xb)  # numpy stores ml_dtypes.bfloat16 as raw 2-byte records
    proc = subprocess.run([sys.executable, "-m", "topkgen", "run", "--bundle", str(built_bundle), "--arch", "sm_100",
                           "--backend", "emulator", "--k", "20", str(tmp_path / "bf16.npy"), "-o",
                           str(tmp_path / "bf16.npz")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    result = np.load(tmp_path / "bf16.npz")
    check_topk(xb, result["values"].view(xb.dtype), result["indices"], 20, True, True, "bfloat16")
    # The file says bfloat16 (2-byte records): --dtype float16 is refused, not read as float16 bits.
    # --dtype float16 does decide what raw uint16 bits hold.
    clash = subprocess.run([sys.executable, "-m", "topkgen", "run", "--bundle", str(built_bundle), "--arch", "sm_90",
                            "--backend", "emulator", "--k", "2", "--dtype", "fp16", str(tmp_path / "bf16.npy")],
                           capture_output=True, text=True)
    assert (clash.returncode, clash.stdout) == (2, ""), clash.stderr
    assert clash.stderr == (f"topkgen: error: {tmp_path / 'bf16.npy'}: bfloat16[3, 500]: dtype: 'float16' does not "
                            f"match the array's bfloat16\n")
    bad = subprocess.run([sys.executable, "-m", "topkgen", "run", "--bundle", str(built_bundle), "--arch", "sm_90",
                          "--backend", "emulator", "--k", "5000", str(tmp_path / "in.npy"), "-o",
                          str(tmp_path / "bad.npz")], capture_output=True, text=True)
    assert bad.returncode == 2 and "float32[5, 3000]: k: must be <= n, got k=5000 > n=3000" in bad.stderr
    assert not (tmp_path / "bad.npz").exists()


class _Interface:
    """An object that only exposes the __cuda_array_interface__ protocol (as cupy or numba
    arrays do); the cuda backend reads pointer, shape, strides and dtype from it."""

    def __init__(self, typestr, shape, strides=None, ptr=0x7F0000001000):
        self.__cuda_array_interface__ = {"typestr": typestr, "shape": shape, "strides": strides,
                                         "data": (ptr, False), "version": 3}


def test_device_arrays_are_read_from_the_cuda_array_interface():
    from topkgen.runtime import dtype_name
    from topkgen.runtime.backend import _c_contiguous
    from topkgen.runtime.cuda_backend import _device_array

    ptr, shape, strides, name = _device_array(_Interface("<f4", (3, 100)), "x")
    assert (ptr, shape, strides, dtype_name(name, None)) == (0x7F0000001000, (3, 100), None, "float32")
    _, _, strides, name = _device_array(_Interface("<u2", (4, 10), strides=(20, 2)), "x")
    assert strides == (10, 1) and _c_contiguous((4, 10), strides)
    assert dtype_name(name, None) == "bfloat16" and dtype_name(name, "float16") == "float16"
    _, shape, strides, _ = _device_array(_Interface("<f4", (4, 10), strides=(80, 4)), "x")  # every other row
    assert not _c_contiguous(shape, strides)
    _, shape, strides, _ = _device_array(_Interface("<f4", (10, 4), strides=(4, 40)), "x")  # transposed
    assert not _c_contiguous(shape, strides)
    with pytest.raises(TopKError, match="dtype float64 is not supported"):
        dtype_name(_device_array(_Interface("<f8", (2,)), "x")[3], None)
    # A field of a record array: 4-byte elements 6 bytes apart. Read as whole elements
    # (6 // 4 == 1) the strides looked contiguous and the kernels read the wrong bytes.
    for strides in ((1200, 6), (1202, 4)):
        with pytest.raises(TopKError, match=rf"^x: strides \({strides[0]}, {strides[1]}\) bytes are not multiples of "
                                            rf"its 4-byte elements: pass a contiguous array$"):
            _device_array(_Interface("<f4", (2, 300), strides=strides), "x")
    with pytest.raises(TopKError, match="x: expected a device array"):
        _device_array(np.zeros(3, np.float32), "x")


STRIDED = ("x: must be contiguous (its rows back to back, as the kernels read them); pass a contiguous copy: "
           "x.contiguous() (torch, cupy: cupy.ascontiguousarray(x)) or numpy.ascontiguousarray(x)")


def test_both_backends_take_x_as_the_kernels_read_it_and_nothing_else(built_bundle):
    """One contract: x's rows back to back. The cuda backend refused strided rows while the
    emulator copied them, so a call passed on the CPU and failed on the GPU. A strided x is
    refused by both, in the same words, and the copy is left to the caller; what is
    contiguous whatever its strides say (size-1 dimensions, an empty batch) passes both."""
    op = TopK(built_bundle, arch="sm_90", backend="emulator")
    backend = object.__new__(cuda_backend._CudaBackend)  # its checks alone: no device is opened
    backend.device_id = 0
    x = make_rows("float32", 6, 600, seed=5)
    for strided in (x[::2], x[:, :300], x.reshape(6, 2, 300)[:, 0], np.zeros((300, 6), np.float32).T):
        with pytest.raises(TopKError) as err:
            op(strided, 5)
        assert str(err.value) == STRIDED
        device = _Interface("<f4", strided.shape, strides=strided.strides)
        with pytest.raises(TopKError) as err:
            backend.view(device, None)
        assert str(err.value) == STRIDED
        copied = np.ascontiguousarray(strided)  # what the message says to do
        check_topk(copied, *op(copied, 5), 5, True, False, "float32")
    for contiguous in (x[2:4], x[:1, None], np.zeros((0, 600), np.float32)[:, ::1]):
        op(contiguous, 5)
        assert backend.view(_Interface("<f4", contiguous.shape, strides=contiguous.strides), None).n == 600
    empty = _Interface("<f4", (0, 600), strides=(8, 4000))  # no element: no layout to get wrong
    assert backend.view(empty, None).rows == 0


def test_calls_dispatch_by_table_lookup_alone(built_bundle, monkeypatch):
    """The runtime evaluates no rule per call: with select and the renderer gone, AOT and
    shipped JIT kernels still run (the JIT one from the source the bundle ships)."""
    import topkgen.policy.explain as explaining

    op = TopK(built_bundle, arch="sm_90", backend="emulator")
    op(make_rows("float32", 1, 5000, seed=2), 40)  # an AOT kernel, loaded once (its source is checked)

    def forbidden(*args, **kwargs):
        raise AssertionError("evaluated per call")

    monkeypatch.setattr(explaining, "select", forbidden)
    monkeypatch.setattr(topk, "explain", forbidden)
    monkeypatch.setattr(topk, "render", forbidden)
    monkeypatch.setattr(pol, "select", forbidden)
    x = make_rows("float32", 2, 5000, seed=3)
    check_topk(x, *op(x, 40), 40, True, False, "float32")
    assert op.choose("float32", 16, 2048) == topk.Choice("topk_register_n2048_k16_det_f32_sm_90", "jit")
    x = make_rows("float32", 2, 2048, seed=4)
    check_topk(x, *op(x, 16), 16, True, True, "float32")


def test_schema_1_bundles_are_refused_with_a_rebuild_hint(built_bundle, tmp_path):
    copy = tmp_path / "bundle"
    shutil.copytree(built_bundle, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["schema_version"] = 1
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(TopKError, match=r"manifest\.json: schema_version: 1 has no dispatch table; rebuild the bundle"):
        TopK(copy, arch="sm_90", backend="emulator")
