// Shared device code of every topkgen top-k kernel: key transforms, warp and block
// primitives, radix digit search, bitonic sort, and the two kernel bodies. Each rendered
// kernel includes this text once; the guard lets many kernels share one translation unit.
#ifndef TOPKGEN_TOPK_COMMON_CUH
#define TOPKGEN_TOPK_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

{% include "topk_memory.cuh" %}

namespace topk {

typedef unsigned long long u64;
constexpr unsigned kFullMask = 0xffffffffu;

template <typename T>
struct KeyTraits;
template <>
struct KeyTraits<float> {
  typedef unsigned Bits;
  static constexpr unsigned kSign = 0x80000000u, kExp = 0x7f800000u, kAll = 0xffffffffu;
  static constexpr int kBits = 32;
};
template <>
struct KeyTraits<__nv_bfloat16> {
  typedef unsigned short Bits;
  static constexpr unsigned kSign = 0x8000u, kExp = 0x7f80u, kAll = 0xffffu;
  static constexpr int kBits = 16;
};
template <>
struct KeyTraits<__half> {
  typedef unsigned short Bits;
  static constexpr unsigned kSign = 0x8000u, kExp = 0x7c00u, kAll = 0xffffu;
  static constexpr int kBits = 16;
};

// The selection key: the k largest keys are the answer, in both directions. Floats are made
// radix-orderable by flipping (negatives invert every bit, non-negatives set the sign bit),
// so -0.0 ranks just below +0.0; every NaN maps to the top key, so NaN ranks above every
// number. For smallest the key is inverted, which puts NaN last.
template <typename T>
__device__ __forceinline__ unsigned select_key(typename KeyTraits<T>::Bits raw, bool largest) {
  typedef KeyTraits<T> Tr;
  const unsigned b = raw;
  const unsigned key = (b & ~Tr::kSign) > Tr::kExp ? Tr::kAll : ((b & Tr::kSign) ? (~b & Tr::kAll) : (b | Tr::kSign));
  return largest ? key : (~key & Tr::kAll);
}

// One comparison orders by key, then by lower index: (key << 32) | ~index.
__device__ __forceinline__ u64 pack(unsigned key, int index) {
  return (u64(key) << 32) | u64(~unsigned(index));
}
__device__ __forceinline__ int unpack_index(u64 packed) { return int(~unsigned(packed & 0xffffffffull)); }

// The 16/sizeof(T) keys of one 128-bit load, lowest address first.
template <int V, typename Bits>
__device__ __forceinline__ void unpack_vector(const uint4& q, Bits (&keys)[V]) {
  const unsigned words[4] = {q.x, q.y, q.z, q.w};
  constexpr int kPerWord = V / 4, kShift = 32 / kPerWord;
#pragma unroll
  for (int i = 0; i < V; ++i) keys[i] = Bits(words[i / kPerWord] >> ((i % kPerWord) * kShift));
}

// Inclusive prefix sum across the lanes of a full warp.
__device__ __forceinline__ int warp_inclusive_scan(int value) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int other = __shfl_up_sync(kFullMask, value, offset);
    if (lane >= offset) value += other;
  }
  return value;
}

// Exclusive prefix sum over the block, in thread order; also returns the block total.
template <int THREADS>
__device__ __forceinline__ int block_exclusive_scan(int value, int* warp_sums, int& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int inclusive = warp_inclusive_scan(value);
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  int before = 0, sum = 0;
#pragma unroll
  for (int w = 0; w < THREADS / 32; ++w) {
    const int s = warp_sums[w];
    before += w < warp ? s : 0;
    sum += s;
  }
  __syncthreads();
  total = sum;
  return before + inclusive - value;
}

// The digit d of the current radix pass such that fewer than `remaining` keys of the bucket
// have a larger digit and at least `remaining` have a digit >= d. Writes d and the number of
// keys still to take inside digit d's bucket. Threads 0..255 (eight full warps) take part.
__device__ __forceinline__ void find_digit(const int* hist, int remaining, int* warp_sums, int* result) {
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  int count = 0, inclusive = 0;
  if (t < 256) {
    count = hist[255 - t];
    inclusive = warp_inclusive_scan(count);
    if (lane == 31) warp_sums[warp] = inclusive;
  }
  __syncthreads();
  if (t < 256) {
    int at_or_above = inclusive;
    for (int w = 0; w < warp; ++w) at_or_above += warp_sums[w];
    const int above = at_or_above - count;
    if (above < remaining && remaining <= at_or_above) {
      result[0] = 255 - t;
      result[1] = remaining - above;
    }
  }
  __syncthreads();
}

// A row seen as a scalar head up to the first 16-byte boundary, a body of 128-bit vectors
// and a scalar tail. Loads never leave the row, whatever its alignment.
//   BODY_STEPS: 0 = as many vector steps as the row needs (runtime N); > 0 = a fixed bound.
//   TAIL_STEPS: 0 = runtime tail loop; > 0 = a fixed number of guarded scalar iterations.
template <typename Bits, int THREADS, int BODY_STEPS, int TAIL_STEPS>
struct RowView {
  static constexpr int V = 16 / int(sizeof(Bits));
  const Bits* p;
  int n, head, nvec, tail_start, body_steps, tail_steps;

  __device__ __forceinline__ RowView(const Bits* row, int n_) : p(row), n(n_) {
    const int misaligned = int((16u - unsigned(reinterpret_cast<unsigned long long>(row) & 15u)) & 15u);
    head = min(misaligned / int(sizeof(Bits)), n);
    nvec = (n - head) / V;
    tail_start = head + nvec * V;
    body_steps = BODY_STEPS > 0 ? BODY_STEPS : (nvec + THREADS - 1) / THREADS;
    tail_steps = TAIL_STEPS > 0 ? TAIL_STEPS : (n - tail_start + THREADS - 1) / THREADS;
  }

  __device__ __forceinline__ int steps() const { return 1 + body_steps + tail_steps; }

  // This thread's keys of step s (consecutive indices from `first`, which is set when the
  // count is positive); returns how many. Every index is formed only once it is known to
  // lie inside the row, so no int overflows for any n up to 2^31 - 1.
  __device__ __forceinline__ int load(int s, Bits (&keys)[V], int& first) const {
    const int t = threadIdx.x;
    if (s == 0) {
      first = t;
      if (t < head) {
        keys[0] = load_global_nc(p + t);
        return 1;
      }
      return 0;
    }
    s -= 1;
    if (s < body_steps) {
      const int v = s * THREADS + t;  // < nvec + THREADS
      if (v < nvec) {
        first = head + v * V;
        unpack_vector<V>(load_global_nc(reinterpret_cast<const uint4*>(p + head) + v), keys);
        return V;
      }
      return 0;
    }
    s -= body_steps;
    const int i = s * THREADS + t;  // position in the tail, < tail steps x THREADS
    if (i < n - tail_start) {
      first = tail_start + i;
      keys[0] = load_global_nc(p + first);
      return 1;
    }
    return 0;
  }
};

// Radix select, one CTA per row: MSB-first 8-bit digit passes with shared-memory histograms
// find the k-th key; a gather pass collects the keys above it and the ties needed (by lower
// index in deterministic mode, in arrival order in fast mode); a bitonic sort orders them.
template <typename T, int KR, int THREADS, bool DETERMINISTIC, int BODY_STEPS, int TAIL_STEPS, int EXACT_N>
__device__ __forceinline__ void radix_topk(const T* __restrict__ x, T* __restrict__ values,
                                           long long* __restrict__ indices, int rows, int n_arg, int k,
                                           bool largest) {
  typedef typename KeyTraits<T>::Bits Bits;
  typedef RowView<Bits, THREADS, BODY_STEPS, TAIL_STEPS> View;
  constexpr int V = View::V;
  constexpr int PASSES = KeyTraits<T>::kBits / 8;
  __shared__ int hist[256];
  __shared__ int warp_sums[32];
  __shared__ int digit[2];
  __shared__ int counters[2];
  __shared__ u64 cand[KR];

  const int row = blockIdx.x;
  if (row >= rows) return;
  const int n = EXACT_N > 0 ? EXACT_N : n_arg;
  const int t = threadIdx.x;
  const View view(reinterpret_cast<const Bits*>(x) + (unsigned long long)row * (unsigned long long)n, n);
  const int steps = view.steps();

  unsigned prefix = 0, prefix_mask = 0;
  int remaining = k;
  for (int pass = PASSES - 1; pass >= 0; --pass) {
    counter_phase(pass == PASSES - 1 ? "histogram, first pass" : "histogram, later passes");
    for (int i = t; i < 256; i += THREADS) hist[i] = 0;
    __syncthreads();
    const int shift = pass * 8;
    for (int s = 0; s < steps; ++s) {
      Bits keys[V];
      int first;
      const int count = view.load(s, keys, first);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        if (j < count) {
          const unsigned key = select_key<T>(keys[j], largest);
          if ((key & prefix_mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1);
        }
      }
    }
    __syncthreads();
    find_digit(hist, remaining, warp_sums, digit);
    prefix |= unsigned(digit[0]) << shift;
    prefix_mask |= 0xffu << shift;
    remaining = digit[1];
  }

  // Gather: cand[0, k - ties) takes keys above the threshold, cand[k - ties, k) the ties.
  counter_phase("gather");
  const unsigned threshold = prefix;
  const int ties = remaining;
  const int above = k - ties;
  int width = 1;
  while (width < k) width <<= 1;
  for (int i = t; i < width; i += THREADS) cand[i] = 0ull;
  if (t == 0) counters[0] = counters[1] = 0;
  __syncthreads();
  int ties_before = 0;
  for (int s = 0; s < steps; ++s) {
    Bits keys[V];
    int first;
    const int count = view.load(s, keys, first);
    int my_ties = 0;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if (j < count) {
        const unsigned key = select_key<T>(keys[j], largest);
        if (key > threshold) {
          cand[atomicAdd(&counters[0], 1)] = pack(key, first + j);
        } else if (key == threshold) {
          if (DETERMINISTIC) {
            ++my_ties;
          } else {
            const int slot = atomicAdd(&counters[1], 1);
            if (slot < ties) cand[above + slot] = pack(key, first + j);
          }
        }
      }
    }
    if (DETERMINISTIC && ties_before < ties) {  // block-uniform condition
      int total;
      int rank = ties_before + block_exclusive_scan<THREADS>(my_ties, warp_sums, total);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        if (j < count && select_key<T>(keys[j], largest) == threshold) {
          if (rank < ties) cand[above + rank] = pack(threshold, first + j);
          ++rank;
        }
      }
      ties_before += total;
    }
  }
  __syncthreads();

  // Bitonic sort of the first `width` candidates, descending (padding zeros sort last).
  counter_phase("sort");
  for (int size = 2; size <= width; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = t; i < width / 2; i += THREADS) {
        const int lo = (i / stride) * 2 * stride + (i % stride), hi = lo + stride;
        const bool descending = (lo & size) == 0;
        const u64 a = cand[lo], b = cand[hi];
        if ((a < b) == descending) {
          cand[lo] = b;
          cand[hi] = a;
        }
      }
      __syncthreads();
    }
  }

  const unsigned long long in_base = (unsigned long long)row * (unsigned long long)n;
  const unsigned long long out_base = (unsigned long long)row * (unsigned long long)k;
  counter_phase("output");
  for (int i = t; i < k; i += THREADS) {
    const int index = unpack_index(cand[i]);
    store_global(values + out_base + i, load_global_nc(x + in_base + index));
    store_global(indices + out_base + i, (long long)index);
  }
}

// Register top-k for one row held by one warp: each lane keeps PER packed keys (lane + 32j)
// in registers; each of k rounds takes the warp maximum with a butterfly of shuffles. Ties go
// to the lower index, so the result is deterministic by construction.
template <typename T, int PER>
__device__ __forceinline__ void warp_topk_row(const T* __restrict__ row, T* __restrict__ values,
                                              long long* __restrict__ indices, int n, int k, bool largest) {
  typedef typename KeyTraits<T>::Bits Bits;
  const Bits* bits = reinterpret_cast<const Bits*>(row);
  const int lane = threadIdx.x & 31;
  u64 v[PER];
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int i = j * 32 + lane;
    v[j] = i < n ? pack(select_key<T>(load_global_nc(bits + i), largest), i) : 0ull;
  }
  u64 mine = 0ull;
  for (int r = 0; r < k; ++r) {
    u64 best = v[0];
#pragma unroll
    for (int j = 1; j < PER; ++j) best = v[j] > best ? v[j] : best;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      const u64 other = __shfl_xor_sync(kFullMask, best, offset);
      best = other > best ? other : best;
    }
#pragma unroll
    for (int j = 0; j < PER; ++j) v[j] = v[j] == best ? 0ull : v[j];
    if (lane == r) mine = best;
  }
  if (lane < k) {
    const int index = unpack_index(mine);
    store_global(values + lane, load_global_nc(row + index));
    store_global(indices + lane, (long long)index);
  }
}

}  // namespace topk

#endif  // TOPKGEN_TOPK_COMMON_CUH
