// Small kernels that exercise every built-in of the SIMT emulator.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

__device__ __forceinline__ unsigned lane_id() { return threadIdx.x & 31u; }

// out[t*8 + j]: shuffles of v = 100 + lane, widths 32 and 8.
extern "C" __global__ void shuffles(int* out) {
  unsigned t = threadIdx.x;
  int v = 100 + int(lane_id());
  out[t * 8 + 0] = __shfl_sync(0xffffffffu, v, 5);
  out[t * 8 + 1] = __shfl_sync(0xffffffffu, v, 3, 8);
  out[t * 8 + 2] = __shfl_up_sync(0xffffffffu, v, 2);
  out[t * 8 + 3] = __shfl_up_sync(0xffffffffu, v, 2, 8);
  out[t * 8 + 4] = __shfl_down_sync(0xffffffffu, v, 3);
  out[t * 8 + 5] = __shfl_down_sync(0xffffffffu, v, 3, 8);
  out[t * 8 + 6] = __shfl_xor_sync(0xffffffffu, v, 1);
  out[t * 8 + 7] = __shfl_xor_sync(0xffffffffu, v, 4, 8);
}

// 64-bit and float payloads travel through shuffles intact.
extern "C" __global__ void shuffle_wide(unsigned long long* out64, float* outf) {
  unsigned long long v = (0x1234567800000000ull | lane_id()) << 1;
  out64[threadIdx.x] = __shfl_xor_sync(0xffffffffu, v, 31);
  outf[threadIdx.x] = __shfl_down_sync(0xffffffffu, float(lane_id()) * 0.5f, 1);
}

// out[t*5 + j]: votes, active mask, and the block-wide barrier reductions.
extern "C" __global__ void votes(const int* pred, unsigned* out) {
  unsigned t = threadIdx.x;
  int p = pred[t];
  out[t * 6 + 0] = __ballot_sync(0xffffffffu, p);
  out[t * 6 + 1] = unsigned(__any_sync(0xffffffffu, p));
  out[t * 6 + 2] = unsigned(__all_sync(0xffffffffu, p));
  out[t * 6 + 3] = unsigned(__syncthreads_count(p));
  out[t * 6 + 4] = unsigned(__syncthreads_and(p)) | (unsigned(__syncthreads_or(p)) << 1);
  __syncwarp();
  out[t * 6 + 5] = __activemask();
}

// Half warps vote separately with disjoint masks.
extern "C" __global__ void subwarp(int* out) {
  unsigned lane = lane_id();
  unsigned mask = lane < 16 ? 0x0000ffffu : 0xffff0000u;
  out[threadIdx.x] = __shfl_sync(mask, int(lane) * 10, lane < 16 ? 0 : 16);
  __syncwarp(mask);
}

// Shared and global atomics, 32 and 64 bit. g: [add, sub, max, min, or, and, exch-count, cas-count]
extern "C" __global__ void atomics(int* g, unsigned long long* g64, float* gf, int* shared_out) {
  __shared__ int s[8];
  __shared__ unsigned long long s64;
  unsigned t = threadIdx.x;
  if (t < 8) s[t] = (t == 3) ? 1 << 30 : (t == 5 ? -1 : 0);
  if (t == 0) s64 = 0;
  __syncthreads();
  atomicAdd(&s[0], int(t));
  atomicSub(&s[1], 2);
  atomicMax(&s[2], int(t) * 3);
  atomicMin(&s[3], int(t) + 7);
  atomicOr(&s[4], 1 << (t % 31));
  atomicAnd(&s[5], ~(1 << (t % 31)));
  if (atomicExch(&s[6], 1) == 0) atomicAdd(&s[7], 1);
  atomicAdd(&s64, 1ull << 33);
  __syncthreads();
  if (t < 8) shared_out[t] = s[t];
  if (t == 8) shared_out[8] = int(s64 >> 33);
  atomicAdd(&g[0], 1);
  atomicSub(&g[1], 1);
  atomicMax(&g[2], int(blockIdx.x * blockDim.x + t));
  atomicMin(&g[3], -int(blockIdx.x * blockDim.x + t));
  atomicOr((unsigned*)&g[4], 1u << blockIdx.x);
  atomicAnd((unsigned*)&g[5], ~(1u << blockIdx.x));
  int old = atomicCAS(&g[6], 0, int(blockIdx.x) + 1);
  if (old == 0) atomicAdd(&g[7], 1);
  atomicAdd(&g64[0], 3ull);
  atomicMax(&g64[1], (unsigned long long)(blockIdx.x) << 40);
  atomicAdd(&gf[0], 0.5f);
  atomicExch(&gf[1], 2.0f);
  __threadfence();
  __threadfence_block();
  __threadfence_system();
}

// Bit intrinsics, reinterpretation, __ldg; out[t*12 + j].
extern "C" __global__ void bits(const unsigned* x, unsigned* out) {
  unsigned t = threadIdx.x, v = __ldg(&x[t]);
  unsigned long long w = (unsigned long long)v << 20 | v;
  unsigned* o = out + t * 12;
  o[0] = __popc(v);
  o[1] = __popcll(w);
  o[2] = __clz(int(v));
  o[3] = __clzll((long long)w);
  o[4] = __ffs(int(v));
  o[5] = __ffsll((long long)w);
  o[6] = __brev(v);
  o[7] = unsigned(__brevll(w) >> 32);
  o[8] = __byte_perm(v, 0xa1b2c3d4u, 0x5140);
  o[9] = __float_as_uint(__uint_as_float(v));
  o[10] = unsigned(__float_as_int(1.0f));
  o[11] = unsigned(__double_as_longlong(__longlong_as_double((long long)v)));
}

// Vector types, dynamic shared memory, 3-D indices, launch bounds, restrict, unroll.
extern "C" __global__ void __launch_bounds__(128, 2) vectors(const float4* __restrict__ x, float* __restrict__ out) {
  extern __shared__ __align__(16) unsigned char smem[];
  float4* tile = reinterpret_cast<float4*>(smem);
  unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  unsigned nt = blockDim.x * blockDim.y * blockDim.z;
  unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  tile[t] = x[b * nt + t];
  __syncthreads();
  float4 v = tile[nt - 1 - t];
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) acc += (i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w);
  out[b * nt + t] = acc + float(min(int(t), 3)) + max(0.f, -1.f);
}

// Half and bfloat16 conversions through the CUDA headers' host implementations.
extern "C" __global__ void halves(const __half* h, const __nv_bfloat16* b, float* out) {
  unsigned t = threadIdx.x;
  out[2 * t] = __half2float(h[t]) * 2.f;
  out[2 * t + 1] = __bfloat162float(__float2bfloat16(__bfloat162float(b[t]) + 1.f));
}

// __nanosleep yields, so an intra-block handshake makes progress.
extern "C" __global__ void handshake(int* flag, int* out) {
  if (threadIdx.x == 0) {
    while (atomicAdd(flag, 0) == 0) __nanosleep(100);
    out[0] = 1;
  } else if (threadIdx.x == 1) {
    atomicExch(flag, 1);
  }
}

// Warp match: out[t*4 + j] = match_any over v (full warp), match_any over 64-bit w among the
// even lanes only, match_all over v and its predicate.
extern "C" __global__ void matches(const unsigned* v, const unsigned long long* w, unsigned* out) {
  unsigned t = threadIdx.x;
  unsigned* o = out + t * 4;
  o[0] = __match_any_sync(0xffffffffu, v[t]);
  int pred = -1;
  o[2] = __match_all_sync(0xffffffffu, v[t], &pred);
  o[3] = unsigned(pred);
  o[1] = (t & 1) ? 0u : __match_any_sync(0x55555555u, w[t]);
}
