"""The load order for a GPU the bundle may not have been built for (topkgen.runtime.binary),
on the CPU: TopK(..., backend="emulator", gpu_arch=G) stands in for a GPU of arch G, takes
the binary the order gives (its own cubins, a lower minor's, JIT from the bundle's sources)
or refuses, says which in explain, and runs the kernels it took against the reference."""

from __future__ import annotations

import numpy as np
import pytest

from topkgen.runtime import TopK, TopKError, reference
from topkgen.manifest.serving import order_record
from topkgen.runtime.binary import NoBinaryError, resolve

from ..support.topk_cases import make_rows


def _order(policy_archs, need, targets=None, ptx=()):
    """A load_order record as build writes it, for a bundle of the archs of `need`."""
    return order_record(policy_archs, need, targets or {a: a for a in need}, list(ptx))


def _run(op, dtype="float32", k=40, n=3000, det=True):
    x = make_rows(dtype, 3, n, seed=7)
    values, indices = op(x, k, deterministic=det)
    ref_values, ref_indices = reference.topk(x, k)
    np.testing.assert_array_equal(indices, ref_indices)
    np.testing.assert_array_equal(values.view(np.uint32), ref_values.view(np.uint32))


def test_the_gpus_own_cubins_first(built_bundle):
    op = TopK(built_bundle, backend="emulator", gpu_arch="sm_100")
    assert (op.binary.way, op.arch) == ("cubin", "sm_100")
    assert "binary: sm_100 GPU: the bundle's sm_100 cubins" in op.explain("float32", 40, 3000).reason
    _run(op)


def test_a_lower_minor_of_the_same_major_next(built_bundle):
    op = TopK(built_bundle, backend="emulator", gpu_arch="sm_103")  # B300: the bundle has sm_100
    assert (op.binary.way, op.arch) == ("lower-minor cubin", "sm_100")
    answer = op.explain("float32", 40, 3000, deterministic=True)
    assert answer.source == "aot" and answer.kernel.name.endswith("_sm_100")
    assert ("binary: sm_103 GPU: no sm_103 cubin; the sm_100 cubins run on it (same major 10, lower minor; their "
            in answer.reason)
    _run(op)


def test_jit_from_the_bundles_sources_when_no_cubin_runs(built_bundle):
    op = TopK(built_bundle, backend="emulator", gpu_arch="sm_110")  # Thor: major 11, no cubin of it
    assert (op.binary.way, op.arch) == ("jit", "sm_100")
    answer = op.explain("float32", 40, 3000, deterministic=True)
    assert answer.source == "jit"
    assert ("binary: sm_110 GPU: no cubin for it (no PTX in the bundle); JIT from the bundle's sources with NVRTC "
            "for sm_110, with sm_100's tuning, the nearest below it that fits") in answer.reason
    _run(op)


@pytest.mark.parametrize("gpu, why", [
    ("sm_89", "the policy tunes no arch at or below sm_89 that fits it"),   # older than every arch
    ("sm_120", "the policy tunes no arch at or below sm_120 that fits it"),  # 99 KB: the 96 KB rows do not fit
])
def test_refused_naming_the_gpu_the_archs_and_the_fix(built_bundle, gpu, why):
    with pytest.raises(TopKError) as err:
        TopK(built_bundle, backend="emulator", gpu_arch=gpu)
    message = str(err.value)
    assert message.startswith(f"no binary of the bundle serves this GPU ({gpu}): the bundle holds sm_90, sm_100 (")
    assert why in message and "no PTX in the bundle" in message
    assert message.endswith(f"fix: add {gpu} to the policy's archs and `topkgen build --arch {gpu}`, or allow JIT")


def test_jit_off_refuses_what_only_jit_would_serve(built_bundle, monkeypatch):
    monkeypatch.setenv("TOPKGEN_DISABLE_JIT", "1")
    with pytest.raises(TopKError, match=r"\(sm_110\).*JIT is off"):
        TopK(built_bundle, backend="emulator", gpu_arch="sm_110")
    assert TopK(built_bundle, backend="emulator", gpu_arch="sm_103").binary.way == "lower-minor cubin"


def test_a_lower_minor_whose_shared_memory_does_not_fit_is_passed():
    """sm_80 kernels of 96 KB rows (115200 bytes a block) do not run on sm_86 (101376)."""
    with pytest.raises(NoBinaryError, match=r"sm_80 cubins need 115200 bytes of shared memory per block, above "
                                            r"its 101376; no PTX in the bundle"):
        resolve("sm_86", ["sm_80"], _order(["sm_80"], {"sm_80": 115200}), jit=True)
    took = resolve("sm_86", ["sm_80"], _order(["sm_80", "sm_86"], {"sm_80": 115200}), jit=True)
    assert (took.way, took.arch) == ("jit", "sm_86")  # its own tuning, compiled for it
    took = resolve("sm_86", ["sm_80"], _order(["sm_80"], {"sm_80": 82432}), jit=False)
    assert (took.way, took.arch) == ("lower-minor cubin", "sm_80")


def test_gpu_arch_is_for_the_emulator_only(built_bundle):
    with pytest.raises(TopKError, match="gpu_arch: the emulator's stand-in GPU"):
        TopK(built_bundle, backend="emulator", gpu_arch="86")


def test_shipped_ptx_serves_a_gpu_no_cubin_runs_on():
    """sm_110 (Thor, major 11) runs no sm_100 cubin; sm_100's PTX, compiled by the driver, does."""
    need = {"sm_90": 82432, "sm_100": 82432}
    took = resolve("sm_110", ["sm_90", "sm_100"], _order(["sm_90", "sm_100"], need, ptx=["sm_90", "sm_100"]), jit=True)
    assert (took.way, took.arch) == ("ptx", "sm_100")  # the highest capability at most the GPU's
    assert "the sm_100 kernels' PTX (compute_100), compiled for sm_110 by the driver's JIT" in took.words
    with pytest.raises(NoBinaryError, match="no PTX in the bundle for an arch at or below sm_89"):
        resolve("sm_89", ["sm_90", "sm_100"], _order(["sm_90", "sm_100"], need, ptx=["sm_90", "sm_100"]), jit=True)
        # PTX runs forward only: compute_90 not on sm_89
    # a lower minor's cubin still comes before PTX
    took = resolve("sm_103", ["sm_100"], _order(["sm_100"], {"sm_100": 82432}, ptx=["sm_100"]), jit=False)
    assert took.way == "lower-minor cubin"


def test_arch_specific_cubins_serve_exactly_their_arch():
    """sm_100a cubins run on sm_100 only: not on sm_103 (same major, higher minor)."""
    order = _order(["sm_100"], {"sm_100": 82432}, targets={"sm_100": "sm_100a"})
    own = resolve("sm_100", ["sm_100"], order, jit=False)
    assert own.way == "cubin" and "arch-specific sm_100a" in own.words
    with pytest.raises(NoBinaryError, match=r"sm_100 cubins are arch-specific \(sm_100a\): they run on sm_100 only"):
        resolve("sm_103", ["sm_100"], order, jit=False)
    assert resolve("sm_103", ["sm_100"], order, jit=True).way == "jit"
