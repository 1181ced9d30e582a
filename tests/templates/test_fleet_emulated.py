"""A sample of policies/fleet.yaml's kernels, every arch, run on the CPU emulator against
the reference: per arch one radix_dynamic kernel (the one that reads the arch's own
shared_row_bytes: rows at and just past what it holds in shared memory) and one other kernel
of the arch's plan. The sample rotates with a seed: TOPKGEN_FLEET_SEED, else CI's
GITHUB_RUN_NUMBER, else 0; the test ids name the seed, so a failure is rerun with
`TOPKGEN_FLEET_SEED=S pytest tests/templates/test_fleet_emulated.py`. The whole fleet is
319 kernels (test_kernels_emulated runs its sm_90 and sm_100 kernels, which are the default
policy's, every one); the sample keeps this file to about a minute."""

from __future__ import annotations

import os
import random
from functools import lru_cache

import pytest

from topkgen import policy as pol
from topkgen.build.render import render
from topkgen.emulator import compile_source
from topkgen.policy.selection import resident_elements

from ..conftest import ROOT
from ..support.topk_cases import PATTERNS, check_topk, launch_kernel, make_rows

FLEET_POLICY = ROOT / "policies" / "fleet.yaml"
SEED = int(os.environ.get("TOPKGEN_FLEET_SEED") or os.environ.get("GITHUB_RUN_NUMBER") or 0)


@lru_cache(maxsize=None)
def _fleet() -> pol.Policy:
    return pol.load(FLEET_POLICY)


def sample(policy: pol.Policy, seed: int) -> list[pol.KernelSpec]:
    """Two AOT kernels per arch, drawn by `seed`: a radix_dynamic one and any other."""
    picked = []
    for arch in policy.archs:
        rng = random.Random(f"{seed}:{arch}")
        kernels = pol.plan(policy, arch)
        dynamic = [s for s in kernels if s.rule == "radix_dynamic"]
        first = rng.choice(dynamic)
        picked += [first, rng.choice([s for s in kernels if s is not first])]
    return picked


SAMPLE = sample(_fleet(), SEED)


@lru_cache(maxsize=None)
def _module():
    return compile_source("".join(render(spec) for spec in SAMPLE), name=f"fleet_sample_{SEED}")


def _shapes(spec: pol.KernelSpec) -> list[tuple[int, int]]:
    """(n, k) pairs: the window's ends and, for a kernel with a row copy, the longest row it
    reads once and the next (which takes the candidates path)."""
    v = spec.vector_width
    if spec.work == "dynamic":
        resident = resident_elements(spec)
        ns = [spec.k + v + 1, resident, resident + 1] if resident else [spec.k + v + 1, 3 * spec.threads * v + 5]
    else:
        ns = [max(spec.k_min, spec.n_max // 2 + 1), spec.n_max]
    return [(n, k) for n in ns for k in sorted({spec.k_min, min(spec.k, n)})]


def test_sample_covers_every_arch():
    fleet = _fleet()
    assert [s.arch for s in SAMPLE] == [a for a in fleet.archs for _ in range(2)]
    assert all(s.aot for s in SAMPLE)
    assert len({s.name for s in SAMPLE}) == len(SAMPLE)
    assert sample(fleet, SEED + 1) != SAMPLE or len(fleet.archs) == 0  # the seed rotates it


@pytest.mark.parametrize("spec", SAMPLE, ids=[f"seed{SEED}-{s.name}" for s in SAMPLE])
def test_fleet_kernel_matches_reference(spec):
    module = _module()
    for case, (n, k) in enumerate(_shapes(spec)):
        largest = case % 2 == 0
        x = make_rows(spec.dtype, len(PATTERNS), n, seed=SEED + case)
        values, indices, _ = launch_kernel(module, spec, x, k, largest, schedule_seed=SEED + 1, workers=1)
        check_topk(x, values, indices, k, largest, spec.mode == "deterministic", spec.dtype,
                   what=f"{spec.name} n={n} k={k} largest={largest} seed={SEED}")
