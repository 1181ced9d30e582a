// Small kernels whose warp instructions can be counted by hand from their SASS
// (tests/emulator/test_instruction_counter.py quotes the SASS it counted).

// A counted loop: `trips` iterations, the same for every lane.
extern "C" __global__ void counted_loop(const int* in, int* out, int trips) {
  int acc = in[threadIdx.x];
#pragma unroll 1
  for (int i = 0; i < trips; ++i) {
    acc = acc * 3 + (acc >> 7) + i;
  }
  out[threadIdx.x] = acc;
}

// A branch one lane of each warp takes: a loop of `trips` iterations on lane `lane` only.
extern "C" __global__ void one_lane_branch(const int* in, int* out, int trips, int lane) {
  int acc = in[threadIdx.x];
  if ((threadIdx.x & 31) == unsigned(lane)) {
#pragma unroll 1
    for (int i = 0; i < trips; ++i) {
      acc = acc * 5 + (acc >> 3) + i;
    }
  }
  out[threadIdx.x] = acc;
}

// A warp-uniform early exit: warps whose index is odd return at once.
extern "C" __global__ void uniform_exit(const int* in, int* out, int trips) {
  if ((threadIdx.x >> 5) & 1) return;
  int acc = in[threadIdx.x];
#pragma unroll 1
  for (int i = 0; i < trips; ++i) {
    acc = acc * 7 + (acc >> 5) + i;
  }
  out[threadIdx.x] = acc;
}

// A block barrier in a loop: `trips` rounds of a shared-memory exchange.
extern "C" __global__ void barrier_loop(const int* in, int* out, int trips) {
  __shared__ int s[1024];
  int acc = in[threadIdx.x];
#pragma unroll 1
  for (int i = 0; i < trips; ++i) {
    s[threadIdx.x] = acc;
    __syncthreads();
    acc += s[(threadIdx.x + 1) % blockDim.x];
    __syncthreads();
  }
  out[threadIdx.x] = acc;
}

// A loop the compiler unrolls on its own (a runtime trip count, no pragma): lanes store
// `trips` words each, stride 256, into shared memory.
extern "C" __global__ void partial_unroll(const int* in, int* out, int trips) {
  __shared__ int s[256 * 32];
  const int n = trips * 256;
  for (int i = int(threadIdx.x); i < n; i += 256) s[i] = i;
  __syncthreads();
  out[threadIdx.x] = s[(threadIdx.x * 7) & 255] + in[threadIdx.x];
}

// Shuffles in loops the compiler unrolls fully on its own (constant trip counts, no pragma):
// a butterfly of 5 rounds in the kernel's body, and another one per trip of a kept loop of
// `rounds` trips whose other work is a block barrier.
extern "C" __global__ void unrolled_shuffles(const int* in, int* out, int rounds) {
  int acc = in[threadIdx.x];
  for (int d = 16; d > 0; d >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, d);
#pragma unroll 1
  for (int r = 0; r < rounds; ++r) {
    __syncthreads();
    for (int d = 1; d < 32; d <<= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, d) + r;
  }
  out[threadIdx.x] = acc;
}

// A loop with a data-dependent trip count inside a loop the compiler unrolls fully: each of
// the 4 pieces walks the set bits of its own mask (a lane's 0-4 keys to append, as the radix
// stream's appends do), so its SASS holds 4 copies of the walk, one back-edge each, and a
// warp runs one copy per piece for as many trips as its busiest lane has bits.
extern "C" __global__ void pieces_walk(const int* in, int* out, int trips) {
  __shared__ int s[256 * 17];
  int slot = 0;
  const unsigned t = threadIdx.x;
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const unsigned bits = unsigned(in[u * 256 + t]) & 15u;
    for (unsigned b = bits; b != 0u; b &= b - 1u) s[slot++ * 256 + t] = __ffs(int(b)) + u;
  }
  __syncthreads();
  out[t] = slot + s[t] + trips;
}

// One function compiled twice (a template per direction), each copy in an arm of its own:
// only the arm taken runs. Each copy is a butterfly of `rounds` rounds of 5 shuffles.
template <bool UP>
__device__ __forceinline__ int butterfly(int acc, int rounds) {
#pragma unroll 1
  for (int r = 0; r < rounds; ++r)
    for (int d = 1; d < 32; d <<= 1) acc = UP ? acc + __shfl_xor_sync(0xffffffffu, acc, d) : acc - __shfl_xor_sync(0xffffffffu, acc, d);
  return acc;
}
extern "C" __global__ void direction_copies(const int* in, int* out, int rounds, int up) {
  int acc = in[threadIdx.x];
  if (up) {
    acc = butterfly<true>(acc, rounds);
  } else {
    acc = butterfly<false>(acc, rounds);
  }
  out[threadIdx.x] = acc;
}

// A loop under `#pragma unroll 4` with a runtime trip count: NVRTC keeps a loop of four
// copies of the body, each trip of which runs four of the source's trips.
extern "C" __global__ void pragma_unroll4(const int* in, int* out, int trips) {
  __shared__ int s[256];
  s[threadIdx.x] = in[threadIdx.x];
  __syncthreads();
  int acc = 0;
#pragma unroll 4
  for (int i = 0; i < trips; ++i) acc += s[(threadIdx.x + i) & 255] ^ i;
  out[threadIdx.x] = acc;
}

// A lambda with no parameter list (`[&] { ... }`, as the radix kernels write their appends and
// span reductions), called in a loop of `rounds` trips: its body is a function block of its
// own, entered once a call, as a lambda with parameters is.
extern "C" __global__ void captured_lambda(const int* in, int* out, int rounds) {
  int acc = in[threadIdx.x];
  auto reduce = [&] {
    for (int d = 16; d > 0; d >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, d);
  };
#pragma unroll 1
  for (int r = 0; r < rounds; ++r) {
    __syncthreads();
    reduce();
  }
  out[threadIdx.x] = acc;
}

// A shuffle the GPU's compile takes from an `if constexpr` arm under `#if defined(__CUDA_ARCH__)`
// (as the templates write their asm), the emulator from the #else: `rounds` calls, one
// shuffle each. The arm is a braced block the emulator never compiles.
template <bool UP>
__device__ __forceinline__ int device_arm_shuffle(int v) {
#if defined(__CUDA_ARCH__)
  if constexpr (UP) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
  } else {
    v -= __shfl_xor_sync(0xffffffffu, v, 1);
  }
  return v;
#else
  const int other = __shfl_xor_sync(0xffffffffu, v, 1);
  return UP ? v + other : v - other;
#endif
}

extern "C" __global__ void device_arm(const int* in, int* out, int rounds) {
  int acc = in[threadIdx.x];
#pragma unroll 1
  for (int r = 0; r < rounds; ++r) acc = device_arm_shuffle<true>(acc);
  out[threadIdx.x] = acc;
}

// A function NVRTC keeps as a call (`__noinline__`): one SASS copy after the kernel's EXIT,
// ending in RET, whose line information names its own lines only. It is called `rounds`
// times in a loop and once more in a branch the even warps take; each call is a butterfly of
// 5 shuffles (unrolled) inside a helper inlined into it.
__device__ __forceinline__ int called_butterfly_step(int acc) {
  for (int d = 1; d < 32; d <<= 1) acc += __shfl_xor_sync(0xffffffffu, acc, d);
  return acc;
}

__device__ __noinline__ int called_butterfly(int acc) {
  return called_butterfly_step(acc) ^ 1;
}

extern "C" __global__ void called_function(const int* in, int* out, int rounds) {
  int acc = in[threadIdx.x];
#pragma unroll 1
  for (int r = 0; r < rounds; ++r) {
    acc = called_butterfly(acc);
  }
  if (((threadIdx.x >> 5) & 1) == 0) {
    acc = called_butterfly(acc + 3);
  }
  out[threadIdx.x] = acc;
}

// An append whose slot is an atomicAdd's result, in a block the lanes below `lanes` of each
// warp enter: ptxas wraps the atomic in a warp aggregation whose scan (shuffles, one lane's
// atomic for all) runs only where every lane of the warp is active; otherwise each lane does
// its own atomic.
extern "C" __global__ void aggregated_append(const int* in, int* out, int lanes) {
  __shared__ int counter;
  if (threadIdx.x == 0) counter = 0;
  __syncthreads();
  if (int(threadIdx.x & 31u) < lanes) {
    const int slot = atomicAdd(&counter, (in[threadIdx.x] & 3) + 1);
    out[threadIdx.x] = slot;
  }
}
