"""Emulator costs: one fiber switch, one __syncthreads of a 1,024-thread block, a 256-thread
block running four barrier phases over 65,536 elements, and what the traffic counters cost
on real top-k kernels: hooks compiled out (TK_COUNTERS=0), compiled in but off, and on."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import median_seconds  # noqa: E402

from topkgen.emulator import compile_source  # noqa: E402

SOURCE = r'''
extern "C" __global__ void empty(int rounds) {}
extern "C" __global__ void barriers(int rounds) {
  for (int i = 0; i < rounds; ++i) __syncthreads();
}
extern "C" __global__ void shuffles(int rounds, int* out) {
  int v = threadIdx.x;
  for (int i = 0; i < rounds; ++i) v = __shfl_xor_sync(0xffffffffu, v, 1);
  out[threadIdx.x] = v;
}
extern "C" __global__ void phases(const float* x, float* out, int n) {
  __shared__ float partial[256];
  float acc = 0.f;
  for (int phase = 0; phase < 4; ++phase) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc += x[i] * float(phase + 1);
    partial[threadIdx.x] = acc;
    __syncthreads();
    acc = partial[(threadIdx.x + 1) % blockDim.x];
    __syncthreads();
  }
  out[threadIdx.x] = acc;
}
'''


def main() -> None:
    module = compile_source(SOURCE, name="bench_emulator")
    rounds = 200
    base = median_seconds(lambda: module.launch("empty", 1, 1024, [np.int32(rounds)]))
    bar = median_seconds(lambda: module.launch("barriers", 1, 1024, [np.int32(rounds)]))
    per_barrier = (bar - base) / rounds
    per_switch = per_barrier / (2 * 1024)  # each thread switches out to the scheduler and back in
    out = np.zeros(32, np.int32)
    base32 = median_seconds(lambda: module.launch("empty", 1, 32, [np.int32(rounds)]))
    shfl = median_seconds(lambda: module.launch("shuffles", 1, 32, [np.int32(rounds), out]))
    x = np.random.default_rng(0).random(65536, dtype=np.float32)
    res = np.zeros(256, np.float32)
    phases = median_seconds(lambda: module.launch("phases", 1, 256, [x, res, np.int32(65536)]))
    print(f"launch overhead, 1,024-thread block:   {base * 1e3:8.2f} ms")
    print(f"__syncthreads, 1,024-thread block:     {per_barrier * 1e6:8.1f} us")
    print(f"fiber switch (in or out):              {per_switch * 1e9:8.1f} ns")
    print(f"__shfl_xor_sync, one warp:             {(shfl - base32) / rounds * 1e6:8.2f} us")
    print(f"256 threads, 4 barrier phases, 64 Ki:  {phases * 1e3:8.2f} ms")
    counter_costs()


REPEAT = 21
# (dtype, k, n, rows): a radix kernel with dynamic shared memory, a bfloat16 one, a register one
COUNTER_CASES = (("float32", 256, 131072, 4), ("bfloat16", 64, 16384, 16), ("float32", 16, 1024, 256))


def interleaved_medians(fns, repeat: int = REPEAT) -> list[float]:
    """Runs the functions in turn, `repeat` rounds after one warm-up round, so that a busy
    machine slows each of them alike."""
    samples: list[list[float]] = [[] for _ in fns]
    for round_ in range(repeat + 1):
        for fn, times in zip(fns, samples):
            start = time.perf_counter()
            fn()
            if round_:
                times.append(time.perf_counter() - start)
    return [statistics.median(t) for t in samples]


def counter_costs(cases=COUNTER_CASES, repeat: int = REPEAT) -> None:
    """Medians of the same launches, side by side, for each way of building the module
    (tests run a small case once)."""
    import ml_dtypes

    from topkgen import policy as pol
    from topkgen.build.render import render
    from topkgen.runtime import launch_arguments

    policy = pol.load()
    print(f"traffic counters, median of {repeat} interleaved launches (random normal rows):")
    print(f"  {'kernel':<40}{'rows':>5}{'compiled out':>14}{'off':>10}{'on':>10}{'off/out':>9}{'on/off':>8}")
    for dtype, k, n, rows in cases:
        spec = pol.select(policy, "sm_90", dtype, k, n).kernel
        source = render(spec)
        plain = compile_source(source, name=spec.name, defines=("TK_COUNTERS=0",))
        counted = compile_source(source, name=spec.name)
        x = np.random.default_rng(0).standard_normal((rows, n)).astype(
            np.float32 if dtype == "float32" else ml_dtypes.bfloat16)
        args = launch_arguments(spec, x, np.zeros((rows, k), x.dtype), np.zeros((rows, k), np.int64), rows, n, k, True)
        grid = (rows + spec.rows_per_block - 1) // spec.rows_per_block

        def run(module, counters):
            return lambda: module.launch(spec.name, grid, spec.threads, args, shared_bytes=spec.shared.bytes_for(n),
                                         workers=1, counters=counters)

        out, off, on = interleaved_medians([run(plain, False), run(counted, False), run(counted, True)], repeat)
        print(f"  {spec.name:<40}{rows:>5}{out * 1e3:>11.2f} ms{off * 1e3:>7.2f} ms{on * 1e3:>7.2f} ms"
              f"{off / out:>8.2f}x{on / off:>7.2f}x")


if __name__ == "__main__":
    main()
