"""The split plan follows the GPU's own SM count (issue 32): the default policy's sm_90 split
assumes H200's 132 SMs, so an H100 PCIe (114) or an H20 (78) got H200's chunk counts. TopK
plans for the GPU's count (sm_count=, the cuda backend's default), with the same kernels, and
`explain --sm-count N` shows the plan for another part."""

from __future__ import annotations

import numpy as np
import pytest

from topkgen import policy as pol
from topkgen.runtime import TopK, TopKError
from topkgen.runtime.reference import topk


@pytest.mark.parametrize("sm_count, chunks", [(None, 32), (132, 32), (114, 16), (78, 16), (20, 8)])
def test_the_plan_fills_the_gpu_it_is_given(built_bundle, default_policy, sm_count, chunks):
    op = TopK(built_bundle, arch="sm_90", backend="emulator", sm_count=sm_count)
    assert op.sm_count == (132 if sm_count is None else sm_count)
    plan = op.plan("float32", 256, 131072, 8)
    assert plan.chunks == chunks
    # the same as select with that SM count, and the same kernel whatever the count
    expect = pol.select(default_policy.with_sm_count("sm_90", op.sm_count), "sm_90", "float32", 256, 131072, rows=8)
    assert (op.choose("float32", 256, 131072, rows=8).kernel, plan.chunks) == (expect.kernel.name, expect.chunks)
    assert op.explain("float32", 256, 131072, rows=8).selection.chunks == chunks


def test_results_are_the_same_in_fewer_chunks(built_bundle):
    x = np.random.default_rng(5).standard_normal((8, 131072)).astype(np.float32)
    h20 = TopK(built_bundle, arch="sm_90", backend="emulator", sm_count=78)
    values, indices = h20(x, 16, deterministic=True)
    expect = topk(x, 16)
    assert np.array_equal(values, expect[0]) and np.array_equal(indices, expect[1])


@pytest.mark.parametrize("bad", [0, -3, 1025, True, 2.5])
def test_a_bad_sm_count_is_refused_by_name(built_bundle, bad):
    with pytest.raises(TopKError, match=r"^sm_count: "):
        TopK(built_bundle, arch="sm_90", backend="emulator", sm_count=bad)
