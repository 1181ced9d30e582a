"""Emulator costs: one fiber switch, one __syncthreads of a 1,024-thread block, and a
256-thread block running four barrier phases over 65,536 elements."""

from __future__ import annotations

import sys
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


if __name__ == "__main__":
    main()
