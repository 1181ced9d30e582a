"""The SIMT emulator: every built-in, and planted bugs that must be caught."""

from __future__ import annotations

import multiprocessing as mp
import os
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from topkgen.emulator import EmulationError, compile_source

KERNELS = Path(__file__).resolve().parents[1] / "support" / "kernels"
SEEDS = (None, 1, 2, 3)


@pytest.fixture(scope="module")
def builtins():
    return compile_source((KERNELS / "builtins.cu").read_text(), name="builtins")


@pytest.fixture(scope="module")
def bugs():
    return compile_source((KERNELS / "planted_bugs.cu").read_text(), name="planted_bugs")


@pytest.mark.parametrize("seed", SEEDS)
def test_shuffles_with_widths(builtins, seed):
    out = np.zeros((64, 8), np.int32)
    builtins.launch("shuffles", 1, 64, [out], schedule_seed=seed)
    lane = np.arange(64) % 32
    seg = lane & ~7
    v = 100 + lane
    expect = np.stack([
        np.full(64, 105), 100 + seg + 3,
        np.where(lane >= 2, v - 2, v), np.where(lane - seg >= 2, v - 2, v),
        np.where(lane + 3 < 32, v + 3, v), np.where(lane - seg + 3 < 8, v + 3, v),
        100 + (lane ^ 1), 100 + (lane ^ 4),
    ], axis=1)
    np.testing.assert_array_equal(out, expect)


def test_shuffles_carry_64_bit_and_float_values(builtins):
    out64, outf = np.zeros(32, np.uint64), np.zeros(32, np.float32)
    builtins.launch("shuffle_wide", 1, 32, [out64, outf])
    lane = np.arange(32, dtype=np.uint64)
    np.testing.assert_array_equal(out64, (np.uint64(0x1234567800000000) | (lane ^ np.uint64(31))) << np.uint64(1))
    np.testing.assert_array_equal(outf, np.where(np.arange(32) < 31, (np.arange(32) + 1) * 0.5, 15.5))


@pytest.mark.parametrize("seed", SEEDS)
def test_votes_and_barrier_reductions(builtins, seed):
    rng = np.random.default_rng(7)
    pred = (rng.random(96) < 0.5).astype(np.int32)
    pred[64:96] = 1  # warp 2 votes all-true
    out = np.zeros((96, 6), np.uint32)
    builtins.launch("votes", 1, 96, [pred, out], schedule_seed=seed)
    for w in range(3):
        bits = pred[w * 32:(w + 1) * 32]
        ballot = int(sum(int(b) << i for i, b in enumerate(bits)))
        rows = out[w * 32:(w + 1) * 32]
        assert (rows[:, 0] == ballot).all()
        assert (rows[:, 1] == int(bits.any())).all() and (rows[:, 2] == int(bits.all())).all()
    assert (out[:, 3] == pred.sum()).all()
    assert (out[:, 4] == (int(pred.all()) | (int(pred.any()) << 1))).all()
    assert (out[:, 5] == 0xFFFFFFFF).all()


@pytest.mark.parametrize("seed", SEEDS)
def test_match_any_and_match_all(builtins, seed):
    rng = np.random.default_rng(3)
    v = rng.integers(0, 5, size=96).astype(np.uint32)
    v[64:96] = 7  # warp 2: every lane holds the same value
    w = (rng.integers(0, 3, size=96).astype(np.uint64) << np.uint64(40)) | np.uint64(9)  # differ in the high word
    out = np.zeros((96, 4), np.uint32)
    builtins.launch("matches", 1, 96, [v, w, out], schedule_seed=seed)
    for t in range(96):
        lanes = range(t - t % 32, t - t % 32 + 32)
        same = sum(1 << (m % 32) for m in lanes if v[m] == v[t])
        assert out[t, 0] == same, t
        if t % 2 == 0:
            assert out[t, 1] == sum(1 << (m % 32) for m in lanes if m % 2 == 0 and w[m] == w[t]), t
        all_same = all(v[m] == v[t] for m in lanes)
        assert (out[t, 2], out[t, 3]) == ((0xFFFFFFFF, 1) if all_same else (0, 0)), t


def test_disjoint_subwarp_masks(builtins):
    out = np.zeros(32, np.int32)
    builtins.launch("subwarp", 1, 32, [out], schedule_seed=5)
    np.testing.assert_array_equal(out, np.where(np.arange(32) < 16, 0, 160))


@pytest.mark.parametrize("seed", (None, 11))
def test_atomics_shared_and_global(builtins, seed):
    blocks, threads = 6, 64
    g = np.array([0, 0, -(2**31), 2**31 - 1, 0, -1, 0, 0], np.int32)
    g64 = np.zeros(2, np.uint64)
    gf = np.zeros(2, np.float32)
    shared_out = np.zeros(9, np.int32)
    builtins.launch("atomics", blocks, threads, [g, g64, gf, shared_out], schedule_seed=seed, workers=3)
    t = np.arange(threads)
    assert list(shared_out[:6]) == [t.sum(), -2 * threads, 3 * (threads - 1), 7, int(np.bitwise_or.reduce(1 << (t % 31))),
                                    int(np.int32(~np.bitwise_or.reduce(1 << (t % 31))))]
    assert list(shared_out[6:]) == [1, 1, threads]
    total = blocks * threads
    assert list(g[:4]) == [total, -total, total - 1, -(total - 1)]
    assert g[4] == (1 << blocks) - 1 and g[5] == np.int32(~((1 << blocks) - 1))
    assert 1 <= g[6] <= blocks and g[7] == 1
    assert g64[0] == 3 * total and g64[1] == (blocks - 1) << 40
    assert gf[0] == 0.5 * total and gf[1] == 2.0


def _brev(v: int, bits: int) -> int:
    return int(f"{v:0{bits}b}"[::-1], 2)


def test_bit_intrinsics(builtins):
    x = np.array([0, 1, 0x80000000, 0xF0F0, 0x12345678, 0xFFFFFFFF, 6, 0x00010000], np.uint32)
    out = np.zeros((len(x), 12), np.uint32)
    builtins.launch("bits", 1, len(x), [x, out])
    for row, v in zip(out, x.tolist()):
        w = ((v << 20) | v) & (2**64 - 1)
        b = ((0xA1B2C3D4 << 32) | v).to_bytes(8, "little")
        perm = b[0] | b[4] << 8 | b[1] << 16 | b[5] << 24
        expect = [bin(v).count("1"), bin(w).count("1"), 32 - v.bit_length(), 64 - w.bit_length(),
                  (v & -v).bit_length(), (w & -w).bit_length(), _brev(v, 32), _brev(w, 64) >> 32, perm, v,
                  0x3F800000, v]
        assert row.tolist() == expect, v


@pytest.mark.parametrize("seed", (None, 4))
def test_vectors_dynamic_shared_and_3d_indices(builtins, seed):
    grid, block = (2, 2, 1), (4, 4, 2)
    nt, nb = 32, 4
    x = np.arange(nb * nt * 4, dtype=np.float32).reshape(nb * nt, 4)
    out = np.zeros(nb * nt, np.float32)
    builtins.launch("vectors", grid, block, [x, out], shared_bytes=nt * 16, schedule_seed=seed)
    sums = x.sum(axis=1).reshape(nb, nt)[:, ::-1]
    expect = sums + np.minimum(np.arange(nt), 3)
    np.testing.assert_array_equal(out, expect.reshape(-1))


def test_half_and_bfloat16_from_the_cuda_headers(builtins):
    h = np.array([0.5, -2.0, 65504.0, 1e-7], np.float16)
    b = np.array([1.5, -3.0, 256.0, 0.0078125], ml_dtypes.bfloat16)
    out = np.zeros(8, np.float32)
    builtins.launch("halves", 1, 4, [h, b, out])
    np.testing.assert_array_equal(out[0::2], h.astype(np.float32) * 2)
    np.testing.assert_array_equal(out[1::2], (b.astype(np.float32) + 1).astype(ml_dtypes.bfloat16).astype(np.float32))


def test_nanosleep_lets_an_intra_block_handshake_finish(builtins):
    flag, out = np.zeros(1, np.int32), np.zeros(1, np.int32)
    builtins.launch("handshake", 1, 2, [flag, out], timeout=10)
    assert out[0] == 1


def test_scalar_types_are_checked(builtins, bugs):
    out = np.zeros(4, np.float32)
    with pytest.raises(EmulationError, match=r"argument #1 of 'oob_global_write' is int32, got numpy int64"):
        bugs.launch("oob_global_write", 1, 4, [out, np.int64(4)])
    with pytest.raises(EmulationError, match="numpy scalar"):
        bugs.launch("oob_global_write", 1, 4, [out, 4])
    with pytest.raises(EmulationError, match="no kernel 'nope'"):
        bugs.launch("nope", 1, 4, [out])


# ----------------------------------------------------------------------------- planted bugs

def test_missing_barrier_changes_the_result_under_some_seed(bugs):
    results = []
    for seed in SEEDS:
        out = np.zeros(256, np.float32)
        bugs.launch("missing_barrier", 1, 256, [out], schedule_seed=seed)
        results.append(out.tobytes())
    assert len(set(results)) > 1
    for seed in SEEDS:  # the correct kernel gives one answer under every seed
        out = np.zeros(256, np.float32)
        bugs.launch("with_barrier", 1, 256, [out], schedule_seed=seed)
        np.testing.assert_array_equal(out, (np.arange(256) + 1) % 256 + 1)


def test_divergent_barrier(bugs):
    with pytest.raises(EmulationError, match=r"divergent __syncthreads.*kernel 'divergent_barrier', block \(0,0,0\)"):
        bugs.launch("divergent_barrier", 1, 64, [np.zeros(64, np.int32)])


def test_barrier_after_some_threads_returned(bugs):
    with pytest.raises(EmulationError, match=r"__syncthreads reached by 48 of 64 threads: thread \(48,0,0\)"):
        bugs.launch("early_return_barrier", 1, 64, [np.zeros(64, np.int32)])


def test_shuffle_mask_names_lanes_that_never_arrive(bugs):
    with pytest.raises(EmulationError, match=r"__shfl_sync with mask 0xffffffff in warp 0: lanes 0-15 arrived, "
                                             r"lanes 16-31 never will \(they returned\).*kernel 'shuffle_wrong_mask'"):
        bugs.launch("shuffle_wrong_mask", 1, 32, [np.zeros(32, np.int32)])


def test_shuffle_mask_excluding_the_caller(bugs):
    with pytest.raises(EmulationError, match=r"mask 0x0000ffff excludes the calling lane 16.*thread \(16,0,0\) "
                                             r"\(warp 0, lane 16\)"):
        bugs.launch("shuffle_mask_excludes_caller", 1, 32, [np.zeros(32, np.int32)], schedule_seed=None)


def test_out_of_bounds_global_write_in_the_guard_zone(bugs):
    out = np.zeros(10, np.float32)
    with pytest.raises(EmulationError, match=r"out-of-bounds global write past the end of argument #0 "
                                             r"\(float32\[10\]\) of kernel 'oob_global_write'"):
        bugs.launch("oob_global_write", 1, 12, [out, np.int32(10)])


def test_out_of_bounds_global_write_far(bugs):
    with pytest.raises(EmulationError, match=r"out-of-bounds global write of argument #0 \(float32\[10\]\) "
                                             r"\(40 bytes\) at byte offset 20040 .*thread \(7,0,0\)"):
        bugs.launch("oob_global_far_write", 1, 8, [np.zeros(10, np.float32), np.int32(10)])


def test_out_of_bounds_global_read(bugs):
    with pytest.raises(EmulationError, match=r"out-of-bounds global read of argument #0 \(float32\[64\]\)"):
        bugs.launch("oob_global_read", 1, 64, [np.zeros(64, np.float32), np.zeros(64, np.float32), np.int32(64)])


def test_out_of_range_dynamic_shared_write(bugs):
    with pytest.raises(EmulationError, match=r"out-of-range dynamic shared-memory write at byte offset 64 of 64 "
                                             r"bytes at kernel 'oob_dynamic_shared', block \(0,0,0\), thread \(16,0,0\)"):
        bugs.launch("oob_dynamic_shared", 1, 20, [np.zeros(16, np.float32), np.int32(16)], shared_bytes=64)


def test_out_of_range_dynamic_shared_write_in_the_guard_zone(bugs):
    # 60 bytes: the write at offset 60 lands in the 4 bytes of guard zone, checked after the block.
    with pytest.raises(EmulationError, match=r"out-of-range dynamic shared-memory write after the 60 bytes"):
        bugs.launch("oob_dynamic_shared", 1, 16, [np.zeros(15, np.float32), np.int32(15)], shared_bytes=60)


def test_out_of_range_dynamic_shared_read(bugs):
    with pytest.raises(EmulationError, match=r"out-of-range dynamic shared-memory read at byte offset 8256 of 64 bytes"
                                             r".*kernel 'oob_dynamic_shared_far'"):
        bugs.launch("oob_dynamic_shared_far", 1, 1, [np.zeros(1, np.float32), np.int32(16)], shared_bytes=64)


def test_misaligned_vector_load(bugs):
    with pytest.raises(EmulationError, match=r"misaligned memory access .* at kernel 'misaligned_vector_load', "
                                             r"block \(0,0,0\), thread \(0,0,0\)"):
        bugs.launch("misaligned_vector_load", 1, 4, [np.zeros(32, np.float32), np.zeros(4, np.float32)])


def test_deadlock(bugs):
    with pytest.raises(EmulationError, match=r"deadlock: 16 threads wait at __syncthreads while thread \(0,0,0\) "
                                             r"waits in __shfl_sync"):
        bugs.launch("deadlock", 1, 32, [np.zeros(32, np.int32)])


def test_watchdog_catches_a_spin_on_another_cta(bugs):
    with pytest.raises(EmulationError, match=r"watchdog: the launch ran longer than 0.5 s at kernel "
                                             r"'spin_on_other_cta', block \(0,0,0\)"):
        bugs.launch("spin_on_other_cta", 2, 1, [np.zeros(1, np.int32)], timeout=0.5, workers=1)


def test_faults_leave_the_module_usable(bugs):
    with pytest.raises(EmulationError):
        bugs.launch("oob_global_far_write", 1, 8, [np.zeros(10, np.float32), np.int32(10)])
    out = np.zeros(64, np.float32)
    bugs.launch("with_barrier", 1, 64, [out])
    assert out[0] == 2


# ----------------------------------------------------------------------------- several modules in one process
# Every module is a CUDA module of its own: its kernels and its static shared memory belong to it
# alone, however many modules the process loaded before it (the runtime loads one per kernel).
# Both modules instantiate one template with static shared memory, as the top-k kernels do.
_MODULE_SOURCE = """
template <int N> __device__ int neighbour_without_barrier(int t) {
  __shared__ int s[N];
  s[t] = t + 1;
  // __syncthreads() missing here
  return s[(t + 1) % N];
}

extern "C" __global__ void NAME_fill(int* out) { out[threadIdx.x] = VALUE; }

extern "C" __global__ void NAME_race(int* out) {
  __shared__ int s[64];
  s[threadIdx.x] = threadIdx.x + 1;
  // __syncthreads() missing here
  out[threadIdx.x] = s[(threadIdx.x + 1) % 64];
}

extern "C" __global__ void NAME_race_in_template(int* out) {
  out[threadIdx.x] = neighbour_without_barrier<64>(threadIdx.x);
}

extern "C" __global__ void NAME_oob(const float* x, float* y, int read) {
  if (read) y[threadIdx.x] = x[threadIdx.x + 5000];
  else y[threadIdx.x + 5000] = x[threadIdx.x];
}

// flags: the address of a host array the test sets while the launch is in flight.
extern "C" __global__ void NAME_hold(unsigned long long flags, int slot, const float* x, float* y, int fault) {
  volatile int* f = reinterpret_cast<volatile int*>(flags);
  f[slot] = 1;                                // in flight
  while (f[slot + 1] == 0) __nanosleep(100);  // until the test lets it go on
  if (fault) y[threadIdx.x] = x[threadIdx.x + 5000];
}
"""


def _two_modules():
    return [compile_source(_MODULE_SOURCE.replace("NAME", name).replace("VALUE", str(value)), name=name)
            for name, value in (("first", 1), ("second", 2))]


@pytest.fixture(scope="module")
def two_modules():
    return _two_modules()


def _oob(module, read: bool) -> None:
    module.launch(f"{module.name}_oob", 1, 32, [np.zeros(64, np.float32), np.zeros(32, np.float32), np.int32(read)])


def test_each_module_lists_and_launches_only_its_own_kernels(two_modules):
    for module, value in zip(two_modules, (1, 2)):
        assert sorted(module.kernels) == [f"{module.name}_{k}" for k in ("fill", "hold", "oob", "race",
                                                                        "race_in_template")]
        out = np.zeros(32, np.int32)
        module.launch(f"{module.name}_fill", 1, 32, [out])
        assert (out == value).all()


@pytest.mark.parametrize("kernel", ("race", "race_in_template"))
def test_missing_barrier_in_static_shared_memory_of_every_module(two_modules, kernel):
    # Each launch must start from poisoned (-1) static shared memory: in thread order every
    # thread but the last reads its neighbour's slot before the neighbour writes it. Memory
    # left behind by the previous launch would hold the right answer and hide the bug.
    for module in two_modules + two_modules:
        for seed in SEEDS:
            out = np.zeros(64, np.int32)
            module.launch(f"{module.name}_{kernel}", 1, 64, [out], schedule_seed=seed)
            assert (out == -1).any(), (module.name, seed)
            if seed is None:
                np.testing.assert_array_equal(out, np.r_[np.full(63, -1), 1])


def test_faults_in_either_module_name_their_kernel(two_modules):
    first, second = two_modules
    with pytest.raises(EmulationError, match=r"out-of-bounds global read of argument #0 \(float32\[64\]\) "
                                             r"\(256 bytes\) at byte offset 20000 at kernel 'second_oob'"):
        _oob(second, read=True)
    with pytest.raises(EmulationError, match=r"out-of-bounds global write of argument #1 \(float32\[32\]\) "
                                             r"\(128 bytes\) at byte offset 20000 at kernel 'first_oob'"):
        _oob(first, read=False)
    out = np.zeros(32, np.int32)
    second.launch("second_fill", 1, 32, [out])
    assert (out == 2).all()


def _overlapping_launches_in_child(queue) -> None:
    import threading
    import time

    first, second = _two_modules()
    flags = np.zeros(4, np.int32)
    results: dict[str, str] = {}

    def hold(module, slot: int, fault: bool) -> None:
        try:
            module.launch(f"{module.name}_hold", 1, 1, [np.uint64(flags.ctypes.data), np.int32(slot),
                                                        np.zeros(64, np.float32), np.zeros(1, np.float32),
                                                        np.int32(fault)], timeout=60)
            results[module.name] = "finished"
        except EmulationError as e:
            results[module.name] = str(e)

    def wait_for(slot: int) -> None:
        deadline = time.monotonic() + 60
        while not flags[slot] and time.monotonic() < deadline:
            time.sleep(0.001)

    threads = [threading.Thread(target=hold, args=(first, 0, False)),
               threading.Thread(target=hold, args=(second, 2, True))]
    threads[0].start()
    wait_for(0)          # the first module's launch is in flight: its signal handlers are installed
    threads[1].start()
    wait_for(2)          # the second module's launch is in flight too
    flags[1] = 1         # the first launch ends while the second goes on
    threads[0].join()
    flags[3] = 1         # the second faults, caught by the handlers the first module installed
    threads[1].join()
    queue.put(results)


def test_a_fault_after_an_overlapping_launch_of_another_module_ended_is_reported():
    # In a child process: a fault the handlers miss kills the process.
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_overlapping_launches_in_child, args=(queue,))
    child.start()
    child.join(180)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail("the overlapping launches did not finish within 180 s")
    assert child.exitcode == 0, f"the process died (exit code {child.exitcode}): a fault escaped the emulator"
    results = queue.get(timeout=5)
    assert results["first"] == "finished"
    assert re.search(r"out-of-bounds global read of argument #2 \(float32\[64\]\) .* at kernel 'second_hold'",
                     results["second"]), results["second"]


# ----------------------------------------------------------------------------- compile cache

def _compile_in_child(cache: str, source: str, queue) -> None:
    os.environ["TOPKGEN_CACHE_DIR"] = cache
    compiled = []
    module = compile_source(source, name="concurrent", announce=compiled.append)
    out = np.zeros(32, np.float32)
    module.launch("fill", 1, 32, [out])
    queue.put((float(out.sum()), len(compiled)))


def test_concurrent_compiles_leave_one_good_cache_entry(tmp_path):
    """Three processes asking for one new module at once, in a cache without the runtime
    either: one runs g++ (announce is called once, just before it), the others wait for its
    entries (all three did compile them, each for itself, before the lock): one for the
    module, one for the runtime."""
    source = 'extern "C" __global__ void fill(float* y) { y[threadIdx.x] = 2.f; }\n'
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_compile_in_child, args=(str(tmp_path), source, queue)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    results = [queue.get(timeout=5) for _ in procs]
    assert [total for total, _ in results] == [64.0] * 3
    assert sum(compiles for _, compiles in results) == 1
    entries = sorted(p.suffix for p in (tmp_path / "emulator").iterdir())
    assert entries == [".sha256", ".sha256", ".so", ".so"]


def _compile_two_in_child(cache: str, queue) -> None:
    os.environ["TOPKGEN_CACHE_DIR"] = cache
    announced, totals = [], []
    for value in (3, 4):
        module = compile_source(f'extern "C" __global__ void put(float* y) {{ y[threadIdx.x] = {value}.f; }}\n',
                                name=f"put{value}", announce=announced.append)
        out = np.zeros(32, np.float32)
        module.launch("put", 1, 32, [out])
        totals.append(float(out.sum()))
    queue.put((totals, announced))


def test_modules_share_one_runtime_entry(tmp_path):
    """The scheduler, fault handlers and block execution are compiled once per cache, as the
    emulator's runtime, not into every module: a fresh process on an empty cache compiles two
    kernels into three entries (each kernel's and the runtime's), announcing each kernel once."""
    ctx = mp.get_context("spawn")  # a process that has loaded no runtime yet
    queue = ctx.Queue()
    child = ctx.Process(target=_compile_two_in_child, args=(str(tmp_path), queue))
    child.start()
    child.join(120)
    totals, announced = queue.get(timeout=5)
    assert totals == [96.0, 128.0]
    assert announced == ["put3", "put4"]
    assert sorted(p.suffix for p in (tmp_path / "emulator").iterdir()) == [".sha256"] * 3 + [".so"] * 3

def test_a_corrupt_cache_entry_is_compiled_again(tmp_path, monkeypatch):
    monkeypatch.setenv("TOPKGEN_CACHE_DIR", str(tmp_path))
    source = 'extern "C" __global__ void twice(float* y) { y[threadIdx.x] *= 2.f; }\n'
    compile_source(source, name="corrupt")
    so = next((tmp_path / "emulator").glob("*.so"))
    broken = so.with_name("broken.tmp")  # a new file: the loaded one stays mapped in this process
    broken.write_bytes(so.read_bytes()[:1000])
    os.replace(broken, so)
    import topkgen.emulator as emu
    emu._loaded.clear()
    y = np.ones(4, np.float32)
    compile_source(source, name="corrupt").launch("twice", 1, 4, [y])
    assert y.tolist() == [2.0] * 4


def test_host_compile_errors_name_the_source(tmp_path, monkeypatch):
    monkeypatch.setenv("TOPKGEN_CACHE_DIR", str(tmp_path))
    with pytest.raises(EmulationError, match=r"host compilation of 'broken' failed:\n(.|\n)*broken\.cu:1:49: error"):
        compile_source('extern "C" __global__ void k(float* y) { y[0] = undefined_name; }', name="broken")


def test_a_link_where_the_lock_folder_belongs_is_not_followed(tmp_path, monkeypatch):
    """The compile lock's folder (cache/locks) planted as a link elsewhere: the module still
    compiles and runs, unlocked, and nothing is created where the link points."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "locks").symlink_to(elsewhere)
    monkeypatch.setenv("TOPKGEN_CACHE_DIR", str(cache))
    source = 'extern "C" __global__ void third(float* y) { y[threadIdx.x] = 3.f; }\n'
    y = np.zeros(4, np.float32)
    compile_source(source, name="lock_link").launch("third", 1, 4, [y])
    assert y.tolist() == [3.0] * 4
    assert list(elsewhere.iterdir()) == []
