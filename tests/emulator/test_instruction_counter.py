"""The warp-instruction counter (topkgen/emulator/instructions.py): small kernels counted by
hand from their SASS (tests/support/kernels/issue_counts.cu), -lineinfo leaving the SASS unchanged,
and the instrumentation leaving line numbers and the emulated results as they were.

Hand counts, sm_90, NVRTC 13.0 / nvdisasm 13.5 (the pinned wheels), 8 warps of 256 threads,
T trips; 'entry', 'loop' and 'exit' are the SASS instructions before the loop's label, from the
label to its backward branch, and after it up to EXIT (padding after EXIT never issues):
  counted_loop     10 + 6 T + 6 per warp
  one_lane_branch  12 (to the branch) + 1 (the lane's set-up) + 6 T + 7 per warp: one lane per
                   warp takes it, so every warp issues it
  uniform_exit     4 (to @P0 EXIT) on every warp; 7 + 1 + 6 T + 6 more on the 4 even warps
  barrier_loop     34 + 8 T + 5 per warp (the loop holds both BAR.SYNC)
  unrolled_shuffles  20 (5 SHFL of a loop NVRTC unrolled) + 19 R (BAR, 5 more SHFL) + 5 per
                   warp, R rounds of the kept loop
The test re-reads those block sizes from the SASS (labels and backward branches) rather than
trusting the numbers above, and checks the counter within 5% of them.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from topkgen.build.render import template_dir
from topkgen.emulator.instructions import Counter, instrument
from topkgen.emulator.sass import label_addresses, nvrtc_cubin, sass_text

KERNELS = Path(__file__).resolve().parents[1] / "support" / "kernels" / "issue_counts.cu"
WARPS, THREADS = 8, 256


@pytest.fixture(scope="module")
def counter() -> Counter:
    return Counter(KERNELS.read_text(), "issue_counts")


def _blocks(counter: Counter, kernel: str) -> dict[str, int]:
    """entry / loop / exit sizes of a kernel with one loop, read off its SASS: the loop runs
    from the target of its one backward branch to that branch; a conditional EXIT before the
    loop splits the entry ('early')."""
    own = [i for i in counter.instructions if i.function == kernel]
    last = max(i.address for i in own if i.opcode == "EXIT")
    own = [i for i in own if i.address <= last]  # the padding after EXIT (a self-branch, NOPs)
    back = _back_edges(counter, own)
    assert len(back) == 1, f"{kernel}: expected one loop in its SASS"
    (lo, hi), = back
    early = [i.address for i in own if i.text.startswith("@") and i.opcode == "EXIT"]
    out = {"entry": sum(i.address < lo for i in own), "loop": sum(lo <= i.address <= hi for i in own),
           "exit": sum(hi < i.address <= last for i in own)}
    if early:
        out["early"] = sum(i.address <= early[0] for i in own)
    return out


def _run(counter: Counter, kernel: str, *extra: int):
    x = np.arange(THREADS, dtype=np.int32)
    out = np.zeros(THREADS, np.int32)
    args = [x, out, *(np.int32(v) for v in extra)]
    c = counter.module().launch(kernel, 1, THREADS, args, counters=True)
    return counter.count(c, kernel).warp_instructions


@pytest.mark.parametrize("trips", [1, 7, 50])
def test_counted_loop(counter, trips):
    b = _blocks(counter, "counted_loop")
    expect = WARPS * (b["entry"] + trips * b["loop"] + b["exit"])
    assert _run(counter, "counted_loop", trips) == pytest.approx(expect, rel=0.05)


@pytest.mark.parametrize("trips", [3, 50])
def test_divergent_branch_taken_by_one_lane(counter, trips):
    """A warp issues a branch when any lane takes it: one lane of 32 costs the whole loop."""
    b = _blocks(counter, "one_lane_branch")
    expect = WARPS * (b["entry"] + trips * b["loop"] + b["exit"])
    assert _run(counter, "one_lane_branch", trips, 5) == pytest.approx(expect, rel=0.05)
    # no lane takes it (lane 40 does not exist): the warp issues up to the forward branch
    # around the loop, then from its target to EXIT
    own = [i for i in counter.instructions if i.function == "one_lane_branch"]
    labels = label_addresses(nvrtc_cubin(counter.source, counter.name, counter.arch, ["-lineinfo"]))
    skip = next(i for i in own if i.opcode == "BRA" and i.text.startswith("@P0"))
    target = labels[re.search(r"(\.L_x_\d+)", skip.text).group(1)]
    last = max(i.address for i in own if i.opcode == "EXIT")
    issued = sum(i.address <= skip.address or target <= i.address <= last for i in own)
    # Not within 5% here: the compiler evaluates the loop's first compare (`trips >= 1`, its
    # line inside the branch) with the branch's own condition, before the branch, so the
    # counter misses those 3 instructions and charges the branch's set-up (1) it skips: 17
    # of 18 per warp. A limit of the line mapping, documented in benchmarks/README.md.
    assert _run(counter, "one_lane_branch", trips, 40) == pytest.approx(WARPS * issued, rel=0.10)


@pytest.mark.parametrize("trips", [2, 50])
def test_warp_uniform_early_exit(counter, trips):
    b = _blocks(counter, "uniform_exit")
    expect = WARPS * b["early"] + WARPS // 2 * (b["entry"] - b["early"] + trips * b["loop"] + b["exit"])
    assert _run(counter, "uniform_exit", trips) == pytest.approx(expect, rel=0.05)


@pytest.mark.parametrize("trips", [1, 20])
def test_block_barrier_loop(counter, trips):
    b = _blocks(counter, "barrier_loop")
    assert sum("BAR.SYNC" in i.text for i in counter.instructions if i.function == "barrier_loop") == 2
    expect = WARPS * (b["entry"] + trips * b["loop"] + b["exit"])
    assert _run(counter, "barrier_loop", trips) == pytest.approx(expect, rel=0.05)


def test_hand_counts_quoted_in_the_docstring(counter):
    """The block sizes the module's docstring quotes are those of the pinned toolchain."""
    assert _blocks(counter, "counted_loop") == {"entry": 10, "loop": 6, "exit": 6}
    assert _blocks(counter, "barrier_loop") == {"entry": 34, "loop": 8, "exit": 5}


def test_lineinfo_leaves_the_sass_unchanged():
    """-lineinfo (the counter's compile) gives the same instructions as the bundle's compile,
    for every family's template."""
    from topkgen import policy
    from topkgen.build.render import render

    pol = policy.load()
    for dtype, k, n in (("float32", 256, 16384), ("bfloat16", 1024, 131072), ("float32", 16, 1024)):
        spec = policy.select(pol, "sm_90", dtype, k, n).kernel
        source = render(spec)
        plain = sass_text(nvrtc_cubin(source, spec.name, "sm_90"))
        with_lines = sass_text(nvrtc_cubin(source, spec.name, "sm_90", ["-lineinfo"]))
        assert plain == with_lines, spec.name
        assert len(plain) > 100


def test_instrumentation_keeps_lines_and_results():
    """The instrumented source has the same lines (each site is added on a line of its own
    block) and the emulated kernel gives the same answer and the same traffic counts."""
    from topkgen import policy
    from topkgen.runtime import reference
    from topkgen.emulator import compile_source
    from topkgen.build.render import render
    from topkgen.runtime import launch_arguments, launch_shared_bytes

    spec = policy.select(policy.load(), "sm_90", "float32", 64, 4096).kernel
    source = render(spec)
    inst = instrument(source)
    assert inst.source.count("\n") == source.count("\n")
    assert [re.sub(r"\s*::tk::WarpSite tk_ws_\d*\(\d+\);|\{ (?=::)| \}$", "", line) for line in
            inst.source.splitlines()][:5] == source.splitlines()[:5]
    x = np.random.default_rng(1).standard_normal((2, 4096)).astype(np.float32)
    results = []
    for text, name in ((source, spec.name), (inst.source, spec.name)):
        values, indices = np.zeros((2, 64), np.float32), np.zeros((2, 64), np.int64)
        c = compile_source(text, name=name).launch(spec.name, 2, spec.threads,
                                                   launch_arguments(spec, x, values, indices, 2, 4096, 64, True),
                                                   shared_bytes=launch_shared_bytes(spec, 4096), counters=True)
        results.append((values, indices, c.global_load_bytes, c.barriers, c.shared_atomics))
    assert np.array_equal(results[0][0], results[1][0]) and np.array_equal(results[0][1], results[1][1])
    assert results[0][2:] == results[1][2:]
    expect, _ = reference.topk(x, 64, largest=True)
    assert np.array_equal(reference.select_keys(results[1][0], True), reference.select_keys(expect, True))


# partial_unroll (a runtime trip count, no pragma): NVRTC 13.0 unrolls it LLVM's way, read
# off its SASS (per warp; T trips per lane, the same on every lane):
#   8 to the loop guard, 2 + 6 to the remainder test (T % 4), 5 + 6 per trip of a 1-copy
#   remainder loop, 2 to the T >= 4 test; then 10 of set-up, 2 + 35 per trip of a 16-copy
#   loop (while more than 12 trips are left), 5 + 18 for an 8-copy block (more than 4
#   left), 9 for a predicated 4-copy block, and 16 from the loop's end to EXIT.
#   T=8: 76, T=13: 87, T=32: 130, T=4: 58, T=1: 45.
# The counter charges each trip one copy of the body (68 copy instructions / 29 copies)
# and the guards and dispatch once per entry, taken or not: within 5% from 8 trips; at 4
# trips 66 (+14%) and at 1 trip 59 (+32%), the guards it cannot see skipped.
PARTIAL = {8: (76, 0.05), 13: (87, 0.05), 32: (130, 0.05), 4: (58, 0.15), 1: (45, 0.35)}


def test_partial_unroll_sass_is_the_hand_counted_one(counter):
    """The SASS the hand counts above were read from: 1 + 16 stores in the two loops
    (their back-edge ranges), 8 + 4 in the blocks after them, 29 in all."""
    own = [i for i in counter.instructions if i.function == "partial_unroll"]
    ranges = _back_edges(counter, own)
    stores = [i.address for i in own if i.opcode == "STS"]
    assert sorted(sum(lo <= a <= hi for a in stores) for lo, hi in ranges) == [1, 16]
    assert len(stores) == 29
    assert counter.map.copies[next(s.id for s in counter.inst.sites if s.kind == "loop"
                                    and s.first_line == _line_of(counter, "i += 256) s[i] = i;"))] == (17, 12)


def _back_edges(counter: Counter, own: list) -> list[tuple[int, int]]:
    """(target, branch) of every backward branch among one function's instructions."""
    labels = label_addresses(nvrtc_cubin(counter.source, counter.name, counter.arch, ["-lineinfo"]))
    targets = [(labels[m.group(1)], i.address) for i in own
               if i.opcode == "BRA" and (m := re.search(r"(\.L_x_\d+)", i.text))]
    return [(lo, hi) for lo, hi in targets if lo < hi]


def _line_of(counter: Counter, text: str) -> int:
    return next(n for n, line in enumerate(counter.source.splitlines(), 1) if text in line)


@pytest.mark.parametrize("trips", sorted(PARTIAL))
def test_partially_unrolled_loop(counter, trips):
    """A loop the compiler unrolled 16, 8 and 4 times with a remainder loop: each trip is
    charged one copy of the body, not every copy (the old rule charged block_sort's
    remainder copies on every pass: 7.40 warp instructions per key instead of 5.8)."""
    expect, rel = PARTIAL[trips]
    x = np.arange(THREADS, dtype=np.int32)
    out = np.zeros(THREADS, np.int32)
    c = counter.module().launch("partial_unroll", 1, THREADS, [x, out, np.int32(trips)], counters=True)
    assert np.array_equal(out, ((np.arange(THREADS) * 7) & 255) + x)
    assert counter.count(c, "partial_unroll").warp_instructions == pytest.approx(WARPS * expect, rel=rel)


# pragma_unroll4 (`#pragma unroll 4`, a runtime trip count), read off its SASS (per warp, T
# trips): 16 to the loop guard, 7 to the T >= 4 test, 3 of set-up, 26 per trip of a 4-copy
# loop, 1 to the remainder test, 11 per trip of a 1-copy remainder loop, 5 to EXIT.
#   T=1: 40, T=4: 58, T=8: 84, T=32: 240.
# The counter charges each trip a fifth of the 5 copies (7.2 a trip against 6.5 in the
# 4-copy loop): +8% at 8 trips, +10% at 32. It once took the pragma for a full unroll and
# charged the loop once per entry: 69 at every T.
PRAGMA4 = {1: (40, 0.05), 4: (58, 0.08), 8: (84, 0.1), 32: (240, 0.12)}


def test_pragma_unroll_sass_is_the_hand_counted_one(counter):
    """The SASS the hand counts above were read from: 4 + 1 loads in the two loops' back-edge
    ranges, none outside them; the counter finds 5 copies."""
    own = [i for i in counter.instructions if i.function == "pragma_unroll4"]
    loads = [i.address for i in own if i.opcode == "LDS"]
    assert sorted(sum(lo <= a <= hi for a in loads) for lo, hi in _back_edges(counter, own)) == [1, 4]
    assert len(loads) == 5
    assert counter.map.copies[next(s.id for s in counter.inst.sites if s.kind == "loop"
                                    and s.first_line == _line_of(counter, "acc += s[(threadIdx.x + i) & 255] ^ i;"))] == (5, 0)


@pytest.mark.parametrize("trips", sorted(PRAGMA4))
def test_a_loop_under_pragma_unroll_n_is_charged_per_trip(counter, trips):
    expect, rel = PRAGMA4[trips]
    x = np.arange(THREADS, dtype=np.int32)
    out = np.zeros(THREADS, np.int32)
    c = counter.module().launch("pragma_unroll4", 1, THREADS, [x, out, np.int32(trips)], counters=True)
    t = np.arange(THREADS)
    assert np.array_equal(out, sum(((t + i) & 255) ^ i for i in range(trips)))
    assert counter.count(c, "pragma_unroll4").warp_instructions == pytest.approx(WARPS * expect, rel=rel)


def test_copies_are_told_apart_when_their_line_information_differs():
    """The large-k path's output loop (`for (long long i = t; i < k; i += THREADS) emit(...)`,
    float32 and bfloat16 alike) holds 10 copies of its body in its back-edge ranges, one load
    of its candidate (on the loop's own line) in each. NVRTC names one line for the NaN payload's
    load in some copies and another in the rest; the counter took the fewest of one line for
    the number of copies and charged each trip every copy (1 x 163840 k=40000 bfloat16
    unsorted: 4.65 warp instructions per key, where the SASS of an older cubin with the same
    loop, other lines, had counted 2.99)."""
    from topkgen import policy
    from topkgen.build.render import render

    spec = policy.large_kernel(policy.load(), "sm_90", "bfloat16", "fast")
    counter = Counter(render(spec), spec.name)
    line = _line_of(counter, "for (long long i = t; i < k; i += THREADS)")
    site = next(s.id for s in counter.inst.sites if s.kind == "loop" and s.first_line == line)
    own = [i for i in counter.instructions if i.function == spec.name]
    ranges = counter.map.ranges[site]
    candidates = [i for i in own if i.opcode == "LDG.E.64" and i.chain[0][1] == line]
    inside = sum(any(lo <= i.address <= hi for lo, hi in ranges) for i in candidates)
    payload_lines = {i.chain[1][1] for i in own if i.opcode == "LDG.E.U16" and len(i.chain) > 2
                     and i.chain[2][1] == line and any(lo <= i.address <= hi for lo, hi in ranges)}
    assert inside == 10 and len(payload_lines) == 2
    assert counter.map.copies[site] == (inside, len(candidates) - inside)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_resident_kernel_issues_under_half_its_issue_27_count(dtype):
    """Issue 27, 2(b) held the counter on topk_radix_dyn_k256_fast at 16384, K=256, N(0,1)
    (the rows bench-kernels runs) within 20% of the review's census of that kernel. Issue 28
    rewrote its histogram passes, appends, gather and sort; the count now stays below half of
    the figure benchmarks/results/bench_kernels_28_before_recounted.json records for the kernel
    of issue 27, counted by today's counter (which no longer charges a block twice per fully
    unrolled loop in it)."""
    import json

    rows, n, k = 4, 16384, 256
    spec, counter, x, c = _count_k256_fast(dtype, rows, n)
    per_key = counter.count(c, spec.name).warp_instructions / (rows * n)
    before = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "bench_kernels_28_before_recounted.json").read_text())
    (was,) = [r["warp_instructions_per_key"] for r in before["rows"]
              if (r["set"], r["dtype"], r["n"], r["k"], r["data"]) == ("seed grid", dtype, n, k, "normal")]
    assert per_key < 0.5 * was


def test_each_instruction_is_charged_its_share_of_the_census():
    """Census.by_instruction, which benchmarks/kernel_sites.py sums by line and opcode, holds
    every SASS instruction that can issue once, adds up to the census, and summed by each
    instruction's innermost site gives by_site."""
    spec, counter, x, c = _count_k256_fast("float32", 2, 16384)
    census = counter.count(c, spec.name)
    assert len(census.by_instruction) == census.static_instructions
    assert sum(census.by_instruction.values()) == pytest.approx(census.warp_instructions, rel=1e-9)
    by_site: dict[int, float] = {}
    for ins, n in census.by_instruction.items():
        path = counter.map.path_of(ins)
        if path:
            by_site[path[-1]] = by_site.get(path[-1], 0.0) + n
    assert by_site == pytest.approx(dict(census.by_site), rel=1e-9)
    assert census.by_site[next(s.id for s in counter.inst.sites if s.kind == "function"
                               and "void hist_add(" in counter.inst.source.splitlines()[s.first_line - 1])] > 0


@pytest.mark.parametrize("rounds", [1, 6])
def test_fully_unrolled_loops_are_charged_once_per_trip(counter, rounds):
    """unrolled_shuffles: two butterflies the compiler unrolls fully on its own (one in the
    kernel's body, one in a kept loop of `rounds` trips). Each SASS copy of their bodies runs
    once per execution of the enclosing block, and so does the rest of that block: the SHFL
    charge is the emulator's own count of warp shuffles, the block barrier's and the global
    load's and store's are their blocks' warp executions (the fold once added an unrolled
    loop's executions onto its parent's own: twice each)."""
    unrolled = [s.id for s in counter.inst.sites if s.kind == "loop" and s.function == _kernel_site(counter)
                and s.first_line == s.last_line]
    assert len(unrolled) == 2 and set(unrolled) <= counter.map.dropped
    x = np.arange(THREADS, dtype=np.int32)
    out = np.zeros(THREADS, np.int32)
    c = counter.module().launch("unrolled_shuffles", 1, THREADS, [x, out, np.int32(rounds)], counters=True)
    assert c.shuffles == WARPS * 5 * (1 + rounds)  # the emulator counts warp instructions
    shfl = counter.count(c, "unrolled_shuffles", "SHFL")
    assert shfl.static_instructions == 10
    assert shfl.warp_instructions == c.shuffles
    bar = counter.count(c, "unrolled_shuffles", "BAR")
    assert c.barriers == rounds and bar.warp_instructions == WARPS * c.barriers * bar.static_instructions
    for opcode in ("LDG", "STG"):
        census = counter.count(c, "unrolled_shuffles", opcode)
        assert census.static_instructions == 1
        assert census.warp_instructions == c.warp_sites[(_kernel_site(counter),)] == WARPS
    b = _blocks(counter, "unrolled_shuffles")
    total = counter.count(c, "unrolled_shuffles").warp_instructions
    assert total == WARPS * (b["entry"] + rounds * b["loop"] + b["exit"])


def _kernel_site(counter: Counter) -> int:
    return next(s.id for s in counter.inst.sites if s.kind == "function"
                and s.first_line == _line_of(counter, "void unrolled_shuffles("))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_stream_rounds_are_charged_per_round(dtype):
    """The radix kernel reads a row longer than its shared memory once, in rounds of an
    endless loop (`for (;;)`, a round per refill of its buffer). NVRTC has named a line of a
    fully unrolled loop inside it for that loop's backward branch, so the counter found no
    back-edge of its own, took it as unrolled in full and divided everything in it by its
    rounds (the float32 kernel: 512 warp loads charged for 1024, 0.39 warp instructions per
    key for 0.74). Every element is loaded once, in 16-byte vectors: the LDG charge is the
    emulator's bytes over 16 bytes a lane and 32 lanes a warp instruction."""
    from topkgen.policy.selection import streams

    spec, counter, x, c = _count_k256_fast(dtype, 1, 131072)
    assert streams(spec, 256)
    assert c.global_load_bytes == x.nbytes  # read once, no NaN to read again
    loop = [s.id for s in counter.inst.sites if s.kind == "loop"
            and "for (;;)" in counter.inst.source.splitlines()[s.first_line - 1]]
    assert len(loop) == 1 and loop[0] not in counter.map.dropped
    assert counter.count(c, spec.name, "LDG").warp_instructions == x.nbytes // 16 // 32


def _count_k256_fast(dtype: str, rows: int, n: int):
    """The default policy's sm_90 kernel for K=256 fast at n, its counter, N(0,1) rows and
    the counted launch of its instrumented module on them."""
    import ml_dtypes

    from topkgen import policy
    from topkgen.build.render import render
    from topkgen.runtime import launch_arguments, launch_shared_bytes

    k = 256
    spec = policy.select(policy.load(), "sm_90", dtype, k, n).kernel
    assert spec.name.startswith("topk_radix_dyn_k256_fast_")
    counter = Counter(render(spec), spec.name)
    x = np.random.default_rng(n + k).standard_normal((rows, n)).astype(
        np.float32 if dtype == "float32" else ml_dtypes.bfloat16)
    values, indices = np.zeros((rows, k), x.dtype), np.zeros((rows, k), np.int64)
    c = counter.module().launch(spec.name, rows, spec.threads,
                                launch_arguments(spec, x, values, indices, rows, n, k, True),
                                shared_bytes=launch_shared_bytes(spec, n), counters=True)
    return spec, counter, x, c


@pytest.mark.parametrize("seed", [3, 4])
def test_a_loop_copied_by_a_full_unroll_is_charged_every_trip(counter, seed):
    """pieces_walk: a bit walk (a data-dependent trip count) inside a loop unrolled fully,
    4 copies of the walk in SASS, each with its own back-edge. Each warp trip of a walk
    issues one STS, so the STS charge is the sum over warps and pieces of the busiest lane's
    bits. The counter once took the 4 copies for a walk unrolled 4 times and charged a
    quarter of that (the radix stream's appends, a walk per piece: an eighth)."""
    x = np.random.default_rng(seed).integers(0, 16, 4 * THREADS).astype(np.int32)
    out = np.zeros(THREADS, np.int32)
    c = counter.module().launch("pieces_walk", 1, THREADS, [x, out, np.int32(0)], counters=True)
    masks = x.reshape(4, THREADS).tolist()
    columns = list(zip(*masks))  # a thread's 4 masks
    first = [next(((m & -m).bit_length() + u for u, m in enumerate(col) if m), None) for col in columns]
    slots = [sum(bin(m).count("1") for m in col) for col in columns]
    assert all(out[t] == slots[t] + first[t] for t in range(THREADS) if first[t] is not None)
    bits = np.array([bin(int(v)).count("1") for v in x]).reshape(4, WARPS, 32)
    sts = counter.count(c, "pieces_walk", "STS")
    assert sts.static_instructions == 4
    assert sts.warp_instructions == bits.max(axis=2).sum()


@pytest.mark.parametrize("up", [0, 1])
def test_copies_of_one_function_in_two_arms_are_charged_for_the_arm_taken(counter, up):
    """direction_copies: butterfly<true> and butterfly<false> share their source lines, one
    in each arm of an if, as the radix kernels' copies per direction do. Only the arm taken
    runs, so the SHFL charge is the emulator's own count of warp shuffles; SASS holds both
    copies (10 SHFL). Written as one line (`up ? f<true>() : f<false>()`) the copies have
    no site of their own, and both were charged for each call (the first per-direction
    stream counted 1.47 warp instructions per key for 0.96)."""
    rounds = 3
    x = np.arange(THREADS, dtype=np.int32)
    out = np.zeros(THREADS, np.int32)
    c = counter.module().launch("direction_copies", 1, THREADS, [x, out, np.int32(rounds), np.int32(up)], counters=True)
    assert c.shuffles == WARPS * 5 * rounds
    shfl = counter.count(c, "direction_copies", "SHFL")
    assert shfl.static_instructions == 10
    assert shfl.warp_instructions == c.shuffles


def test_no_template_writes_a_visitor_inside_its_call():
    """A lambda written inside a call (`row.for_each([&](...) {...})`) starts on the call's
    line, so the counter's path for the call's inlined code (a line of the caller) resolves to
    the lambda's site, which the caller's blocks never enter: those instructions are charged
    as the lambda's alone (a NaN scan tried at stop 55, written so, counted 0.0017 warp
    instructions a key where, named on a line of its own, it counted 0.053). The templates
    name every visitor on a line of its own."""
    inline_visitor = re.compile(r"[(,]\s*\[[^\]]*\]\s*\(")
    offenders = [f"{path.name}:{number}" for path in sorted(template_dir().iterdir()) if path.is_file()
                 for number, line in enumerate(path.read_text().splitlines(), 1) if inline_visitor.search(line)]
    assert offenders == []


@pytest.mark.parametrize("rounds", [1, 4])
def test_a_lambda_with_no_parameter_list_is_charged_per_call(counter, rounds):
    """captured_lambda: a butterfly in `[&] { ... }`, called once a round. The instrumenter
    took only a `)` before a body's brace for a function, so such a lambda had no site, and
    the path of its inlined code (its own level, then the caller's) matched no path the
    emulator saw: nothing was charged. The radix kernels' appends from a resident row's copy
    are written so (StepMarks::append through `append_marked`): 16384 K=256 normal float32
    counted 0.57 warp instructions per key for 0.73."""
    x = np.arange(THREADS, dtype=np.int32)
    out = np.zeros(THREADS, np.int32)
    c = counter.module().launch("captured_lambda", 1, THREADS, [x, out, np.int32(rounds)], counters=True)
    assert c.shuffles == WARPS * 5 * rounds
    shfl = counter.count(c, "captured_lambda", "SHFL")
    assert shfl.static_instructions == 5
    assert shfl.warp_instructions == c.shuffles


@pytest.mark.parametrize("rounds", [1, 5])
def test_a_block_only_the_gpu_compiles_is_charged_as_its_enclosing_one(counter, rounds):
    """device_arm: the shuffle lies in an `if constexpr` arm under `#if defined(__CUDA_ARCH__)`;
    the emulator runs the #else. The instrumenter gave that arm a site, which the emulator
    never entered, so the shuffle's SASS was charged nothing (a compare and a predicated or a
    key in the resident collect, so written, took 16384 K=256 normal float32 from 0.684 to a
    counted 0.622 warp instructions per key). The arm's lines now belong to the function."""
    x = np.arange(THREADS, dtype=np.int32)
    out = np.zeros(THREADS, np.int32)
    c = counter.module().launch("device_arm", 1, THREADS, [x, out, np.int32(rounds)], counters=True)
    assert c.shuffles == WARPS * rounds
    shfl = counter.count(c, "device_arm", "SHFL")
    assert shfl.static_instructions == 1
    assert shfl.warp_instructions == c.shuffles


def test_no_site_lies_where_only_the_gpu_compiles():
    """The instrumenter's sites, over a source with each form of a GPU-only arm: none lies in
    one, and the host arms and the code around them keep theirs."""
    source = "\n".join([
        "__device__ int f(int v) {",                                   # 1 function
        "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800",
        "  if (v) {", "    v += 1;", "  }",                             # 3-5 GPU only
        "#else",
        "  if (v) {", "    v += 2;", "  }",                             # 7-9 host
        "#endif",
        "#ifndef __CUDA_ARCH__",
        "  for (int i = 0; i < v; ++i) {", "    v -= i;", "  }",       # 12-14 host
        "#else",
        "  for (int i = 0; i < v; ++i) {", "    v += i;", "  }",       # 16-18 GPU only
        "#endif",
        "#if (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900) || !defined(__CUDA_ARCH__)",
        "  while (v > 3) {", "    v >>= 1;", "  }",                    # 21-23 both
        "#endif",
        "  return v;",
        "}",
    ])
    sites = {(s.kind, s.first_line) for s in instrument(source).sites}
    assert sites == {("function", 1), ("branch", 8), ("loop", 12), ("loop", 21)}


@pytest.mark.parametrize("rounds", [1, 3])
def test_a_function_kept_as_a_call_is_charged_once_per_call(counter, rounds):
    """called_function: a `__noinline__` butterfly, called `rounds` times by every warp and once
    more by the 4 even warps. NVRTC keeps one copy after the kernel's EXIT whose line
    information names the function's lines only, so its paths start at its own site: the
    counter once matched them to no path the emulator saw (charged nothing) and cut the copy
    off as padding past the EXIT. Each of its instructions up to its RET issues once a call."""
    x = np.arange(THREADS, dtype=np.int32)
    out = np.zeros(THREADS, np.int32)
    c = counter.module().launch("called_function", 1, THREADS, [x, out, np.int32(rounds)], counters=True)
    calls = WARPS * rounds + WARPS // 2
    assert c.shuffles == 5 * calls
    shfl = counter.count(c, "called_function", "SHFL")
    assert shfl.static_instructions == 5
    assert shfl.warp_instructions == c.shuffles
    census = counter.count(c, "called_function")
    body = {ins: n for ins, n in census.by_instruction.items() if ins.callee}
    assert body and body.keys() == {ins for ins in census.by_instruction if "called_butterfly" in ins.callee}
    assert set(body.values()) == {calls}
    assert max(body, key=lambda i: i.address).opcode.startswith("RET")
    assert census.never_run == 0


@pytest.mark.parametrize("lanes", [31, 32])
def test_a_warp_aggregated_atomic_scans_only_on_a_full_warp(counter, lanes):
    """aggregated_append: ptxas tests whether every lane is active (VOTE.ANY, ISETP against
    -1) and only then runs its scan and one atomic for the warp; with 31 lanes each lane does
    its own. The scan's instructions are charged the block's full-warp executions (every warp
    at 32 lanes, none at 31), the vote and the test every execution: the counter once charged
    the scan to every warp that appended, 17 of the 24 instructions of the radix kernels'
    appends."""
    scan = {a for f, a in counter.map.full_warp if f == "aggregated_append"}
    own = [i for i in counter.instructions if i.function == "aggregated_append"]
    ops = {i.opcode.split(".")[0] for i in own if i.address in scan}
    assert len(scan) >= 10 and {"SHFL", "ATOMS"} <= ops
    x = np.arange(THREADS, dtype=np.int32)
    out = np.zeros(THREADS, np.int32)
    c = counter.module().launch("aggregated_append", 1, THREADS, [x, out, np.int32(lanes)], counters=True)
    census = counter.count(c, "aggregated_append")
    charged = {i.address: n for i, n in census.by_instruction.items() if i.address in scan}
    assert set(charged.values()) == {WARPS if lanes == 32 else 0}
    vote = counter.count(c, "aggregated_append", "VOTE")
    assert vote.static_instructions == 1 and vote.warp_instructions == WARPS
    # either way, each appending lane of a warp got a slot of its own
    for w in range(WARPS):
        got = np.sort(out[w * 32:w * 32 + lanes])
        assert len(set(got)) == lanes
