"""Emulator traffic counters: exact counts on small hand-written kernels and on real top-k
kernels (global bytes per pass, shared atomics, bank lanes, barriers, shuffles)."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from topkgen import policy as pol
from topkgen.emulator import EmulationError, compile_source
from topkgen.emulator.counters import BankLanes
from topkgen.build.render import render, template_dir

from ..support.topk_cases import launch_kernel

KERNELS = Path(__file__).resolve().parents[1] / "support" / "kernels"


def _source() -> str:
    return (template_dir() / "topk_memory.cuh").read_text() + (KERNELS / "counters.cu").read_text()


@pytest.fixture(scope="module")
def module():
    return compile_source(_source(), name="counters")


def test_global_bytes_through_the_helpers(module):
    blocks, threads = 3, 64
    n = blocks * threads
    arrays = [np.arange(4 * n, dtype=np.uint32).view(np.uint32), np.zeros(4 * n, np.uint32),
              np.arange(n, dtype=np.uint16), np.zeros(n, np.uint16), np.arange(n, dtype=np.int64), np.zeros(n, np.int64)]
    c = module.launch("copy", blocks, threads, arrays, counters=True)
    assert c.global_load_bytes == n * (16 + 2 + 8)
    assert c.global_store_bytes == n * (16 + 2 + 8)
    assert (c.shared_atomics, c.global_atomics, c.barriers, c.shuffles, c.votes) == (0, 0, 0, 0, 0)
    np.testing.assert_array_equal(arrays[1], arrays[0])
    assert module.launch("copy", blocks, threads, arrays) is None  # counting off: nothing returned


# (stride, bank lanes of a no-return +1, of the same addresses with a return or operand 2):
# lane * stride words apart. Issue 27: all 32 lanes on one word (stride 0) were 32 lanes for
# every atomic; a no-return +1 (ATOMS.POPC.INC) merges them into 1, the others keep 32.
@pytest.mark.parametrize("stride,degree,serialised", [(1, 1, 1), (2, 2, 2), (16, 16, 16), (32, 32, 32), (0, 1, 32),
                                                      (3, 1, 1)])
def test_bank_lanes_per_warp_instruction(module, stride, degree, serialised):
    blocks, threads, rounds = 2, 96, 5
    warps = blocks * threads // 32
    counter, out = np.zeros(1, np.int32), np.zeros(blocks, np.int32)
    c = module.launch("banks", blocks, threads, [np.int32(stride), np.int32(rounds), counter, out], counters=True)
    p = c.phases
    assert (p["stride"].shared_atomics, p["stride"].shared_atomic_instructions) == (blocks * threads, warps)
    assert p["stride"].bank_lanes_max == degree and p["stride"].bank_lanes_mean == degree
    assert set(p["stride"].bank_lanes_by_kind) == {"inc"}
    for phase, kind in (("returned", "add"), ("operand 2", "add"), ("min", "min/max")):
        assert p[phase].shared_atomic_instructions == warps, phase
        assert (p[phase].bank_lanes_max, p[phase].bank_lanes_mean) == (serialised, serialised), phase
        assert p[phase].bank_lanes_by_kind == {kind: BankLanes(warps, serialised, serialised)}, phase
    assert c.bank_lanes_by_kind["inc"] == BankLanes(warps * (rounds + 2), (degree + rounds + 1) / (rounds + 2),
                                                    max(degree, 1))
    assert c.bank_lanes_by_kind["add"] == BankLanes(2 * warps, serialised, serialised)
    assert (p["loop"].shared_atomics, p["loop"].shared_atomic_instructions) == (blocks * threads * rounds, warps * rounds)
    assert (p["loop"].bank_lanes_max, p["even lanes"].bank_lanes_max) == (1, 1)
    assert (p["even lanes"].shared_atomics, p["even lanes"].shared_atomic_instructions) == (blocks * threads // 2, warps)
    assert (p["global"].global_atomics, p["global"].shared_atomics) == (blocks * threads, 0)
    assert c.barriers == 2 * blocks and p[""].barriers == blocks and p["min"].barriers == blocks
    assert c.global_store_bytes == 4 * blocks and counter[0] == blocks * threads
    assert c.shared_atomics == sum(ph.shared_atomics for ph in p.values())
    assert c.bank_lanes_max == max(degree, serialised, 1)
    instructions = warps * (1 + rounds + 1 + 3)
    assert c.bank_lanes_mean == pytest.approx((warps * degree + warps * rounds + warps + 3 * warps * serialised)
                                              / instructions)


def test_warp_aggregated_atomics_count_leaders_only(module):
    blocks, threads = 2, 64
    lane = np.arange(blocks * threads) % 32
    bins = (lane // 4 + 8 * (np.arange(blocks * threads) // 32 % 2)).astype(np.int32)  # 8 bins per warp
    hist = np.zeros(256, np.int32)
    c = module.launch("aggregated_histogram", blocks, threads, [bins, hist], counters=True)
    warps = blocks * threads // 32
    np.testing.assert_array_equal(hist, np.bincount(bins, minlength=256))
    assert (c.shared_atomics, c.shared_atomic_instructions) == (8 * warps, warps)
    assert (c.bank_lanes_max, c.bank_lanes_mean) == (1, 1.0)
    assert (c.votes, c.global_atomics, c.global_load_bytes) == (warps, 256 * blocks, 4 * blocks * threads)


def test_barriers_shuffles_and_votes(module):
    blocks, threads = 3, 64
    values = np.arange(blocks * threads, dtype=np.int32)
    out = np.zeros(3 * blocks * threads // 32, np.int32)
    c = module.launch("collectives", blocks, threads, [values, out], counters=True)
    warps = blocks * threads // 32
    assert (c.barriers, c.shuffles, c.votes) == (3 * blocks, 5 * warps, 3 * warps)
    assert (c.global_load_bytes, c.global_store_bytes) == (4 * blocks * threads, 12 * warps)
    sums = values.reshape(warps, 32).sum(axis=1)
    np.testing.assert_array_equal(out[0::3], sums)
    np.testing.assert_array_equal(out[1::3], np.where(sums & 1, -1, 0).astype(np.int32))
    np.testing.assert_array_equal(out[2::3], 32)  # __match_all_sync: all equal, then none


def test_counts_do_not_depend_on_the_schedule(module):
    args = lambda: [np.int32(2), np.int32(3), np.zeros(1, np.int32), np.zeros(4, np.int32)]  # noqa: E731
    first = module.launch("banks", 4, 128, args(), counters=True)
    for seed, workers in ((1, 1), (2, 3), (3, 2)):
        assert module.launch("banks", 4, 128, args(), counters=True, schedule_seed=seed, workers=workers) == first


def test_counting_compiled_out_refuses_to_count():
    module = compile_source(_source(), name="counters_off", defines=("TK_COUNTERS=0",))
    out = np.zeros(4, np.int32)
    module.launch("banks", 1, 32, [np.int32(1), np.int32(1), np.zeros(1, np.int32), out])
    assert out[0] == 3  # s[0] takes lane 0's stride, first loop round and even-lane atomics
    with pytest.raises(EmulationError, match="TK_COUNTERS=0"):
        module.launch("banks", 1, 32, [np.int32(1), np.int32(1), np.zeros(1, np.int32), out], counters=True)
    with pytest.raises(EmulationError, match="NAME=INTEGER"):
        compile_source(_source(), name="counters_bad", defines=("TK_COUNTERS=0;rm",))


# ----------------------------------------------------------------------------- real kernels

def _kernel(dtype: str, k: int, n: int, mode: str = "fast"):
    policy = pol.load()
    spec = pol.select(policy, "sm_90", dtype, k, n, deterministic=mode == "deterministic").kernel
    return spec, compile_source(render(spec), name=spec.name)


def _launch(spec, module, x: np.ndarray, k: int):
    return launch_kernel(module, spec, x, k, counters=True)[2]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_radix_kernel_reads_a_resident_row_once(dtype):
    """Rows that fit in shared memory are read once, and one element more per NaN output (the
    copy holds keys; a NaN's payload comes from the row), and the k <= 64 sort runs in one
    warp without a block barrier."""
    from ..support.topk_cases import make_rows

    k, rows, n = 64, 4, 3001
    spec, module = _kernel(dtype, k, n)
    assert spec.family == "radix" and spec.mode == "fast" and n * np.dtype(np.float32).itemsize < spec.dynamic_shared_bytes
    x = make_rows(dtype, rows, n, seed=5)  # random, ties, all-equal, NaN of both signs and +-0
    size = x.itemsize
    c = _launch(spec, module, x, k)
    from topkgen.runtime import reference

    nan_outputs = int(np.isnan(reference.topk(x, k, largest=True)[0].astype(np.float32)).sum())
    assert nan_outputs > 0  # the rows hold NaNs, and some are among the results
    assert c.global_load_bytes == (rows * n + nan_outputs) * size
    assert c.phases["histogram, first pass"].global_load_bytes == rows * n * size
    assert c.global_store_bytes == rows * k * (size + 8)
    # One no-return +1 (ATOMS.POPC.INC) per element, no software-aggregated add, and each
    # warp's span: one lane's min and max. The pass leaves a NaN's key as the flip makes it, and
    # a row that held one counts its copy again, every NaN made one key: once more per element
    # of those rows alone.
    nan_rows = int(np.isnan(x.astype(np.float32)).any(axis=1).sum())
    assert 0 < nan_rows < rows
    first = c.phases["histogram, first pass"]
    assert set(first.bank_lanes_by_kind) == {"inc", "min/max"}
    assert first.shared_atomics == (rows + nan_rows) * n + first.bank_lanes_by_kind["min/max"].instructions
    assert c.phases["sort and output"].barriers == 0


def test_radix_kernel_bank_lanes_on_crafted_rows():
    """All-equal rows give one lane per warp atomic instruction (the lanes of one bin add
    once); rows whose first 11-bit digit's bank is the lane number spread the lanes."""
    k, rows, n = 64, 2, 4096
    spec, module = _kernel("float32", k, n)
    # one instruction per warp and element slot; each warp's min and max of the keys only
    # where the row is one key (fast mode asks the copy then, and keeps no span otherwise)
    instructions = rows * n // 32
    same = _launch(spec, module, np.full((rows, n), 3.0, np.float32), k).phases["histogram, first pass"]
    assert (same.bank_lanes_max, same.bank_lanes_mean) == (1, 1.0)
    assert same.shared_atomic_instructions == instructions + rows * (spec.threads // 32) * 2
    lane = (np.arange(n) // 4) % 32  # element i is in vector i // 4, loaded by thread (i // 4) % 256
    bits = (lane.astype(np.uint32) << 21) | np.uint32(0x123)
    spread = _launch(spec, module, np.tile(bits.view(np.float32), (rows, 1)), k).phases["histogram, first pass"]
    assert (spread.bank_lanes_max, spread.bank_lanes_mean) == (1, 1.0)
    assert spread.shared_atomic_instructions == instructions


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_resident_row_of_one_key_gathers_only_the_steps_its_ties_need(dtype):
    """Issue 28 (at most 1.0 warp instructions a key on all-equal rows): any k keys of a
    resident row of one key are its top k in fast mode, so the gather from the row's copy stops
    once every tie's slot is taken: fewer append atomics than threads, where walking the whole
    copy took one a thread a step (4 steps of 128 threads for float32 at 16384, 2 for
    bfloat16). Rows of one positive value, one negative value and all NaN, in both
    directions."""
    from ..support.topk_cases import check_topk

    k, n = 256, 16384
    spec, module = _kernel(dtype, k, n)
    x = np.stack([np.full(n, 0.75), np.full(n, -2.5), np.full(n, np.nan)])
    x = x.astype(np.float32 if dtype == "float32" else ml_dtypes.bfloat16)
    steps = n * x.itemsize // 16 // (spec.threads * spec.loads_in_flight)
    assert steps >= 2 and n * x.itemsize < spec.dynamic_shared_bytes
    for largest in (True, False):
        for row in range(len(x)):
            values, indices, c = launch_kernel(module, spec, x[row:row + 1], k, largest, counters=True)
            check_topk(x[row:row + 1], values, indices, k, largest, False, dtype, f"{spec.name} row {row}")
            assert 0 < c.phases["gather"].shared_atomics < spec.threads, (row, largest)


def test_register_kernel_counts():
    k, rows, n = 16, 5, 1000
    spec, module = _kernel("float32", k, n)
    assert spec.family == "register"
    x = np.random.default_rng(1).standard_normal((rows, n)).astype(np.float32)
    c = _launch(spec, module, x, k)
    assert c.global_load_bytes == rows * n * 4  # output values are rebuilt from the keys
    assert c.global_store_bytes == rows * k * 12
    assert (c.barriers, c.shared_atomics, c.shuffles) == (0, 0, rows * k * 5)


def test_bench_emulator_launches_kernels_with_their_dynamic_shared_memory(capsys):
    """`make bench-emulator` launched the radix kernels without the dynamic shared memory
    their spec asks for: the first write to it faulted at address 0 (EmulationError), and
    the target failed before printing any counter cost."""
    import importlib.util

    from ..conftest import ROOT

    spec = importlib.util.spec_from_file_location("bench_emulator", ROOT / "benchmarks" / "bench_emulator.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.counter_costs((("float32", 256, 8192, 1),), repeat=1)  # a dynamic-work radix kernel, 96 KiB of it
    rows = [line.split()[:2] for line in capsys.readouterr().out.splitlines()[2:]]
    assert rows == [["topk_radix_dyn_k256_fast_f32_sm_90", "1"]]


def _streaming_kernels():
    """A radix kernel of the default policy for each (dtype, K rung, mode) of sm_90 at a row
    just longer than its shared memory holds, with what selection.streams says of it."""
    from topkgen.policy.selection import resident_elements

    policy = pol.load()
    for dtype in ("float32", "bfloat16"):
        for k in (64, 256, 512, 1024):
            for mode in ("fast", "deterministic"):
                spec = pol.select(policy, "sm_90", dtype, k, 1 << 16, deterministic=mode == "deterministic").kernel
                n = resident_elements(spec) + 3 * spec.threads + 5  # past the copy's capacity, a tail too
                yield pytest.param(spec, n, k, id=f"{dtype}-k{k}-{mode}")


@pytest.mark.parametrize("spec,n,k", list(_streaming_kernels()))
def test_a_row_longer_than_shared_memory_is_read_once_where_the_kernel_streams(spec, n, k):
    """Issue 28, point 4: a radix kernel that streams (selection.streams, the kernel's own
    test) reads a row longer than its shared memory once at any batch, and one element more
    per NaN output, on random, tied, all-equal, special, ascending (every key above the
    floor: a refill per step pair) and -inf/NaN rows, in both directions, with results
    bit-exact in deterministic mode; less where k NaNs top a row (largest: no later key can
    enter). The tied rows' refills find the k-th key alone in its bucket: the top k replace
    the buffer there, and the stream reads on past that key. One that does not stream reads
    such a row at least twice. explain says which."""
    from topkgen.policy.selection import resident_elements, streams
    from topkgen.runtime import reference
    from ..support.topk_cases import check_topk, make_rows

    assert n > resident_elements(spec)
    module = compile_source(render(spec), name=spec.name)
    x = make_rows(spec.dtype, 6, n, seed=k + n)
    reason = pol.select(pol.load(), "sm_90", spec.dtype, k, n, deterministic=spec.mode == "deterministic").reason
    for largest in (True, False):
        values, indices, c = launch_kernel(module, spec, x, k, largest, counters=True)
        check_topk(x, values, indices, k, largest, spec.mode == "deterministic", spec.dtype, spec.name)
        nan_outputs = int(np.isnan(reference.topk(x, k, largest=largest)[0].astype(np.float32)).sum())
        once = (x.size + nan_outputs) * x.itemsize
        if streams(spec, k):
            assert c.global_load_bytes <= once, (spec.name, largest)
            assert "the row is read once" in reason
            nan_topped = np.isnan(x.astype(np.float32)).sum(axis=1) >= k if largest else np.zeros(len(x), bool)
            assert nan_topped.sum() == (2 if largest else 0)  # the special and the -inf/NaN rows
            read = x[~nan_topped]
            _, _, c = launch_kernel(module, spec, read, k, largest, counters=True)
            nan_outputs = int(np.isnan(reference.topk(read, k, largest=largest)[0].astype(np.float32)).sum())
            assert c.global_load_bytes == (read.size + nan_outputs) * x.itemsize, (spec.name, largest)
        else:
            assert c.global_load_bytes >= 2 * x.size * x.itemsize, (spec.name, largest)
            assert "read more than once" in reason
    # Every default kernel streams: those below 1024 threads whose lists hold a step's keys,
    # K=512 and 1024 included since threads_by_k puts them below (128 threads; on 512 and 1024
    # threads bfloat16 K=512 and every K=1024 read such a row at least twice).
    assert spec.threads == 128 and streams(spec, k)


@pytest.mark.parametrize("dtype,k,mode", [("bfloat16", 256, "fast"), ("float16", 1024, "deterministic")])
def test_the_stream_compares_a_key_at_a_time_where_no_pair_compare_exists(dtype, k, mode):
    """sm_75 to sm_89 have no set.bf16x2: their stream tests 16-bit keys one at a time, where
    sm_90 and later test a word of two (kPairCompare). The emulator runs the pairs, and the
    form of a key at a time where TOPKGEN_KEY_COMPARE=1. Rows past shared memory of every
    pattern (NaN of both signs, +-0, infinities, ties), both directions, against the
    reference; the two forms give the same values."""
    from topkgen.policy.selection import resident_elements

    from ..support.topk_cases import check_topk, make_rows

    spec = pol.select(pol.load(), "sm_90", dtype, k, 1 << 16, deterministic=mode == "deterministic").kernel
    n = resident_elements(spec) + 3 * spec.threads + 5
    x = make_rows(dtype, 6, n, seed=k)
    outputs = {}
    for key_compare in (0, 1):
        module = compile_source(render(spec), name=f"{spec.name}_kc{key_compare}",
                                defines=(f"TOPKGEN_KEY_COMPARE={key_compare}",))
        for largest in (True, False):
            values, indices, _ = launch_kernel(module, spec, x, k, largest)
            check_topk(x, values, indices, k, largest, mode == "deterministic", dtype, f"{spec.name} {key_compare}")
            outputs[key_compare, largest] = values.tobytes()
    assert all(outputs[0, largest] == outputs[1, largest] for largest in (True, False))


@pytest.mark.parametrize("dtype,k,mode", [("float32", 1024, "fast"), ("bfloat16", 256, "fast"),
                                          ("float32", 256, "deterministic"), ("bfloat16", 1024, "deterministic")])
def test_long_rows_refill_with_the_bound_of_a_later_pass(dtype, k, mode):
    """Issue 28, point 4: a row many times longer than shared memory refills the stream's lists
    again and again. Where a refill's second pass drops enough of them, and the run of that
    pass's bins (a lane's, of warp 0) that holds the k-th key so far holds at most a quarter of
    the bucket's keys, the stream's bound rises to the run's floor. A floor above that key drops
    later keys the top k need where they lie low in that run: the banded float32 row here
    (a tenth of its keys in 1.2421875 + u / 16384, the lowest bin of the bucket's top run, two
    fifths in 1 + u / 5, half in [0, 0.5), u uniform; a run is 64 bins of 2^-13), the bfloat16
    one (half in [0, 0.5), half in 1 + u / 4), beside normal and uniform rows, both directions;
    deterministic results bit-exact, fast ones the reference's keys."""
    from ..support.topk_cases import check_topk

    n = 1 << 17
    spec = pol.select(pol.load(), "sm_90", dtype, k, n, deterministic=mode == "deterministic").kernel
    module = compile_source(render(spec), name=spec.name)
    rng = np.random.default_rng(k)
    if dtype == "float32":
        part = rng.random(n)
        banded = np.where(part < 0.1, 1.2421875 + rng.random(n) / 16384,
                          np.where(part < 0.5, 1 + rng.random(n) / 5, rng.random(n) / 2))
    else:
        banded = np.where(rng.random(n) < 0.5, rng.random(n) / 2, 1 + rng.random(n) / 4)
    x = np.stack([banded, rng.standard_normal(n), rng.random(n)])
    x = x.astype(np.float32 if dtype == "float32" else ml_dtypes.bfloat16)
    for largest in (True, False):
        values, indices, _ = launch_kernel(module, spec, x, k, largest)
        check_topk(x, values, indices, k, largest, mode == "deterministic", dtype, spec.name)
