"""The radix kernels' three ways through a row, told apart by the emulator's traffic counters:
a row that fits in dynamic shared memory is read once; a longer row is read once more to
collect its candidates there; when the candidates never fit, every pass reads the row (the
fallback). A small policy (a few hundred bytes of shared memory) reaches all of them with
short rows, on block sizes of 128, 512 and 1024 threads and with 0 to 4 loads in flight.
Every case is checked against the reference; deterministic kernels bit-exact under two
schedules."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from topkgen.runtime import reference
from topkgen.manifest.params import params
from topkgen.policy.split import ChunkPlan, stages
from topkgen.runtime import arguments

from ..support.topk_cases import PolicyKernels, PATTERNS, check_topk, launch_kernel, make_rows

POLICY = """
version: 1
name: radix_paths
archs:
  sm_90:   # 1 KB of shared memory: fp32 rows of up to 253 keys fit, 128 candidates
    capability: [9, 0]
    threads: 128
    warps_per_block: 4
    vector_tail: {policy: fixed, max_iterations: 2}
    shared_row_bytes: 1024
    loads_in_flight: 4
  sm_100:  # no shared memory: the fallback only
    capability: [10, 0]
    threads: 512
    warps_per_block: 4
    vector_tail: {policy: runtime}
    shared_row_bytes: 0
  sm_80:   # 4 KB of shared memory, 1024 threads; a resident row gets 4 candidates per K of buffer
    capability: [8, 0]
    threads: 1024
    warps_per_block: 4
    vector_tail: {policy: runtime}
    shared_row_bytes: 4096
    shared_buffer_per_k: 4
    loads_in_flight: 2
dtypes: {aot: [float32, bfloat16]}
families:
  radix: {template: radix_select.cu.j2, budget: {max_registers: 96, spills: false}}
rules:
  - {name: radix_dynamic, family: radix, work: dynamic, k: [64, 1024], n: {min: 1, max: 2147483647},
     modes: [fast, deterministic]}
dispatch_order: [radix_dynamic]
"""
KERNELS = [("sm_90", "float32", "fast"), ("sm_90", "float32", "deterministic"), ("sm_90", "bfloat16", "fast"),
           ("sm_90", "bfloat16", "deterministic"), ("sm_100", "float32", "deterministic"),
           ("sm_80", "float32", "fast"), ("sm_80", "bfloat16", "deterministic")]
K = 64
NP_TYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


KIT = PolicyKernels(POLICY, "radix_paths", K, KERNELS)
_spec, _module = KIT.spec, KIT.module


def _run(kernel: tuple[str, str, str], x: np.ndarray, k: int = K, largest: bool = True, shared_bytes: int | None = None,
         seeds: tuple[int, ...] = (1, 2)):
    """Runs one kernel under two schedules (`seeds`); checks the result; returns the counters.
    `shared_bytes`: the launch's dynamic shared memory and the kernel's argument (default: the
    rule's, split.SharedMemory)."""
    spec = _spec(*kernel)
    n = x.shape[1]
    results, counts = [], []
    for seed in seeds:
        values, indices, counters = launch_kernel(_module(), spec, x, k, largest, schedule_seed=seed, workers=1,
                                                  counters=True, shared_bytes=shared_bytes)
        counts.append(counters)
        check_topk(x, values, indices, k, largest, spec.mode == "deterministic", spec.dtype,
                   what=f"{spec.name} n={n} k={k} largest={largest} seed={seed} shared_bytes={shared_bytes}")
        results.append((values.tobytes(), indices.tobytes()))
    if spec.mode == "deterministic" and len(results) > 1:
        assert results[0] == results[1], f"{spec.name}: not bit-exact run to run"
    return counts[0]


def _reads(counters, x: np.ndarray) -> float:
    """Global bytes loaded per input byte."""
    return counters.global_load_bytes / x.nbytes


def _normal(dtype: str, rows: int, n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, n)).astype(NP_TYPES[dtype])


def _near_equal(rows: int, n: int) -> np.ndarray:
    """float32 keys that share their top 22 bits: the k-th key's bucket holds the whole row
    until the last pass, so candidates never fit (distinct values, no early exit)."""
    bits = np.uint32(0x3F800000) + np.arange(n, dtype=np.uint32) % 1024
    return np.stack([np.random.default_rng(r).permutation(bits) for r in range(rows)]).view(np.float32)


def _masked(dtype: str, rows: int, n: int, finite: int) -> np.ndarray:
    """-inf everywhere but `finite` random places per row."""
    rng = np.random.default_rng(finite)
    x = np.full((rows, n), -np.inf, np.float32)
    for r in range(rows):
        x[r, rng.choice(n, finite, replace=False)] = rng.standard_normal(finite)
    return x.astype(NP_TYPES[dtype])


# ----------------------------------------------------------------------------- the three ways

@pytest.mark.parametrize("dtype,fits", [("float32", 253), ("bfloat16", 505)])
@pytest.mark.parametrize("mode", ["fast", "deterministic"])
def test_rows_that_fit_are_read_once(dtype, fits, mode):
    """1 KB holds a row of `fits` keys (its copy keeps 16-byte alignment: V - 1 keys of room);
    NaN payloads of both signs, +-0, infinities, ties, all-equal rows: one read, and one
    element more for each NaN output (the copy holds keys; every NaN shares one key, so its
    payload is read from the row)."""
    for n in (K, fits - 1, fits):
        x = make_rows(dtype, len(PATTERNS), n, seed=n)
        for largest in (True, False):
            nan_outputs = int(np.isnan(reference.topk(x, K, largest=largest)[0].astype(np.float32)).sum())
            assert _reads(_run(("sm_90", dtype, mode), x, largest=largest), x) == 1.0 + nan_outputs / x.size, n


@pytest.mark.parametrize("dtype,fits", [("float32", 253), ("bfloat16", 505)])
def test_rows_just_over_the_threshold_collect_candidates(dtype, fits):
    for n in (fits + 1, fits + 2, 3001):
        x = _normal(dtype, 3, n, seed=n)
        c = _run(("sm_90", dtype, "fast"), x, k=16)
        assert _reads(c, x) == 2.0, n  # the first pass, then the pass that collects
        if dtype == "float32":  # 3 passes: the last ones and the gather read the candidates
            assert c.phases["histogram, later passes"].global_load_bytes == x.nbytes, n
            assert _gather_reads(c) == 0, n


def test_candidates_that_never_fit_fall_back_to_the_row():
    x = _near_equal(2, 3000)
    for kernel in (("sm_90", "float32", "fast"), ("sm_90", "float32", "deterministic")):
        assert _reads(_run(kernel, x), x) == 4.0  # three passes and the gather read the row


def test_without_shared_memory_every_pass_reads_the_row():
    x = _normal("float32", 2, 3000)
    assert _reads(_run(("sm_100", "float32", "deterministic"), x), x) >= 3.0
    x = make_rows("float32", len(PATTERNS), 2999, seed=3)
    _run(("sm_100", "float32", "deterministic"), x)


def _tie_runs(dtype: str, rows: int, n: int, k: int, taken: int, ties: int, seed: int) -> np.ndarray:
    """Normal rows whose key at rank k - taken is given to `ties` places below the top
    k - taken, half of them adjacent (so that the ties the k-th key cuts also share the top
    digits of their indices), the rest scattered: `taken` of them are in the top k."""
    x = _normal(dtype, rows, n, seed=seed)
    rng = np.random.default_rng(seed)
    for r in range(rows):
        order = np.argsort(-x[r].astype(np.float32), kind="stable")
        free = np.setdiff1d(np.arange(n), order[:k - taken])  # sorted
        start = int(rng.integers(0, len(free) - ties // 2))
        run = free[start:start + ties // 2]
        rest = rng.choice(np.setdiff1d(free, run), ties - ties // 2, replace=False)
        x[r, np.concatenate([run, rest])] = x[r, order[k - taken]]
    return x


def _run_split(kernel: tuple[str, str, str], x: np.ndarray, k: int, chunks: int):
    """The two stages of a split request (topkgen.policy.split) on the emulator, under two
    schedules: the result is the unsplit reference's, bit for bit (stage 2's ties by
    position are the row's by index). Returns each stage's counters."""
    spec = _spec(*kernel)
    rows, n = x.shape
    plan = ChunkPlan(rows, n, k, chunks, x.dtype.itemsize)
    results = []
    for seed in (1, 2):
        values, indices = np.zeros((rows, k), x.dtype), np.zeros((rows, k), np.int64)
        workspace = np.zeros(plan.workspace_bytes, np.uint8)
        count = rows * plan.candidates
        pointers = {"x": x, "values": values, "indices": indices,
                    "candidate_indices": workspace[:count * 8].view(np.int64),
                    "candidate_values": workspace[plan.values_offset:plan.values_offset + count * x.dtype.itemsize]
                    .view(x.dtype)}
        counts = [_module().launch(spec.name, stage.grid_rows, spec.threads,
                                   arguments(params(spec), stage, pointers, None), shared_bytes=stage.shared_bytes,
                                   schedule_seed=seed, workers=1, counters=True)
                  for stage in stages(rows, n, k, True, plan, shared=spec.shared)]
        check_topk(x, values, indices, k, True, True, spec.dtype, what=f"{spec.name} split {chunks} n={n} seed={seed}")
        results.append((values.tobytes(), indices.tobytes()))
    assert results[0] == results[1], f"{spec.name}: split not bit-exact run to run"
    return counts


def _gather_reads(counters) -> int:
    """Global bytes the gather loaded, from the candidate buffer's branch or another."""
    return sum(p.global_load_bytes for label, p in counters.phases.items() if label.startswith("gather"))


def _takes_ties_from_the_buffer(counters) -> bool:
    """The gather read the candidate buffer alone: its branch ran (the kernel labels that
    branch's counts), and no part of the gather read global memory."""
    return "gather, from the candidates" in counters.phases and _gather_reads(counters) == 0


def test_fast_mode_takes_split_ties_from_the_candidates():
    x = _tie_runs("float32", 2, 3000, K, 4, 10, seed=4)
    assert _takes_ties_from_the_buffer(_run(("sm_90", "float32", "fast"), x))


@pytest.mark.parametrize("kernel,n,k,taken,ties", [
    (("sm_90", "float32", "deterministic"), 3000, K, 4, 10),   # 128 candidates fit
    (("sm_90", "float32", "deterministic"), 5000, 16, 7, 60),  # 13 index bits: two digits
    (("sm_90", "bfloat16", "deterministic"), 4000, 16, 5, 40),
    (("sm_80", "bfloat16", "deterministic"), 3000, K, 31, 301),  # 1024 threads, 512 candidates
])
def test_deterministic_ties_split_by_index_come_from_the_buffer(kernel, n, k, taken, ties):
    """Ties at the k-th key of which only some are taken, on rows longer than shared memory
    whose candidates fit the buffer: deterministic mode selects the lowest indices among the
    buffer's ties, and its gather reads nothing from the row (it read it once more in order)."""
    x = _tie_runs(kernel[1], 3, n, k, taken, ties, seed=n + ties)
    assert _takes_ties_from_the_buffer(_run(kernel, x, k=k))
    assert _takes_ties_from_the_buffer(_run(kernel, -x, k=k, largest=False))


@pytest.mark.parametrize("kernel,n,k,taken,ties", [
    (("sm_90", "float32", "deterministic"), 100, 16, 9, 31),  # its candidates fit past its copy
    (("sm_90", "bfloat16", "deterministic"), 250, 8, 3, 21),
    (("sm_80", "bfloat16", "deterministic"), 600, K, 21, 101),
])
def test_resident_rows_take_split_ties_from_the_buffer(kernel, n, k, taken, ties):
    """A row resident in shared memory whose candidates fit past its copy: the ties come from
    the buffer too, not from an ordered scan of the copy."""
    x = _tie_runs(kernel[1], 3, n, k, taken, ties, seed=n + k)
    counters = _run(kernel, x, k=k)
    assert _reads(counters, x) == 1.0
    assert _takes_ties_from_the_buffer(counters)


@pytest.mark.parametrize("kernel,n,k,taken,ties,chunks", [
    (("sm_90", "float32", "deterministic"), 400, 16, 9, 31, 4),   # resident chunks, a resident merge
    (("sm_90", "float32", "deterministic"), 3000, K, 21, 41, 4),  # long chunks, a long merge
    (("sm_80", "bfloat16", "deterministic"), 6000, K, 31, 151, 3),
])
def test_split_rows_take_split_ties_from_the_buffer_as_the_unsplit_kernel(kernel, n, k, taken, ties, chunks):
    """Split rows (stage 1 over chunks, stage 2 over their candidates) with ties at the k-th
    key that both stages cut: the unsplit reference's result, bit for bit; stage 2 selects its
    ties by position from the buffer."""
    x = _tie_runs(kernel[1], 2, n, k, taken, ties, seed=chunks + ties)
    _, merge = _run_split(kernel, x, k, chunks)
    assert _takes_ties_from_the_buffer(merge)


def test_ties_that_never_fit_the_buffer_are_read_in_order():
    """The fallback: more ties at the k-th key than the buffer holds, so deterministic mode's
    gather reads the row once more, in order, and ranks them with a scan (no ballots)."""
    x = _tie_runs("float32", 2, 3000, K, 10, 300, seed=7)
    counters = _run(("sm_90", "float32", "deterministic"), x)
    gather = counters.phases["gather"]
    assert gather.global_load_bytes == x.nbytes and gather.votes == 0
    assert not _takes_ties_from_the_buffer(counters)


# ----------------------------------------------------------------------------- degenerate rows

@pytest.mark.parametrize("kernel", KERNELS, ids=["-".join(k) for k in KERNELS])
def test_all_equal_and_masked_rows(kernel):
    """All-equal rows: deterministic mode's first pass finds the single key, and the gather
    reads the row again; fast mode's first pass keeps no span, so a row it reads from global
    memory learns it is one key in the second pass. Rows of -inf with fewer finite values than
    k: the second pass finds -inf alone in its bucket. With more finite values than k: their
    bucket is collected."""
    n = 3001
    same = np.full((2, n), 0.75, NP_TYPES[kernel[1]])
    few = _masked(kernel[1], 2, n, finite=20)
    many = _masked(kernel[1], 2, n, finite=300)
    reads = tuple(_reads(_run(kernel, x), x) for x in (same, few, many))
    same_reads = 2.0 if kernel[2] == "deterministic" else 3.0
    if _spec(*kernel).dynamic_shared_bytes == 0:
        assert reads[:2] == (same_reads, 3.0) and reads[2] <= 4.0
    else:  # deterministic mode reads the row once more when ties at the k-th key are split
        assert reads[:2] == (same_reads, 3.0) and reads[2] in ((2.0,) if kernel[2] == "fast" else (2.0, 3.0))


@pytest.mark.parametrize("kernel", [k for k in KERNELS if k[0] == "sm_90"], ids=lambda k: "-".join(k))
def test_a_resident_row_of_one_key_takes_one_histogram(kernel):
    """A resident row whose keys are all one value is found to be one key after the first
    pass, in both modes (fast mode asks the copy where one bin holds every key): the shared
    atomics are that pass's histogram and the gather's appends, not a second histogram. A row
    of two values in one bin (the top digit alike) takes the later passes, and is right."""
    n = 200  # resident: the sm_90 rule's 1 KB holds 253 float32 keys
    spec = _spec(*kernel)
    assert n <= spec.dynamic_shared_bytes // np.dtype(NP_TYPES[kernel[1]]).itemsize - (spec.vector_width - 1)
    same = np.full((2, n), 0.75, NP_TYPES[kernel[1]])
    counters = _run(kernel, same)
    assert _reads(counters, same) == 1.0
    assert n * 2 <= counters.shared_atomics < 2 * n * 2, counters.shared_atomics
    near = same.copy()
    near[:, 7] = np.array(0.78125, NP_TYPES[kernel[1]])  # 0.75 + 2^-5: the same top 11 bits
    counters = _run(kernel, near, k=K)
    assert counters.shared_atomics >= 2 * n * 2, counters.shared_atomics


def _top_ties(n: int, top: int, below: int, odd: int = 0) -> np.ndarray:
    """float32 rows of n keys: `top` copies of 3.75, `below` of 3.5 (the same first digit, so
    one bucket collects both) and the rest normal under 3; `odd` of the 3.75s become the next
    float up, which differs from 3.75 in the last digit alone."""
    x = np.clip(_normal("float32", 2, n, seed=n), -3.0, 3.0)
    x[:, :top] = 3.75
    x[:, top:top + below] = 3.5
    x[:, :odd] = np.nextafter(np.float32(3.75), np.float32(4.0))
    rng = np.random.default_rng(top)
    return np.stack([rng.permutation(row) for row in x])


@pytest.mark.parametrize("mode", ["fast", "deterministic"])
@pytest.mark.parametrize("largest", [True, False])
def test_a_top_bin_of_one_key_needs_no_last_pass(mode, largest):
    """float32 rows whose k-th key's first bucket holds 3.5 and 3.75 with more than k 3.75s
    (tie-heavy data): once the buffer holds that bucket, the second pass finds 3.75's bin at
    the top, and a walk of the buffer finds no other key in it, so no third histogram counts
    it. Where 3.75's bin also holds the next float up, the third pass separates them."""
    kernel = ("sm_90", "float32", mode)
    sign = 1 if largest else -1
    one = sign * _top_ties(3000, 100, 20)
    two = sign * _top_ties(3000, 100, 20, odd=40)
    counts = [_run(kernel, x, largest=largest) for x in (one, two)]
    assert _reads(counts[0], one) == 2.0  # the bucket was collected
    later = [c.phases["histogram, later passes"] for c in counts]
    # the later passes differ by the third's histogram of the 100 keys of 3.75's bin, a row
    assert later[1].shared_atomics - later[0].shared_atomics == 2 * 100, (later[0], later[1])
    assert later[0].barriers < later[1].barriers


@pytest.mark.parametrize("kernel", KERNELS, ids=["-".join(k) for k in KERNELS])
def test_every_pattern_around_the_thresholds(kernel):
    """n around the resident threshold and the block's vector tiles; k = 1, middle and 64."""
    arch, dtype, _ = kernel
    spec = _spec(*kernel)
    fits = spec.dynamic_shared_bytes // np.dtype(NP_TYPES[dtype]).itemsize - (spec.vector_width - 1)
    for n in sorted({K, fits, fits + 1, spec.threads * spec.vector_width + 3, 1500}):
        if n < K:
            continue
        x = make_rows(dtype, len(PATTERNS), n, seed=n)
        for k in (1, 33, K):
            _run(kernel, x, k=k, largest=k != 33)


@pytest.mark.parametrize("kernel", [k for k in KERNELS if k[1] == "bfloat16"])
def test_every_16_bit_pattern_keeps_its_order(kernel):
    """The 16-bit key transform (two keys in one register) against the reference on every
    bfloat16 bit pattern: all of them, the numbers only, the negative numbers, those under 1
    and under 2^-120 in magnitude (denormals and zeros), each row of 2^16 drawn from its set;
    both directions."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    values = bits.view(ml_dtypes.bfloat16).astype(np.float32)
    sets = [bits, bits[~np.isnan(values)], bits[values < 0], bits[np.abs(values) < 1], bits[np.abs(values) < 2.0**-120]]
    rng = np.random.default_rng(16)
    x = np.stack([rng.permutation(s) if len(s) == len(bits) else rng.choice(s, len(bits)) for s in sets])
    x = x.view(ml_dtypes.bfloat16)
    for largest in (True, False):
        _run(kernel, x, largest=largest)


# ----------------------------------------------------------------------------- shared memory sized to the row

SHARED_KERNELS = [k for k in KERNELS if _spec(*k).dynamic_shared_bytes > 0]


@pytest.mark.parametrize("kernel", SHARED_KERNELS, ids=["-".join(k) for k in SHARED_KERNELS])
def test_any_shared_bytes_up_to_the_compiled_maximum_is_served(kernel):
    """The kernel sizes its resident row and its candidate buffer by its shared_bytes argument,
    within the compiled maximum: 0, a few small values (one not a multiple of 16), the rule's
    value (split.SharedMemory) and 16 bytes under it, and the maximum, each allocated exactly
    (the emulator's guard zone after it catches a write past it), all give the reference's
    answer; with the rule's value a row that fits is read once, with 0 every pass reads it."""
    spec = _spec(*kernel)
    fits = spec.dynamic_shared_bytes // np.dtype(NP_TYPES[kernel[1]]).itemsize - (spec.vector_width - 1)
    for n in sorted({K + 3, fits // 2, fits, fits + 1, 1500}):
        rule = spec.shared.bytes_for(n)
        assert rule <= spec.dynamic_shared_bytes and (n <= fits or rule == spec.dynamic_shared_bytes), n
        x = make_rows(kernel[1], len(PATTERNS), n, seed=n)
        normal = _normal(kernel[1], 2, n, seed=n)
        for shared in sorted({0, 16, 200, max(0, rule - 16), rule, spec.dynamic_shared_bytes}):
            _run(kernel, x, shared_bytes=shared, seeds=(1,))
            reads = _reads(_run(kernel, normal, k=16, shared_bytes=shared, seeds=(1,)), normal)
            if shared == 0:
                assert reads >= 2.0, (n, shared)
            if shared >= rule and n <= fits:
                assert reads == 1.0, (n, shared)


# ----------------------------------------------------------------------------- appends a step at a time

WIDE_POLICY = POLICY.replace("name: radix_paths", "name: radix_wide_steps").replace(
    "shared_row_bytes: 1024\n    loads_in_flight: 4", "shared_row_bytes: 16384\n    loads_in_flight: 8")
WIDE_KERNELS = [("float32", "fast"), ("bfloat16", "fast"), ("bfloat16", "deterministic")]


WIDE = PolicyKernels(WIDE_POLICY, "radix_wide_steps", K, [("sm_90", *kernel) for kernel in WIDE_KERNELS])


@pytest.mark.parametrize("kernel", WIDE_KERNELS, ids=["-".join(k) for k in WIDE_KERNELS])
def test_step_marks_of_eight_loads_in_flight(kernel):
    """The passes over a resident row's copy mark a lane's keys of a step and append them at its
    end (StepMarks), re-reading them from the copy by index. With 8 loads in flight a step holds
    32 float32 keys a lane (a 32-bit mask, full) and 64 bfloat16 ones (the 64-bit mask); rows
    longer than 4 x 128 vectors fill a step's later pieces (the mask's upper half). Rows of
    odd length (each row after the first starts off a 16-byte boundary: a head step; and ends
    in a tail step) and aligned ones, of every pattern (ties, NaN, +-0, all equal: the gather
    from the copy when the bucket never fits the buffer) and of normal keys (the collect), up to
    what fits, both directions; each must be the reference's answer, and read once."""
    spec, module = WIDE.spec("sm_90", *kernel), WIDE.module()
    dtype, mode = kernel
    assert spec.loads_in_flight * spec.vector_width in ((32, 64) if dtype == "float32" else (64,))
    for n in (K, 1001, 2053, 3001) if dtype == "float32" else (K, 1001, 4099, 6997):
        for x in (make_rows(dtype, len(PATTERNS), n, seed=n), _normal(dtype, 3, n, seed=n)):
            for largest in (True, False):
                for seed in (1, 2) if mode == "deterministic" else (1,):
                    values, indices, counters = launch_kernel(module, spec, x, K, largest, schedule_seed=seed,
                                                              workers=1, counters=True)
                    check_topk(x, values, indices, K, largest, mode == "deterministic", dtype,
                               what=f"{spec.name} n={n} largest={largest} seed={seed}")
                nan_outputs = int(np.isnan(reference.topk(x, K, largest=largest)[0].astype(np.float32)).sum())
                assert _reads(counters, x) == 1.0 + nan_outputs / x.size, (n, largest)
