"""Radix kernels at the tightest register cap a policy sets build with no spill (build refuses
any spill, so a spill makes a user's policy unbuildable): K=1024 of 1024 threads at 2 CTAs per
SM (32 registers a thread) with no dynamic shared memory, where every pass and the gather
read the row in global memory and the gather appends each lane's candidates of both kinds
(issue 28 made that kernel spill 16 bytes in fast mode). Fast and deterministic, every dtype.
Real NVRTC, through the compile cache."""

from __future__ import annotations

import pytest
import yaml

from topkgen import policy as pol
from topkgen.build.compile import compile_kernel
from topkgen.build.render import render
from topkgen.policy.model import MAX_THREADS_PER_BLOCK

from ..support.tiny import TINY_POLICY

REGISTERS_PER_SM = 65536  # sm_90's register file: the cap is this over threads x CTAs per SM


def _no_shared_row_policy() -> pol.Policy:
    """The tiny policy (K=1024 at 2 CTAs per SM on sm_90) with no shared row, both modes
    built, every dtype."""
    doc = yaml.safe_load(TINY_POLICY)
    doc["archs"]["sm_90"].pop("shared_row_bytes", None)
    doc["rules"][0]["modes"] = ["fast", "deterministic"]
    doc["dtypes"] = {"aot": ["float32", "bfloat16"], "jit": ["float16"]}
    return pol.loads(yaml.safe_dump(doc), source="no_shared_row")


def _tightest() -> list[pol.KernelSpec]:
    policy = _no_shared_row_policy()
    specs = [s for s in pol.all_kernels(policy, "sm_90") if s.work != "large"]
    cap = min(REGISTERS_PER_SM // (s.threads * s.min_ctas_per_sm) for s in specs)
    return [s for s in specs if REGISTERS_PER_SM // (s.threads * s.min_ctas_per_sm) == cap]


@pytest.mark.parametrize("spec", _tightest(), ids=lambda s: s.name)
def test_a_kernel_at_32_registers_with_no_shared_row_builds_with_no_spill(spec):
    assert spec.dynamic_shared_bytes == 0 and spec.min_ctas_per_sm > 1, spec  # the combination
    resources = compile_kernel(render(spec), spec.name, spec.arch).resources
    cap = REGISTERS_PER_SM // (spec.threads * spec.min_ctas_per_sm)
    assert resources.registers <= cap, (spec.name, resources)
    assert (resources.spill_stores, resources.spill_loads, resources.stack_bytes) == (0, 0, 0), (spec.name, resources)


def test_the_tightest_kernels_are_those_of_the_largest_block_in_both_modes_and_every_dtype():
    specs = _tightest()
    assert {s.threads for s in specs} == {MAX_THREADS_PER_BLOCK}
    assert {(s.mode, s.dtype) for s in specs} == {(m, d) for m in ("fast", "deterministic")
                                                  for d in ("float32", "bfloat16", "float16")}
