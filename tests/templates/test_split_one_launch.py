"""A split in one launch (manifest schema 7): stage 1's launch given tickets, the last CTA of
each row to store its chunk's candidates merging them into the output. On the emulator with
its ordering check (every read of another CTA's candidates released and acquired, through
plain loads), against the split's two launches: the same output bit for bit in both modes,
on dense and ragged rows, with int32 indices and unsorted output, whether the merge's
candidates fit shared memory or not; the tickets return to zero, so one zeroed array serves
the next launch; a kernel that cannot split takes no tickets."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from topkgen import policy as pol
from topkgen.build.render import render
from topkgen.manifest.params import output_flags, params
from topkgen.policy.split import ChunkPlan, stages
from topkgen.runtime import arguments

from ..support.topk_cases import PolicyKernels, check_topk, make_rows

POLICY = """
version: 1
name: one_launch
archs:
  sm_90:   # 96 KB of shared memory: a merge of up to 24K float32 candidates is resident
    capability: [9, 0]
    threads: 128
    warps_per_block: 4
    vector_tail: {policy: runtime}
    shared_row_bytes: 98304
    shared_buffer_per_k: 16
    loads_in_flight: 4
    split: {sm_count: 132, ctas_per_sm: 2, rows_below: 80, min_n: 4096, max_chunks: 32, min_chunk: 1024, chunk_per_k: 4,
            one_launch: true}
  sm_100:  # 2 KB: chunks and merges alike read global memory again (the fallback)
    capability: [10, 0]
    threads: 256
    warps_per_block: 4
    vector_tail: {policy: runtime}
    shared_row_bytes: 2048
    split: {sm_count: 148, ctas_per_sm: 2, rows_below: 80, min_n: 4096, max_chunks: 32, min_chunk: 1024, chunk_per_k: 4,
            one_launch: true}
dtypes: {aot: [float32, bfloat16]}
families:
  radix: {template: radix_select.cu.j2, budget: {max_registers: 96, spills: false}}
  register: {template: register_select.cu.j2, budget: {max_registers: 128, spills: false}}
rules:
  - {name: radix_small, family: radix, work: fixed_vec, vector_iterations: 2, k: [64],
     modes: [fast]}
  - {name: radix_dynamic, family: radix, work: dynamic, k: [64, 1024], n: {min: 1, max: 2147483647},
     modes: [fast, deterministic]}
dispatch_order: [radix_small, radix_dynamic]
"""
K = 64
KERNELS = [("sm_90", "float32", "fast"), ("sm_90", "bfloat16", "deterministic"), ("sm_100", "float32", "deterministic")]


KIT = PolicyKernels(POLICY, "one_launch", K, KERNELS)
_policy, _spec, _module = KIT.policy, KIT.spec, KIT.module


def _run(spec, x: np.ndarray, k: int, plan: ChunkPlan, *, one_launch: bool, flags: int = 0, lengths=None,
         workspace=None, seed: int = 1):
    """The split's launches (one, or two) on the emulator: the output and the workspace (a
    fresh zeroed one, or `workspace` as an earlier launch left it)."""
    rows, n = x.shape
    plan = replace(plan, one_launch=one_launch)
    values = np.zeros((rows, k), x.dtype)
    indices = np.zeros((rows, k), np.int32 if flags & output_flags(True, "int32") else np.int64)
    workspace = np.zeros(plan.workspace_bytes, np.uint8) if workspace is None else workspace
    count = rows * plan.candidates
    pointers = {"x": x, "values": values, "indices": indices,
                "tickets": workspace[plan.tickets_offset:plan.workspace_bytes].view(np.uint32),
                "candidate_indices": workspace[:count * 8].view(np.int64),
                "candidate_values": workspace[plan.values_offset:plan.values_offset + count * x.itemsize].view(x.dtype)}
    if lengths is not None:
        pointers["lengths"] = lengths
    launches = stages(rows, n, k, True, plan, flags=flags, window_bytes=4 if lengths is not None else 0,
                      shared=spec.shared)
    assert len(launches) == (1 if one_launch else 2)
    for stage in launches:
        _module().launch(spec.name, stage.grid_rows, spec.threads, arguments(params(spec), stage, pointers, None),
                         shared_bytes=stage.shared_bytes, schedule_seed=seed, check_ordering=one_launch)
    return values, indices, workspace


def _tickets(plan: ChunkPlan, workspace: np.ndarray) -> np.ndarray:
    one = replace(plan, one_launch=True)
    return workspace[one.tickets_offset:one.workspace_bytes].view(np.uint32)


CASES = [  # kernel, rows, n, chunks, flags
    (KERNELS[0], 3, 8192, 8, output_flags(True, "int64")),
    (KERNELS[0], 2, 5000, 4, output_flags(False, "int32")),
    (KERNELS[1], 2, 9000, 8, output_flags(True, "int64")),
    (KERNELS[2], 2, 6000, 4, output_flags(True, "int32")),
]


@pytest.mark.parametrize("kernel, rows, n, chunks, flags", CASES, ids=[f"{c[0][0]}-{c[0][1]}-{c[0][2]}-n{c[2]}-c{c[3]}"
                                                                       for c in CASES])
def test_one_launch_returns_the_two_launches_output(kernel, rows, n, chunks, flags):
    """Under three block orders (the last CTA of a row differs), with ties across chunks: the
    one launch's output is the two launches' (deterministic: bit for bit; fast: the same
    values) and the reference's; the tickets are zero after it, and the third launch runs on
    the second's workspace as it was left (the merge fits shared memory on sm_90, not in
    sm_100's 2 KB)."""
    spec = _spec(*kernel)
    assert spec.merges and [p["name"] for p in params(spec)][-4:] == ["tickets", "merged_values", "merged_indices",
                                                                        "merged_flags"]
    x = make_rows(spec.dtype, rows, n, seed=n + chunks)
    x[:, 1::97] = x[0, 0]  # the same value in every chunk: ties the merge takes by index
    plan = ChunkPlan(rows, n, K, chunks, x.itemsize)
    deterministic = spec.mode == "deterministic"
    two = _run(spec, x, K, plan, one_launch=False, flags=flags)
    for seed in (1, 2, 3):  # the third launch on the second's workspace, its tickets not zeroed again
        one = _run(spec, x, K, plan, one_launch=True, flags=flags, seed=seed, workspace=None if seed < 3 else one[2])
        assert not _tickets(plan, one[2]).any(), "the tickets are not back to zero"
        if deterministic:  # bit for bit
            assert one[0].tobytes() == two[0].tobytes() and one[1].tobytes() == two[1].tobytes(), (spec.name, seed)
        else:  # fast mode takes any of the tied keys: the same values
            assert np.sort(one[0], axis=1).tobytes() == np.sort(two[0], axis=1).tobytes(), (spec.name, seed)
        if not flags & output_flags(False, "int64"):  # sorted: the reference's keys in order
            check_topk(x, one[0], one[1].astype(np.int64), K, True, deterministic, spec.dtype,
                       what=f"{spec.name} n={n} seed={seed}")


def test_ragged_windows_merge_in_one_launch():
    """Row windows shorter than a chunk, ending inside one, and empty: chunks past a window
    store nothing, and the merge finds the window's candidates as stage 2 does (split_n); a
    window shorter than k is padded."""
    spec = _spec(*KERNELS[1])
    rows, n, chunks = 4, 9000, 8
    x = make_rows(spec.dtype, rows, n, seed=5)
    lengths = np.array([n, 5000, 40, 0], np.int32)
    plan = ChunkPlan(rows, n, K, chunks, x.itemsize)
    two = _run(spec, x, K, plan, one_launch=False, lengths=lengths)
    one = _run(spec, x, K, plan, one_launch=True, lengths=lengths)
    assert one[0].tobytes() == two[0].tobytes() and one[1].tobytes() == two[1].tobytes()
    assert (one[1][2, 40:] == -1).all() and (one[1][3] == -1).all() and not _tickets(plan, one[2]).any()


def test_a_kernel_that_cannot_split_takes_no_tickets():
    """The merge is compiled where the arch's split section asks for one launch and splits rows
    the kernel serves (KernelSpec.merges): radix_small's rows stop at 1024, below the split's
    min_n, so it takes no tickets and its source has no merge; nor does the large-k path.
    Without one_launch (the default policy's false, or no key) no kernel merges."""
    small = pol.select(_policy(), "sm_90", "float32", K, 1000).kernel
    assert small.rule == "radix_small" and not small.merges
    assert "tickets" not in [p["name"] for p in params(small)] and f"{small.name}_merge(" not in render(small)
    large = pol.select(pol.load(), "sm_90", "float32", 5000, 100_000).kernel
    assert large.work == "large" and not large.merges and "tickets" not in [p["name"] for p in params(large)]
    dynamic = _spec("sm_90", "float32", "fast")
    assert dynamic.merges and f"{dynamic.name}_merge(" in render(dynamic)
    unset = pol.loads(POLICY.replace(",\n            one_launch: true}", "}"), source="two_launches")
    default = pol.load()
    assert all(policy.archs[arch].split is not None for policy in (unset, default) for arch in ("sm_90", "sm_100"))
    for policy in (unset, default):
        specs = [spec for arch in ("sm_90", "sm_100") for spec in pol.all_kernels(policy, arch)]
        assert specs and not any(spec.merges or "tickets" in [p["name"] for p in params(spec)] for spec in specs)
    spec = pol.select(unset, "sm_90", "float32", K, 100_000).kernel
    assert spec.name == dynamic.name and f"{spec.name}_merge(" not in render(spec)
    plan = pol.select(unset, "sm_90", "float32", K, 100_000, rows=2).split
    assert plan is not None and not plan.one_launch and plan.workspace_bytes < replace(plan, one_launch=True).workspace_bytes
