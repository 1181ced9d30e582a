"""Every kernel the policies can dispatch, executed on the CPU emulator against the
reference: each kernel of the default and legacy plans on both archs, each JIT-only tier,
and the float16 (JIT) kernels, for each dtype they serve. n at and around every rung,
window and vector boundary; k = 1, middle, rung and n; rows 1 and several; largest and
smallest; NaN, infinities, signed zeros, subnormals, all-equal rows, heavy ties; two
schedule seeds per case."""

from __future__ import annotations

import threading
from functools import lru_cache

import numpy as np
import pytest

from topkgen import policy as pol
from topkgen.emulator import compile_source
from topkgen.build.render import render

from ..conftest import DEFAULT_POLICY, LEGACY_POLICY
from ..support.topk_cases import PATTERNS, check_topk, launch_kernel, make_rows

SEEDS = (1, 2)
N_CAP_VECTORS = 3  # dynamic kernels are tested up to ~3 full tiles of vectors


@lru_cache(maxsize=None)
def _policy(path: str) -> pol.Policy:
    return pol.load(path)


def _groups() -> dict[str, list[pol.KernelSpec]]:
    """Kernels grouped into host translation units: one per policy, arch and family. A name
    is an identity (it encodes every parameter), so a kernel both policies declare runs once."""
    groups: dict[str, list[pol.KernelSpec]] = {}
    seen: set[str] = set()
    for label, path in (("default", DEFAULT_POLICY), ("legacy", LEGACY_POLICY)):
        policy = _policy(str(path))
        for arch in policy.archs:
            for rule in policy.rules:
                for dtype in policy.dtypes:
                    for spec in pol.kernels_of_rule(policy, rule, arch, dtype):
                        if spec.name not in seen:
                            seen.add(spec.name)
                            groups.setdefault(f"{label}_{arch}_{spec.family}", []).append(spec)
    return groups


GROUPS = _groups()
KERNELS = [(group, spec) for group, specs in GROUPS.items() for spec in specs]
_lock = threading.Lock()


def _module(group: str, spec: pol.KernelSpec):
    """The default policy's kernels one by one, as the runtime compiles them (the emulator
    cache then serves both, and pytest-xdist workers share the compiles out); the legacy
    grid's, which nothing else runs, a translation unit per arch and family (one parse of
    the header for 48 kernels)."""
    if group.startswith("default_"):
        return compile_source(render(spec), name=spec.name)
    return _group_module(group)


@lru_cache(maxsize=None)
def _group_module(group: str):
    return compile_source("".join(render(s) for s in GROUPS[group]), name=f"kernels_{group}")


def test_every_planned_kernel_is_covered():
    names = {spec.name for _, spec in KERNELS}
    for path in (DEFAULT_POLICY, LEGACY_POLICY):
        policy = _policy(str(path))
        for arch in policy.archs:
            assert {s.name for s in pol.plan(policy, arch)} <= names
            assert {s.name for s in pol.jit_kernels(policy, arch)} <= names
    assert len(names) == len(KERNELS)


def _n_values(spec: pol.KernelSpec) -> list[int]:
    if spec.work == "exact":
        return [spec.exact_n]
    v, t = spec.vector_width, spec.threads
    hi = spec.n_max if spec.work != "dynamic" else min(spec.n_max, N_CAP_VECTORS * t * v + 5)
    candidates = {spec.k_min, spec.k_min + 1, v - 1, v, v + 1, spec.k, spec.k + 1, 2 * spec.k + v + 1,
                  t * v - 1, t * v, t * v + 1, hi - v - 1, hi - 1, hi}
    for rung in spec.ladder:
        candidates |= {rung - 1, rung, rung + 1}
    ns = sorted(n for n in candidates if spec.k_min <= n <= hi)
    if len(ns) > 7:  # keep both ends and an even spread between them
        picks = np.linspace(0, len(ns) - 1, 7).round().astype(int)
        ns = [ns[i] for i in sorted(set(picks.tolist()))]
    return ns


def _k_values(spec: pol.KernelSpec, n: int) -> list[int]:
    top = min(spec.k, n)
    return sorted({k for k in (spec.k_min, (spec.k_min + top) // 2, top) if spec.k_min <= k <= top} |
                  ({1} if spec.k_min == 1 else set()))


@pytest.mark.parametrize("group,spec", KERNELS, ids=[spec.name for _, spec in KERNELS])
def test_kernel_matches_reference(group, spec):
    with _lock:
        module = _module(group, spec)
    case = 0
    for n in _n_values(spec):
        for k in _k_values(spec, n):
            rows = 1 if case % 5 == 4 else len(PATTERNS)
            largest = case % 2 == 0
            x = make_rows(spec.dtype, rows, n, seed=case + n)
            if rows == 1:
                x[0] = make_rows(spec.dtype, 4, n, seed=case)[3]  # the specials row alone
            results = []
            for seed in SEEDS:
                values, indices, _ = launch_kernel(module, spec, x, k, largest, schedule_seed=seed, workers=1)
                check_topk(x, values, indices, k, largest, spec.mode == "deterministic", spec.dtype,
                           what=f"{spec.name} n={n} k={k} rows={rows} largest={largest} seed={seed}")
                results.append((values.tobytes(), indices.tobytes()))
            if spec.mode == "deterministic":
                assert results[0] == results[1], f"{spec.name}: not bit-exact run to run"
            case += 1
    assert case >= 1
