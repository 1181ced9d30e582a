"""The radix kernels' final sort (register_sort in templates/topk_common.cuh) for every K
rung of the default policy's radix rules that sorts more than a warp's 64 candidates: k
below, at and between powers of two (from 1 to the rung, so a short sort of padding and the
full width), both dtypes, both directions, fast and deterministic kernels, on rows with ties,
NaNs of both signs, infinities, signed zeros and all-equal keys. The order is the reference
sort's (topkgen.runtime.reference): deterministic kernels bit-exact, fast ones with the
same keys in the same order."""

from __future__ import annotations

from functools import lru_cache

import pytest

from topkgen import policy as pol
from topkgen.build.render import render
from topkgen.emulator import compile_source

from ..support.topk_cases import PATTERNS, check_topk, launch_kernel, make_rows

WARP_SORTED = 64  # rungs up to 64 candidates take warp_sort, a warp's shuffles alone
KS = (1, 31, 33, 100, 128, 255, 256, 700, 1024, 2047, 3000)  # below, at and between powers of two


@lru_cache(maxsize=None)
def _policy() -> pol.Policy:
    return pol.load()


def _rungs() -> list[int]:
    return sorted({k for rule in _policy().rules if rule.family == "radix" for k in rule.k_rungs if k > WARP_SORTED})


def _spec(dtype: str, rung: int, deterministic: bool) -> pol.KernelSpec:
    """The radix_dynamic kernel of the rung (selected for long rows, launched on short ones)."""
    spec = pol.select(_policy(), "sm_90", dtype, rung, 1 << 20, rows=1024, deterministic=deterministic).kernel
    assert spec.k == rung and spec.family == "radix" and spec.mode == ("deterministic" if deterministic else "fast")
    return spec
    return spec


SPECS = [(dtype, rung, det) for rung in _rungs() for dtype in ("float32", "bfloat16") for det in (False, True)]


@lru_cache(maxsize=None)
def _module():
    return compile_source("".join(render(_spec(*s)) for s in SPECS), name="final_sort")


def _ks(rung: int) -> list[int]:
    return sorted({k for k in KS if k <= rung} | {rung // 2 + 1, rung - 1, rung})


@pytest.mark.parametrize("dtype,rung,deterministic", SPECS,
                         ids=[f"{d}-k{r}-{'det' if m else 'fast'}" for d, r, m in SPECS])
def test_sorted_like_the_reference(dtype, rung, deterministic):
    spec = _spec(dtype, rung, deterministic)
    x = make_rows(dtype, 2 * len(PATTERNS), rung + 37, seed=rung)
    for k in _ks(rung):
        for largest in (True, False):
            values, indices, _ = launch_kernel(_module(), spec, x, k, largest)
            check_topk(x, values, indices, k, largest, deterministic, dtype,
                       what=f"{spec.name} k={k} largest={largest}")
