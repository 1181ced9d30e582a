// Shared device code of every topkgen top-k kernel: key transforms, warp and block
// primitives, radix digit search, sorts, and the two kernel bodies. Each rendered kernel
// includes this text once; the guard lets many kernels share one translation unit.
{% set large = large_k is defined and large_k %}
{#- The large-k path's kernels (large_k) render the lines marked by `large` below; every other
    kernel renders none of them, and its text is the same as before the path existed. Their
    guard differs, so a translation unit that mixes both fails to compile, never silently. -#}
#ifndef TOPKGEN_TOPK_COMMON_CUH{{ "_LARGE_K" if large else "" }}
#define TOPKGEN_TOPK_COMMON_CUH{{ "_LARGE_K" if large else "" }}

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
  typedef __nv_bfloat162 Pair;  // two values in a word
  static constexpr unsigned kSign = 0x8000u, kExp = 0x7f80u, kAll = 0xffffu;
  static constexpr int kBits = 16;
};
template <>
struct KeyTraits<__half> {
  typedef unsigned short Bits;
  typedef __half2 Pair;
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

// Every bit of each 16-bit half of w whose sign is set: one PRMT, whose selector copies each
// half's sign over both its bytes (prmt.b32's sign-replicate bytes), where a shift, an AND and
// a multiply cost 4096 x 16384 K=256 normal bfloat16 0.730 -> 0.697 warp instructions per key
// (counted). Its own function, as nan_max's are, so that the instruction counter charges the
// GPU's instruction (the emulator runs the fallback).
__device__ __forceinline__ unsigned half_signs(unsigned w) {
#if defined(__CUDA_ARCH__)
  unsigned out;
  asm("prmt.b32 %0, %1, 0, 0xbb99;" : "=r"(out) : "r"(w));
  return out;
#else
  return ((w >> 15) & 0x00010001u) * 0xffffu;
#endif
}

// select_key of a whole 32-bit word: one float32, or two 16-bit keys side by side (SIMD
// within the register: no carry crosses the halves), each as select_key makes it. `invert`
// is 0 for largest and all ones for smallest.
// CANON false leaves a NaN's key as the flip makes it (see nan_max): exact for a word with none.
template <typename T, bool CANON = true>
__device__ __forceinline__ unsigned word_select_keys(unsigned w, unsigned invert) {
  typedef KeyTraits<T> Tr;
  if constexpr (Tr::kBits == 32) {
    const unsigned negative = unsigned(int(w) >> 31);  // every bit of a negative
    const unsigned flip = negative | Tr::kSign;  // negatives: every bit; others: the sign
    // Smallest's flip spelled out: as (w ^ flip) ^ invert, or w ^ ~flip, ptxas kept a NOT a key
    // after the LOP3 (16384 K=256 normal float32, smallest: 0.719 -> 0.688 warp instructions per
    // key, counted; largest unchanged).
    if constexpr (!CANON) return invert != 0u ? w ^ (~negative & ~Tr::kSign) : w ^ flip;
    const float f = __uint_as_float(w);
    return (f != f ? Tr::kAll : w ^ flip) ^ invert;  // NaN: one float compare, not a mask and an integer one
  } else {
    constexpr unsigned kLow = 0x00010001u, kSigns = Tr::kSign * kLow;
    const unsigned flipped = w ^ (half_signs(w) | kSigns);  // as the 32-bit flip, per half
    if constexpr (!CANON) return flipped ^ invert;
    // A half is NaN when its magnitude exceeds kExp: adding 0x7fff - kExp carries into its bit 15.
    const unsigned nan = (((w & ~kSigns) + (0x7fffu - Tr::kExp) * kLow) >> 15) & kLow;
    return (flipped | nan * 0xffffu) ^ invert;
  }
}

// Whether a word of input holds a NaN (one float32, or either of two 16-bit values).
template <typename T>
__device__ __forceinline__ bool word_has_nan(unsigned w) {
  typedef KeyTraits<T> Tr;
  if constexpr (Tr::kBits == 32) return (w & ~Tr::kSign) > Tr::kExp;
  else return (w & ~Tr::kSign & Tr::kAll) > Tr::kExp || ((w >> 16) & ~Tr::kSign) > Tr::kExp;
}

// A running maximum of input words that is NaN (in a half, for 16-bit values) once any word
// was: word_has_nan of it says whether a NaN was seen. One instruction a word on sm_80 and
// later (max.NaN), where a NaN's canonical key cost a compare and a select a key. The
// emulator takes the #else: each function is one site of the instruction counter, so that
// it charges a call the instructions the GPU's path compiles to.
__device__ __forceinline__ unsigned nan_max_f32(unsigned acc, unsigned w) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned out;
  asm("max.NaN.f32 %0, %1, %2;" : "=r"(out) : "r"(acc), "r"(w));
  return out;
#else
  return (w & 0x7fffffffu) > 0x7f800000u ? w : acc;
#endif
}
// acc | bit where !(v < b) (NaN passes), else acc: the stream's test of a value against its
// bound. The unordered compare gives the predicate itself, where ptxas compared v < b and
// selected on its inverse (131072 K=1024 normal float32 0.719 -> 0.714 warp instructions per
// key, counted), and a predicated or sets the bit, where a select and an add cost two (0.604 ->
// 0.591, counted).
__device__ __forceinline__ unsigned or_not_below(unsigned acc, float v, float b, unsigned bit) {
#if defined(__CUDA_ARCH__)
  asm("{ .reg .pred p; setp.geu.f32 p, %1, %2; @p or.b32 %0, %0, %3; }" : "+r"(acc) : "f"(v), "f"(b), "r"(bit));
  return acc;
#else
  return !(v < b) ? acc | bit : acc;
#endif
}
__device__ __forceinline__ unsigned nan_max_bf16x2(unsigned acc, unsigned w) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned out;
  asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(out) : "r"(acc), "r"(w));
  return out;
#else
  return (w & 0x7fffu) > 0x7f80u || ((w >> 16) & 0x7fffu) > 0x7f80u ? w : acc;
#endif
}
__device__ __forceinline__ unsigned nan_max_f16x2(unsigned acc, unsigned w) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned out;
  asm("max.NaN.f16x2 %0, %1, %2;" : "=r"(out) : "r"(acc), "r"(w));
  return out;
#else
  return (w & 0x7fffu) > 0x7c00u || ((w >> 16) & 0x7fffu) > 0x7c00u ? w : acc;
#endif
}
template <typename T>
__device__ __forceinline__ unsigned nan_max(unsigned acc, unsigned w) {
  if constexpr (KeyTraits<T>::kBits == 32) return nan_max_f32(acc, w);
  else if constexpr (KeyTraits<T>::kExp == 0x7f80u) return nan_max_bf16x2(acc, w);
  else return nan_max_f16x2(acc, w);
}

// nan_max of a piece's four words.
template <typename T>
__device__ __forceinline__ unsigned nan_max4(unsigned acc, const uint4& q) {
  return nan_max<T>(nan_max<T>(acc, q.x), nan_max<T>(q.y, nan_max<T>(q.z, q.w)));
}

// The input bits of a key, so that output values need no second read. Every NaN shares one
// key, so its payload is not in the key: `is_nan` tells the caller to read that value.
template <typename T>
__device__ __forceinline__ typename KeyTraits<T>::Bits key_bits(unsigned key, bool largest, bool& is_nan) {
  typedef KeyTraits<T> Tr;
  const unsigned up = largest ? key : (~key & Tr::kAll);
  is_nan = up == Tr::kAll;
  return typename Tr::Bits((up & Tr::kSign) ? (up & ~Tr::kSign) : (~up & Tr::kAll));
}

// The value of a key's input bits, as a float (exact for every dtype).
template <typename T>
__device__ __forceinline__ float bits_value(typename KeyTraits<T>::Bits raw) {
  if constexpr (KeyTraits<T>::kBits == 32) {
    return __uint_as_float(raw);
  } else if constexpr (sizeof(T) == 2 && KeyTraits<T>::kExp == 0x7f80u) {
    return __uint_as_float(unsigned(raw) << 16);  // bfloat16: the top half of a float32
  } else {
    return __half2float(__ushort_as_half(raw));
  }
}

// The halves of w (two 16-bit values of T) that pass !(v < b) (UP) or !(v > b), b the value of
// b2's halves: 0xffff in each that does (NaN passes), else 0. On sm_90 and later one
// set.geu.u32.bf16x2 (__hgeu2_mask; .f16x2 for half) tests two keys, where each key took a
// convert, a compare and a select (131072 K=1024 normal bfloat16 0.617 -> 0.551 warp
// instructions per key, counted). Earlier targets lack the bfloat16 form (kPairCompare); the
// emulator runs their compare a key where a test defines TOPKGEN_KEY_COMPARE=1.
#if (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900) || (!defined(__CUDA_ARCH__) && !TOPKGEN_KEY_COMPARE)
constexpr bool kPairCompare = true;
#else
constexpr bool kPairCompare = false;
#endif
// KEY_ORDER (the collect from a resident copy): smallest tests v <= b (`__hle2_mask`), which a
// NaN fails, as its key lies below every other: exact in the order of keys where w holds no
// NaN but the one NaN word and b is not a zero (+0 and -0 are equal values and two keys).
template <typename T, bool UP, bool KEY_ORDER = false>
__device__ __forceinline__ unsigned pair_not_below(unsigned w, unsigned b2) {
  typedef typename KeyTraits<T>::Pair Pair;
  Pair v, b;
  memcpy(&v, &w, sizeof(Pair));
  memcpy(&b, &b2, sizeof(Pair));
  return UP ? __hgeu2_mask(v, b) : KEY_ORDER ? __hle2_mask(v, b) : __hleu2_mask(v, b);
}

// pair_not_below's b2: `value` (a value of T) in both halves.
template <typename T>
__device__ __forceinline__ unsigned pair_bound(float value) {
  unsigned b16;
  if constexpr (KeyTraits<T>::kExp == 0x7f80u) b16 = __float_as_uint(value) >> 16;
  else b16 = __half_as_ushort(__float2half(value));
  return b16 | (b16 << 16);
}

// Bit j: element j < got of a piece of 16-bit values passes pair_not_below: each word's two
// results gathered to bits 2w (low half) and 2w + 17 (high), then folded to bits 0-7.
template <typename T, bool UP, bool KEY_ORDER = false>
__device__ __forceinline__ unsigned pair_marks(const uint4& q, unsigned b2, int got) {
  const unsigned words[4] = {q.x, q.y, q.z, q.w};
  unsigned keep = 0u;
#pragma unroll
  for (int w = 0; w < 4; ++w) keep |= pair_not_below<T, UP, KEY_ORDER>(words[w], b2) & (0x20001u << (2 * w));
  return (keep | (keep >> 16)) & ((1u << got) - 1u);
}

// A bound b such that every value x whose key is >= `floor` (of either direction) passes
// !(s x < b), with s = 1 for largest and -1 for smallest. The floor is clamped to the keys of
// the infinities first (no number has a key outside them, and NaN, the top key for largest,
// passes every such test), so b is a number; a key above it or -0 beside +0 may pass too.
template <typename T>
__device__ __forceinline__ float keep_bound(unsigned floor, bool largest) {
  typedef KeyTraits<T> Tr;
  constexpr unsigned kTop = Tr::kExp | Tr::kSign, kBottom = ~kTop & Tr::kAll;  // +inf, -inf
  const unsigned up = min(max(largest ? floor : (~floor & Tr::kAll), kBottom), kTop);
  bool is_nan;
  const float v = bits_value<T>(key_bits<T>(up, true, is_nan));
  return largest ? v : -v;
}

// One comparison orders by key, then by lower index: (key << 32) | ~index.
__device__ __forceinline__ u64 pack(unsigned key, int index) {
  return (u64(key) << 32) | u64(~unsigned(index));
}
__device__ __forceinline__ unsigned unpack_key(u64 packed) { return unsigned(packed >> 32); }
__device__ __forceinline__ int unpack_index(u64 packed) { return int(~unsigned(packed & 0xffffffffull)); }

// Element j of a 128-bit piece of a row (lowest address first); a scalar piece holds its one
// element in q.x.
template <typename Bits>
__device__ __forceinline__ Bits piece_element(const uint4& q, int j) {
  constexpr int kPerWord = 4 / int(sizeof(Bits)), kShift = 32 / kPerWord;
  const int w = j / kPerWord;
  // Two selects on w's bits, with no branch where w is known only at run time (a walk over
  // a piece's set bits): a chain of compares there compiled to branches around each select.
  const unsigned low = (w & 1) ? q.y : q.x, high = (w & 1) ? q.w : q.z;
  const unsigned word = (w & 2) ? high : low;
  return Bits(word >> ((j % kPerWord) * kShift));
}

// The selection keys of a piece's elements, in the piece's layout: element j's key is
// piece_element<Bits>(keys, j). The passes turn a piece into keys once, so that their
// per-key loops read a key where they need it and keep no raw copy alive beside it.
template <typename T, bool CANON = true>
__device__ __forceinline__ uint4 piece_keys(const uint4& q, bool largest) {
  const unsigned invert = largest ? 0u : ~0u;
  return make_uint4(word_select_keys<T, CANON>(q.x, invert), word_select_keys<T, CANON>(q.y, invert),
                    word_select_keys<T, CANON>(q.z, invert), word_select_keys<T, CANON>(q.w, invert));
}

// A piece visitor f(keys, first, got) served the raw pieces of a row in global memory: each
// piece becomes keys on the way. A resident row's copy in shared memory holds keys already
// (the first pass stores them, or copy_to_keys makes them of a copy of words), so the passes
// over it call f directly, with no transform.
// DIRECTION as stream_above's: 1 (largest) or -1 (smallest) a constant, 0 reads `largest`.
template <typename T, int DIRECTION = 0, typename F>
__device__ __forceinline__ auto as_keys(F& f, bool largest) {
  const bool up = DIRECTION == 0 ? largest : DIRECTION > 0;
  return [&f, up](const uint4& q, int first, int got) { f(piece_keys<T>(q, up), first, got); };
}

// as_keys, where NAN_AFTER makes no NaN canonical and keeps nan_max of the pieces in `seen`
// instead: the first pass asks once after it (a row with a NaN takes it again, canonical).
template <typename T, bool NAN_AFTER, int DIRECTION = 0, typename F>
__device__ __forceinline__ auto as_keys_nan_after(F& f, bool largest, unsigned& seen) {
  const bool up = DIRECTION == 0 ? largest : DIRECTION > 0;
  return [&f, &seen, up](const uint4& q, int first, int got) {
    if constexpr (NAN_AFTER) seen = nan_max4<T>(seen, q);
    f(piece_keys<T, !NAN_AFTER>(q, up), first, got);
  };
}

// The first pass over a row whose copy keeps its words (kRawCopy): f sees the words as they
// are, and `seen` keeps their nan_max, as as_keys_nan_after's.
template <typename T, typename F>
__device__ __forceinline__ auto as_words_nan_after(F& f, unsigned& seen) {
  return [&f, &seen](const uint4& q, int first, int got) {
    seen = nan_max4<T>(seen, q);
    f(q, first, got);
  };
}

// ----------------------------------------------------------------------------- warp and block

__device__ __forceinline__ int lane_id() { return int(threadIdx.x & 31u); }

// The thread's index, read from the special register where it is used. Each call is a
// fresh read: a 64-bit copy of it formed for one use (an address, an output offset) is not
// kept alive across the kernel, which in the kernels capped at 32 registers (K=1024 at 2
// CTAs per SM) costs a spill.
__device__ __forceinline__ int thread_index() {
#ifdef __CUDA_ARCH__
  unsigned tid;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
  return int(tid);
#else
  return int(threadIdx.x);
#endif
}

// The warp index, read where it is used (see thread_index).
__device__ __forceinline__ int warp_index() { return thread_index() >> 5; }

// The CTA's index, read where it is used (see thread_index): a Part formed from it in the
// prologue was kept through the passes, which the bfloat16 sm_90 fast kernels with a raw copy
// (kRawCopy) paid for in spills.
__device__ __forceinline__ int block_index() {
#ifdef __CUDA_ARCH__
  unsigned ctaid;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(ctaid));
  return int(ctaid);
#else
  return int(blockIdx.x);
#endif
}

// Inclusive prefix sum across the lanes of a full warp. On the GPU each step's shuffle says
// whether its source lane exists and the add is predicated on that: two instructions a step,
// where a compare of the lane and a select made four (16384 K=256 normal float32 -0.012,
// bfloat16 -0.010 warp instructions per key, counted). The emulator runs the portable form.
__device__ __forceinline__ int warp_inclusive_scan(int value) {
#if defined(__CUDA_ARCH__)
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1)
    asm("{ .reg .s32 r; .reg .pred p; shfl.sync.up.b32 r|p, %0, %1, 0, -1; @p add.s32 %0, r, %0; }"
        : "+r"(value) : "r"(offset));
#else
  const int lane = lane_id();
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int other = __shfl_up_sync(kFullMask, value, offset);
    if (lane >= offset) value += other;
  }
#endif
  return value;
}

// Exclusive prefix sum over the block, in thread order; also returns the block total.
// warp_sums holds 33 ints. Warp 0 scans the warp totals, so the cost in registers does not
// grow with the block size. Calls may follow each other without another barrier: lane 31
// overwrites its warp's slot only after the __syncwarp, which orders the slot's reads by the
// warp's other lanes in the previous call before that write (shuffles exchange registers
// but order no memory access).
template <int THREADS>
__device__ __forceinline__ int block_exclusive_scan(int value, int* warp_sums, int& total) {
  constexpr int kWarps = THREADS / 32;
  const int lane = lane_id(), warp = warp_index();
  const int inclusive = warp_inclusive_scan(value);
  __syncwarp();
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const int sum = lane < kWarps ? warp_sums[lane] : 0;
    const int running = warp_inclusive_scan(sum);
    if (lane < kWarps) warp_sums[lane] = running - sum;
    if (lane == 31) warp_sums[32] = running;
  }
  __syncthreads();
  total = warp_sums[32];
  return warp_sums[warp] + inclusive - value;
}

// A lane's marks on its keys of one step of RowView::for_each over a resident row's copy, kept
// until the step ends (its stop callback) and appended then: one atomic a step, not a piece,
// and the marked keys read again from the copy by index, with no selection among a piece's
// elements. Bit b is element b % V of the step's piece b / V, which starts at
// first + (b / V) x THREADS x V (the body's pieces of a step are THREADS vectors apart; the
// head's and the tail's steps have one piece). 32 bits where UNROLL x V fit, else 64.
template <bool WIDE>
struct MaskOf {
  typedef unsigned T;
};
template <>
struct MaskOf<true> {
  typedef u64 T;
};
__device__ __forceinline__ int bit_count(unsigned m) { return __popc(m); }
__device__ __forceinline__ int bit_count(u64 m) { return __popcll((unsigned long long)m); }
// Unsigned, so that a bit's piece and element (b / V, b % V) are a shift and a mask: of an
// int, ptxas rounded the quotient toward zero, four instructions more an appended key
// (counted: 16384 K=256 float32 normal 0.708 -> 0.699, tie-heavy 1.085 -> 1.061; 131072
// K=1024 normal float32 0.591 -> 0.579, bfloat16 0.551 -> 0.543 warp instructions per key).
__device__ __forceinline__ unsigned lowest_bit(unsigned m) { return unsigned(__ffs(int(m)) - 1); }
__device__ __forceinline__ unsigned lowest_bit(u64 m) { return unsigned(__ffsll((long long)m) - 1); }

// The appends' default for what each appended key also does: nothing.
struct NoKey {
  __device__ __forceinline__ void operator()(unsigned) const {}
};

// The key of a copy's word, where the copy holds keys (StepMarks::append's default).
struct KeyIsWord {
  __device__ __forceinline__ unsigned operator()(unsigned word) const { return word; }
};

template <int THREADS, int V, int UNROLL>
struct StepMarks {
  typedef typename MaskOf<(UNROLL * V > 32)>::T Mask;
  Mask bits[2];  // two kinds (the gather: keys above the k-th key's bucket, and its ties)
  int pieces, first;

  __device__ __forceinline__ StepMarks() : bits{0u, 0u}, pieces(0), first(0) {}

  // Called for each piece of the step in order (see RowView::for_each).
  __device__ __forceinline__ void mark(unsigned keep0, unsigned keep1, int piece_first) {
    if (pieces == 0) first = piece_first;
    bits[0] |= Mask(keep0) << (pieces * V);
    bits[1] |= Mask(keep1) << (pieces * V);
    ++pieces;
  }

  // Appends the keys of kind `kind` to out[slot] for the slots `counter` hands out below
  // `limit`, packed with their index in the row, and clears that kind's marks.
  template <typename Bits, typename OnKey = NoKey, typename KeyOf = KeyIsWord>
  __device__ __forceinline__ void append(int kind, int* counter, const Bits* copy, u64* out, int limit,
                                         OnKey on_key = OnKey(), KeyOf key_of = KeyOf()) {
    Mask m = bits[kind];
    if (m != 0u) {
      int slot = atomicAdd(counter, bit_count(m));
      for (; m != 0u && slot < limit; m &= m - 1u) {
        const unsigned b = lowest_bit(m);
        const int index = first + int(b / V) * (THREADS * V) + int(b % V);
        const unsigned key = key_of(copy[index]);
        on_key(key);
        out[slot++] = pack(key, index);
      }
    }
    bits[kind] = 0u;
  }

  // After the step's appends: the next piece marked starts the next step.
  __device__ __forceinline__ void next_step() { pieces = 0; }
};

// hist[digit] += 1: a no-return increment by one, which sm_70 and later compile to
// ATOMS.POPC.INC. The shared-memory unit merges a warp's same-address increments itself, so
// ties (all-equal rows) need no software aggregation, and no lane waits for another.
__device__ __forceinline__ void hist_add(int* hist, unsigned digit) { atomicAdd(&hist[digit], 1); }

// Appends this lane's keys of a piece whose bits are set in `bits` to `out` at the slots
// counter hands out, one atomic for all of them, while the slot is below `limit`: bit j is
// element j, packed with its index first + j. The slots of one lane's keys are consecutive.
template <typename Bits>
__device__ __forceinline__ void lane_append(int* counter, unsigned bits, const uint4& keys, int first, u64* out,
                                            int limit) {
  if (bits != 0u) {  // a block of its own: the counter's full warps are the lanes that append
    int slot = atomicAdd(counter, __popc(bits));
    for (; bits != 0u && slot < limit; bits &= bits - 1u) {
      const int j = __ffs(int(bits)) - 1;
      out[slot++] = pack(piece_element<Bits>(keys, j), first + j);
    }
  }
}

// The gather's append of this lane's keys of a piece, both kinds in one loop (one copy of it
// per piece, so that a kernel capped at 32 registers does not spill): the keys above the k-th
// key's bucket (`above_bits`) at out[counters[0]++], its ties (`tie_bits`) at
// out[above + counters[1]++] while that slot is below above + ties.
template <typename Bits>
__device__ __forceinline__ void gather_append(int* counters, unsigned above_bits, unsigned tie_bits,
                                              const uint4& keys, int first, u64* out, int above, int ties) {
  if ((above_bits | tie_bits) == 0u) return;
  int a = above_bits != 0u ? atomicAdd(&counters[0], __popc(above_bits)) : 0;
  int t = tie_bits != 0u ? above + atomicAdd(&counters[1], __popc(tie_bits)) : 0;
  for (unsigned bits = above_bits | tie_bits; bits != 0u; bits &= bits - 1u) {
    const int j = __ffs(int(bits)) - 1;
    const bool is_above = (above_bits >> j) & 1u;
    const int slot = is_above ? a++ : t++;
    if (is_above || slot < above + ties) out[slot] = pack(piece_element<Bits>(keys, j), first + j);
  }
}

// The collect from a resident row's copy: each step's words w that pass a compare with `bound`
// (MODE 0: w >= bound, 1: w <= bound, 2 and 3 the same signed; 4 and 5: 16-bit values two a
// word, pair_marks in the order of keys, `bound` the value in both halves) are
// marked and appended at its end (StepMarks) to out at counter's slots, as key_of makes them
// keys, each key also given to on_key. WHOLE: RowView::for_each's. The compare is spelled on
// the loop's line, so that the instruction counter charges its copies as one loop's.
template <typename T, int THREADS, int UNROLL, bool WHOLE, int MODE, typename View, typename Bits, typename KeyOf,
          typename OnKey>
__device__ __forceinline__ void collect_marked(const View& row, const Bits* copy, unsigned bound, KeyOf key_of,
                                               OnKey on_key, int* counter, u64* out) {
  constexpr int V = View::V;
  StepMarks<THREADS, V, UNROLL> marks;
  // 16-bit keys are compared in place, two a word: the high half's as the word against the
  // bound in the top half (below it, all ones where the compare is <=), the low half's as the
  // word shifted up; each bit set by a select of its constant, where extracting each half and
  // a select of 0 or 1, a shift and an OR a key cost 16384 K=256 normal bfloat16 0.662 -> 0.608
  // warp instructions per key (counted; float32 keeps its form, which counted fewer).
  constexpr bool kHalves = sizeof(Bits) == 2;
  const unsigned b = kHalves ? (bound << 16) | (MODE % 2 == 1 ? 0xffffu : 0u) : bound;
  auto mark = [&](const uint4& words, int first, int got) {
    unsigned keep = 0u;
    if constexpr (MODE >= 4) {
      keep = pair_marks<T, MODE == 4, true>(words, bound, got);
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const unsigned word = piece_element<unsigned>(words, kHalves ? j / 2 : j);
        const unsigned w = kHalves && j % 2 == 0 ? word << 16 : word;
        const bool pass = MODE == 0 ? w >= b : MODE == 1 ? w <= b : MODE == 2 ? int(w) >= int(b) : int(w) <= int(b);
        if constexpr (kHalves) keep |= j < got && pass ? 1u << j : 0u;
        else keep |= unsigned(j < got && pass) << j;
      }
    }
    marks.mark(keep, 0u, first);
  };
  auto append_marked = [&] {
    marks.template append<Bits>(0, counter, copy, out, 0x7fffffff, on_key, key_of);
    marks.next_step();
    return false;  // every step is walked
  };
  row.template for_each<true, WHOLE>(mark, 0, 0x7fffffff, append_marked);
}

// ----------------------------------------------------------------------------- radix digits

// MSB-first digits of 11 bits (the last one narrower): 3 passes for 32-bit keys, 2 for 16-bit.
constexpr int kDigitBits = 11;
constexpr int kMaxBins = 1 << kDigitBits;

__device__ __forceinline__ int digit_shift(int key_bits, int pass) {
  return max(key_bits - (pass + 1) * kDigitBits, 0);
}

// hist[0, bins) = 0 (bins <= kMaxBins): 16-byte stores (hist is 16-byte aligned) where bins is
// a multiple of 4, a fixed number a thread, each predicated on its bins, from one address: a
// loop over them cost 16384 K=256 normal float32 0.013, bfloat16 0.010 warp instructions per
// key more (counted).
template <int THREADS>
__device__ __forceinline__ void clear_bins(int* hist, int bins) {
  constexpr int kSteps = (kMaxBins + 4 * THREADS - 1) / (4 * THREADS);
  if (bins % 4 == 0) {
    int4* const quad = reinterpret_cast<int4*>(hist) + thread_index();
    const int quads = (bins >> 2) - thread_index();
#pragma unroll
    for (int s = 0; s < kSteps; ++s)
      if (s * THREADS < quads) quad[s * THREADS] = make_int4(0, 0, 0, 0);
  } else {
    for (int i = thread_index(); i < bins; i += THREADS) hist[i] = 0;
  }
}

// find_digit's search where the block has at most 4 warps: warp 0 alone reads the bins, the
// others wait at the barrier. Every warp scanning its share of them repeated the scan's
// shuffles, the barrier between its warps and the search (4096 x 16384 K=256 normal float32
// 0.6613 -> 0.6535 warp instructions per key, bfloat16 0.5845 -> 0.5643, counted). Each lane
// owns a run of bins / 32 (at most 64) counted from the top, read 16 bytes at a time in an
// order the lane permutes (no two lanes of a quarter warp on one bank); the warp then searches
// the run that holds d, 32 bins a round. warp_sums[32] takes the keys the bins hold, as
// block_exclusive_scan's total: a fourth int in RadixShared::found gave K=4096 on 1024 threads
// a 12-byte spill. At 256 threads this search took the deterministic float32 sm_100 kernels
// of K=1024 and 2048 from 96 registers, the radix budget, to 99.
constexpr int kOneWarpDigitThreads = 128;
__device__ __forceinline__ int find_digit_warp(const int* hist, int bins, int remaining, int* warp_sums, int* found,
                                               unsigned low_xor, unsigned high_xor) {
  if (thread_index() < 32) {
    const int lane = lane_id();
    const int per = (bins + 31) / 32;
    const int top = bins - lane * per;  // this lane owns bins [top - per, top)
    const unsigned x = top - per >= kMaxBins / 2 ? high_xor : low_xor;  // as find_digit's
    int count = 0;
    if (per % 4 == 0 && per * 32 == bins) {  // whole runs of 16 bytes (per is 2^i)
      const int4* const run = reinterpret_cast<const int4*>(hist + (int(unsigned(top - per) ^ x) & ~(per - 1)));
      const int quads = per / 4, turn = lane & (quads - 1);
#pragma unroll 4
      for (int i = 0; i < quads; ++i) {
        const int4 q = run[i ^ turn];
        count += (q.x + q.y) + (q.z + q.w);
      }
    } else {
      for (int i = 1; i <= per; ++i)
        if (top - i >= 0) count += hist[unsigned(top - i) ^ x];
    }
    const int through = warp_inclusive_scan(count);  // keys at this lane's bins and above
    const unsigned owner = __ballot_sync(kFullMask, through - count < remaining && remaining <= through);
    if (owner != 0u) {  // warp-uniform: one lane's run holds d
      const int src = __ffs(int(owner)) - 1;
      const int run_top = __shfl_sync(kFullMask, top, src);
      const unsigned run_x = __shfl_sync(kFullMask, x, src);
      int above = __shfl_sync(kFullMask, through - count, src);
      for (int base = 0; base < per; base += 32) {  // warp-uniform
        const int bin = run_top - 1 - base - lane;
        const int c = base + lane < per && bin >= 0 ? hist[unsigned(bin) ^ run_x] : 0;
        const int at = above + warp_inclusive_scan(c);  // keys at bins >= bin
        const unsigned reached = __ballot_sync(kFullMask, base + lane < per && remaining <= at);
        if (reached != 0u) {
          if (lane == __ffs(int(reached)) - 1) {
            found[0] = bin;
            found[1] = remaining - (at - c);
            found[2] = c;
          }
          break;
        }
        above = __shfl_sync(kFullMask, at, 31);
      }
    }
    if (lane == 31) warp_sums[32] = through;
  }
  __syncthreads();
  return warp_sums[32];
}

// The digit d such that fewer than `remaining` keys have a larger digit and at least
// `remaining` have a digit >= d, for any block size: each thread owns a run of bins counted
// from the top (at most 4 warps: find_digit_warp). found = {d, keys still to take inside d's
// bin, keys in d's bin}. Returns the keys the bins hold.
template <int THREADS, bool WARP_SEARCH = false>
__device__ __forceinline__ int find_digit(const int* hist, int bins, int remaining, int* warp_sums, int* found,
                                          unsigned low_xor = 0u, unsigned high_xor = 0u) {
  if constexpr (THREADS <= kOneWarpDigitThreads)
    return find_digit_warp(hist, bins, remaining, warp_sums, found, low_xor, high_xor);
  constexpr int kPer = (kMaxBins + THREADS - 1) / THREADS;  // a full digit's run
  const int per = (bins + THREADS - 1) / THREADS;
  const int top = bins - int(threadIdx.x) * per;  // this thread owns bins [top - per, top)
  // Bin b of the digit is counted at hist[b ^ x]: x is high_xor in the digit's upper half, else
  // low_xor (a first pass that counted words, kRawCopy; 0 otherwise). A thread's bins lie in
  // one half, and x maps them to as many bins, reversed where it flips their low bits.
  const unsigned x = top - per >= kMaxBins / 2 ? high_xor : low_xor;
  int count = 0;
  if (kPer % 4 == 0 && per % 4 == 0 && per * THREADS == bins) {  // whole runs of 16 bytes (per is 2^i)
    const int first = int(unsigned(top - per) ^ x) & ~(per - 1);
#pragma unroll
    for (int i = 0; i < kPer; i += 4) {
      if (i < per) {
        const int4 q = *reinterpret_cast<const int4*>(hist + first + i);
        count += (q.x + q.y) + (q.z + q.w);
      }
    }
  } else {
    for (int i = 1; i <= per; ++i)
      if (top - i >= 0) count += hist[top - i];
  }
  int total;
  const int above = block_exclusive_scan<THREADS>(count, warp_sums, total);
  const bool holds = above < remaining && remaining <= above + count;  // one thread's run holds d
  // WARP_SEARCH: a run of more than 4 bins (up to 32) is searched by its thread's warp, a bin
  // a lane, where the thread's walk of up to 16 bins cost 16384 K=256 normal float32 0.666 ->
  // 0.648 warp instructions per key (counted); a shorter run by its thread, for which the
  // warp's scan costs more than it saves.
  if (WARP_SEARCH && per > 4 && per <= 32) {  // block-uniform
    const unsigned owner = __ballot_sync(kFullMask, holds);
    if (owner != 0u) {  // warp-uniform
      const int lane = lane_id(), src = __ffs(int(owner)) - 1;
      const int run_top = __shfl_sync(kFullMask, top, src), run_above = __shfl_sync(kFullMask, above, src);
      const int bin = run_top - 1 - lane;
      const int c = lane < per && bin >= 0 ? hist[unsigned(bin) ^ x] : 0;
      const int through = run_above + warp_inclusive_scan(c);  // keys at bins >= bin
      const unsigned reached = __ballot_sync(kFullMask, lane < per && remaining <= through);
      if (lane == __ffs(int(reached)) - 1) {
        found[0] = bin;
        found[1] = remaining - (through - c);
        found[2] = c;
      }
    }
  } else if (holds) {
    int before = above;
    for (int i = 1; i <= per; ++i) {
      const int c = hist[unsigned(top - i) ^ x];
      if (remaining <= before + c) {
        found[0] = top - i;
        found[1] = remaining - before;
        found[2] = c;
        break;
      }
      before += c;
    }
  }
  __syncthreads();
  return total;
}

// Deterministic ties from the candidate buffer: of the entries whose key is `key`
// (the k-th key, fully known), the `ties` of lowest index are those of largest low word
// (~index). A radix select over the index's bits (every index is below n), 11 at a time from
// the top, on those entries alone, as the passes select keys: it returns the floor and sets
// floor_mask so that exactly those entries have (~index & floor_mask) >= floor (indices are
// distinct, so the last digit's bucket is always taken whole). All threads call it, each with
// the `held` entries it holds (buffer[s * THREADS + thread], s < held; see radix_topk).
template <int THREADS>
__device__ __forceinline__ unsigned tie_floor(const u64* buffer, int held, unsigned key, int ties, int n, int* hist,
                                              int* warp_sums, int* found, unsigned& floor_mask) {
  unsigned floor = 0u, fmask = 0u;
  int need = ties;
  for (int top = 32 - __clz(max(n - 1, 1)); top > 0;) {
    const int shift = max(top - kDigitBits, 0), bins = 1 << (top - shift);
    clear_bins<THREADS>(hist, bins);
    __syncthreads();
    for (int s = 0; s < held; ++s) {
      const u64 entry = buffer[s * THREADS + thread_index()];
      const unsigned low = unsigned(entry);
      if (unpack_key(entry) == key && (low & fmask) == floor) hist_add(hist, (low >> shift) & unsigned(bins - 1));
    }
    __syncthreads();
    find_digit<THREADS>(hist, bins, need, warp_sums, found);
    floor |= unsigned(found[0]) << shift;
    fmask |= unsigned(bins - 1) << shift;
    if (found[1] == found[2]) break;  // block-uniform: found is read after find_digit's barrier
    need = found[1];
    top = shift;
  }
  floor_mask = fmask;
  return floor;
}

// ----------------------------------------------------------------------------- row access

// RowView::for_each's default: walk every step asked for.
struct NeverStop {
  __device__ __forceinline__ bool operator()() const { return false; }
};

// A row seen as a scalar head up to the first 16-byte boundary, a body of 128-bit vectors
// and a scalar tail; the same view reads the row in global memory or its copy in shared
// memory (which keeps the row's alignment phase). Loads never leave the row.
// tests/test_index_arithmetic.py drives it at the end of rows of 2^31 - 1 elements.
//   BODY_VECTORS: 0 = as many vectors as the row needs (runtime N); > 0 = at most this many
//                 vectors per thread.
//   TAIL_STEPS:   0 = runtime tail loop; > 0 = at most this many guarded scalar iterations
//                 (the tail holds fewer than V elements: one step, or none where the body
//                 ends the row).
//   UNROLL:       vectors each thread loads before it uses any (loads in flight).
//   WRITTEN:      other CTAs of the launch wrote the row (a split's merge): plain loads, not
//                 the read-only path (load_global_nc) of rows nothing in the launch writes.
// Index arithmetic stays below n, so it holds for every n up to 2^31 - 1.
template <typename Bits, int THREADS, int BODY_VECTORS, int TAIL_STEPS, int UNROLL, bool WRITTEN = false>
struct RowView {
  static constexpr int V = 16 / int(sizeof(Bits));
  static constexpr int kUnroll = UNROLL;
  const Bits* p;
  int n;

  __device__ __forceinline__ RowView(const Bits* row, int n_) : p(row), n(n_) {}

  // Scalars before the first 16-byte boundary (the layout is recomputed where it is used, so
  // that a view held across a kernel costs two registers).
  __device__ __forceinline__ int head() const {
    const int misaligned = int((16u - unsigned(reinterpret_cast<unsigned long long>(p) & 15u)) & 15u);
    return min(misaligned / int(sizeof(Bits)), n);
  }

  template <bool SHARED, typename U>
  __device__ __forceinline__ U read(const U* q) const {
    return SHARED ? *q : WRITTEN ? load_global(q) : load_global_nc(q);
  }

  __device__ __forceinline__ int body_steps(int nvec) const {
    return BODY_VECTORS > 0 ? (BODY_VECTORS + UNROLL - 1) / UNROLL : (nvec + THREADS * UNROLL - 1) / (THREADS * UNROLL);
  }
  __device__ __forceinline__ int tail_steps(int tail) const {
    return TAIL_STEPS > 0 ? min(TAIL_STEPS, (tail + THREADS - 1) / THREADS) : (tail + THREADS - 1) / THREADS;
  }

  // Steps of for_each: the head (step 0), the body (UNROLL vectors per thread a step), the tail.
  __device__ __forceinline__ int steps() const {
    const int h = head(), nvec = (n - h) / V;
    return 1 + body_steps(nvec) + tail_steps(n - h - nvec * V);
  }

  // Calls f(q, first, count) for every piece of the row this thread holds in steps
  // [first_step, end_step): `count` elements (V for a vector, 1 for a scalar, 0 for nothing;
  // see piece_element) at consecutive indices from `first`. Every thread makes the same
  // number of calls, in index order of the block's pieces, so f may use warp collectives and
  // barriers. Indices are formed only inside the row, so no int overflows for any n.
  // stop() is called after each step, by every thread (also the end of a step for f's
  // caller: StepMarks appends there): true ends the walk there, and the step after it is
  // returned (end_step, or the last step's end, otherwise). A step with nothing to read (the
  // head of an aligned row, a tail past the body's end) calls no f, only stop(). WHOLE: a
  // step whose pieces are all vectors takes no per-piece guard (f sees got == V), at the cost
  // of a second copy of f; the first pass takes it (16384 K=256 float32 1.30 -> 1.25 warp
  // instructions per key), the stream (131072 K=1024 float32 0.910 -> 0.890) and the collect
  // from a copy (kWholeCollect); the other walks gain nothing and it would cost registers.
  // GROUP: a body step calls mid() after each GROUP of its pieces (in copies of their own,
  // so that the instruction counter finds one in each); the head's and tail's steps do not.
  template <bool SHARED, bool WHOLE = false, int GROUP = UNROLL, typename F, typename Stop = NeverStop,
            typename Mid = NeverStop>
  __device__ __forceinline__ int for_each(F&& f, int first_step = 0, int end_step = 0x7fffffff,
                                          Stop&& stop = Stop(), Mid&& mid = Mid()) const {
    static_assert(UNROLL % GROUP == 0, "a step holds whole groups");
    const int t = thread_index();  // read here: nothing per-thread is hoisted across calls
    const int h = head();
    if (first_step <= 0 && end_step > 0) {
      if (h > 0) {  // block-uniform: an aligned row has no head, and its step calls no f
        // Defined even where nothing is read, so that no stale value stays alive in a register.
        uint4 q = make_uint4(0u, 0u, 0u, 0u);
        const bool on = t < h;
        if (on) q.x = read<SHARED>(p + t);
        f(q, t, on ? 1 : 0);
      }
      if (stop()) return 1;
    }
    const int nvec = (n - h) / V;
    const int body = body_steps(nvec);
    const uint4* vectors = reinterpret_cast<const uint4*>(p + h);
#pragma unroll 1  // UNROLL sets the loads in flight; a copy of the body per step is enough
    for (int s = max(first_step - 1, 0); s < min(end_step - 1, body); ++s) {
      uint4 q[UNROLL];
      // A copy of f for each of the step's pieces: no register moves between them.
      if (WHOLE && (s + 1) * UNROLL * THREADS <= nvec) {  // block-uniform: every piece a vector
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) q[u] = read<SHARED>(vectors + (s * UNROLL + u) * THREADS + t);
#pragma unroll
        for (int g = 0; g < UNROLL; g += GROUP) {
#pragma unroll
          for (int u = g; u < g + GROUP; ++u) f(q[u], h + ((s * UNROLL + u) * THREADS + t) * V, V);
          mid();
        }
      } else {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
          const int v = (s * UNROLL + u) * THREADS + t;  // < nvec + THREADS * UNROLL
          q[u] = v < nvec ? read<SHARED>(vectors + v) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int g = 0; g < UNROLL; g += GROUP) {
#pragma unroll
          for (int u = g; u < g + GROUP; ++u) {
            const int v = (s * UNROLL + u) * THREADS + t;
            f(q[u], v < nvec ? h + v * V : 0, v < nvec ? V : 0);
          }
          mid();
        }
      }
      if (stop()) return s + 2;
    }
    const int tail_start = h + nvec * V;
    const int tail = tail_steps(n - tail_start);
    if (tail > 0) {  // block-uniform: a row whose body ends it has no tail step
      for (int s = max(first_step - 1 - body, 0); s < min(end_step - 1 - body, tail); ++s) {
        uint4 q = make_uint4(0u, 0u, 0u, 0u);
        const int i = s * THREADS + t;  // position in the tail
        const bool on = i < n - tail_start;
        if (on) q.x = read<SHARED>(p + tail_start + i);
        f(q, on ? tail_start + i : 0, on ? 1 : 0);
        if (stop()) return 2 + body + s;
      }
    }
    return min(end_step, 1 + body + tail);
  }
};

// The most pieces, at most G, of whole groups of a step of UNROLL pieces.
template <int UNROLL, int G>
struct StagePieces {
  static constexpr int value = G >= UNROLL ? UNROLL : UNROLL % G == 0 ? G : StagePieces<UNROLL, G - 1>::value;
};
template <int UNROLL>
struct StagePieces<UNROLL, 1> {
  static constexpr int value = 1;
};

// The stream's read of a row from `step` (see radix_topk): each thread appends the keys whose
// value passes !(s x < bound) (s = -1 for smallest) to its list buffer[h * THREADS + t], and
// the read stops after the first step that leaves a list above `room` entries. It returns
// the next step. DIRECTION 1 (largest) or -1 (smallest) makes the direction a constant, so
// a key costs one compare (of x or -x), where choosing between them per key compared both;
// 0 reads `largest` (one copy, for kernels with few registers).
template <typename T, int DIRECTION, int THREADS, typename View>
__device__ __forceinline__ int stream_above(const View& row, int step, float bound, u64* buffer, int& held, int room,
                                            bool largest, uint4* stage) {
  typedef typename KeyTraits<T>::Bits Bits;
  constexpr int V = View::V;
  const bool up = DIRECTION == 0 ? largest : DIRECTION > 0;
  const int list = thread_index();
  int end = list + held * THREADS;  // the list's next slot
  // Bit j: element j < got of the piece passes the bound. 16-bit keys are tested two a word
  // (pair_marks, against the bound in both halves of `bound2`).
  constexpr bool kPairs = kPairCompare && sizeof(Bits) == 2;
  const unsigned bound2 = kPairs ? pair_bound<T>(up ? bound : -bound) : 0u;  // a value of T: keep_bound's
  auto passing = [&](const uint4& q, int got) {
    unsigned keep = 0u;
    if constexpr (kPairs) {
      keep = up ? pair_marks<T, true>(q, bound2, got) : pair_marks<T, false>(q, bound2, got);
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float value = bits_value<T>(piece_element<Bits>(q, j));
        keep = or_not_below(keep, up ? value : -value, bound, j < got ? 1u << j : 0u);
      }
    }
    return keep;
  };
  auto collect_above = [&](const uint4& q, int first, int got) {
    for (unsigned keep = passing(q, got); keep != 0u; keep &= keep - 1u) {
      const int j = __ffs(int(keep)) - 1;
      buffer[end] = pack(select_key<T>(piece_element<Bits>(q, j), up), first + j);
      end += THREADS;
    }
  };
  // In blocks of at most 128 threads a thread keeps kStage pieces (a body step's lie THREADS
  // vectors apart) in `stage`, the histogram's 8 KB (free while the stream reads), its piece p
  // at stage[p * THREADS + t], and walks their marks after each group (for_each's mid): a
  // warp's walk runs as often as its lane with the most keys in kStage pieces asks, where a
  // walk a piece ran as often as the lane with the most in each (131072 K=1024 normal: 1.19 ->
  // 0.62 trips a warp's piece; float32 0.705 -> 0.606, bfloat16 0.722 -> 0.618 warp
  // instructions per key, counted). The key at offset d from the group's first element is the
  // thread's Bits d of the stage. kFit: the stage, and a word of marks; kStage 1: a walk a piece.
  constexpr int kFit = THREADS > 128 ? 1 : (kMaxBins / 4) / THREADS < 32 / V ? (kMaxBins / 4) / THREADS : 32 / V;
  constexpr int kStage = StagePieces<View::kUnroll, kFit>::value;
  unsigned marks = 0u;
  int pieces = 0, group_first = 0;
  uint4* const slot = stage + list;
  const Bits* const staged = reinterpret_cast<const Bits*>(slot);
  auto walk = [&] {
    for (; marks != 0u; marks &= marks - 1u) {
      const unsigned b = lowest_bit(marks);
      const int d = int(b / V) * (THREADS * V) + int(b % V);
      buffer[end] = pack(select_key<T>(staged[d], up), group_first + d);
      end += THREADS;
    }
    pieces = 0;
  };
  auto collect_staged = [&](const uint4& q, int first, int got) {
    if (pieces == 0) group_first = first;
    slot[pieces * THREADS] = q;
    marks |= passing(q, got) << (pieces * V);
    ++pieces;
  };
  // The first fill (bound -inf: every value passes) appends every key of a piece, with no
  // compare and no walk over a mask, whose rounds a warp runs as often as its lane with the
  // most keys asks (131072 K=1024 normal: float32 0.812 -> 0.761, bfloat16 0.850 -> 0.799
  // warp instructions per key, counted). Four at a time: a whole piece of 16-bit keys at
  // once took the sm_100 bfloat16 kernels of K=1024 and 2048 on 256 threads to 109 registers.
  auto collect_all = [&](const uint4& q, int first, int got) {
#pragma unroll 4
    for (int j = 0; j < got; ++j) {
      buffer[end] = pack(select_key<T>(piece_element<Bits>(q, j), up), first + j);
      end += THREADS;
    }
  };
  const int over = list + room * THREADS;  // a list above `room` entries ends past it
  const auto crowded = [&] { return __syncthreads_or(end > over); };
  const auto walk_crowded = [&] {
    walk();
    return crowded();
  };
  if (bound == -__int_as_float(0x7f800000)) {  // block-uniform
    step = row.template for_each<false, true>(collect_all, step, 0x7fffffff, crowded);
  } else if constexpr (kStage > 1) {
    step = row.template for_each<false, true, kStage>(collect_staged, step, 0x7fffffff, walk_crowded, walk);
  } else {
    step = row.template for_each<false, true>(collect_above, step, 0x7fffffff, crowded);
  }
  held = unsigned(end - list) / unsigned(THREADS);
  return step;
}

// ----------------------------------------------------------------------------- sorts

// One stage of a bitonic merge of `size` on E packed values per thread, element t * E + e of
// thread t: partners within the thread (stride < E) swap in registers, partners in other
// lanes of the warp (E <= stride < 32 * E) through one shuffle. Descending blocks of `size`
// alternate with ascending ones (the block holding element 0 descends).
template <int E, int STRIDE>
__device__ __forceinline__ void register_merge_stage(u64 (&v)[E], int first, int size) {
  if constexpr (STRIDE < E) {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      if ((e & STRIDE) == 0) {
        const u64 a = v[e], b = v[e + STRIDE];
        const bool descending = ((first + e) & size) == 0;
        const bool swap = (a < b) == descending;
        v[e] = swap ? b : a;
        v[e + STRIDE] = swap ? a : b;
      }
    }
  } else {
    // size > STRIDE >= E: the direction and the side are the thread's, not the element's
    const bool keep_larger = ((first & size) == 0) == ((first & STRIDE) == 0);
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const u64 other = __shfl_xor_sync(kFullMask, v[e], STRIDE / E);
      v[e] = (v[e] > other) == keep_larger ? v[e] : other;
    }
  }
}

// The stages of a bitonic merge of `size` whose strides are below STRIDE * 2 (a warp's
// elements): STRIDE, STRIDE / 2, ..., 1.
template <int E, int STRIDE>
__device__ __forceinline__ void register_merge(u64 (&v)[E], int first, int size) {
  register_merge_stage<E, STRIDE>(v, first, size);
  if constexpr (STRIDE > 1) register_merge<E, STRIDE / 2>(v, first, size);
}

// Sorts of every block of SIZE, SIZE * 2, ..., up to a warp's 32 * E elements (SIZE = 2 first).
template <int E, int SIZE>
__device__ __forceinline__ void register_sort_runs(u64 (&v)[E], int first) {
  register_merge<E, SIZE / 2>(v, first, SIZE);
  if constexpr (SIZE < 32 * E) register_sort_runs<E, SIZE * 2>(v, first);
}

// The stages of a bitonic merge of SIZE through shared memory whose strides cross warps
// (STRIDE, STRIDE / 2, ..., a warp's RUN elements), a barrier after each: pair i < width / 2
// (a multiple of 32) compares cand[lo] and cand[lo + STRIDE] and keeps the larger first in a
// descending block of SIZE; thread t takes pairs t, t + THREADS, ...
template <int KR, int THREADS, int RUN, int SIZE, int STRIDE>
__device__ __forceinline__ void shared_merge(u64* cand, int width) {
#pragma unroll
  for (int j = 0; j < (KR / 2 + THREADS - 1) / THREADS; ++j) {
    const int i = j * THREADS + thread_index();
    if (i < width / 2) {
      const int lo = ((i & -STRIDE) << 1) | (i & (STRIDE - 1)), hi = lo + STRIDE;
      const u64 a = cand[lo], b = cand[hi];
      if ((a < b) == ((lo & SIZE) == 0)) { cand[lo] = b; cand[hi] = a; }
    }
  }
  __syncthreads();
  if constexpr (STRIDE / 2 >= RUN) shared_merge<KR, THREADS, RUN, SIZE, STRIDE / 2>(cand, width);
}

// The bitonic merges of SIZE, SIZE * 2, ... up to `width` (at most KR) of the E elements a
// thread holds (t * E + e, see register_sort): the strides that cross warps in cand, the
// others in registers.
template <int KR, int THREADS, int E, int SIZE>
__device__ __forceinline__ void register_merges(u64 (&v)[E], u64* cand, int width, int first, bool holds) {
  constexpr int RUN = 32 * E;
  if constexpr (SIZE <= KR) {
    if (SIZE > width) return;  // block-uniform
    if (holds) {
#pragma unroll
      for (int e = 0; e < E; ++e) cand[first + e] = v[e];
    }
    __syncthreads();
    shared_merge<KR, THREADS, RUN, SIZE, SIZE / 2>(cand, width);
    if (holds) {
#pragma unroll
      for (int e = 0; e < E; ++e) v[e] = cand[first + e];
    }
    if (KR / E >= THREADS || holds) register_merge<E, RUN / 2>(v, first, SIZE);
    register_merges<KR, THREADS, E, SIZE * 2>(v, cand, width, first, holds);
  }
}

// Bitonic sort, descending, of the k <= KR packed candidates cand[0, k) (the padding 0 past
// k sorts last), in place. Thread t holds E consecutive elements t * E + e in registers:
// every stride below a warp's 32 * E elements is a swap in registers or a shuffle; only the
// strides that cross warps go through cand, a barrier a stage. The merges stop at `width`,
// the smallest power of two (at least a warp's elements) that holds k; the warps past it
// (where the block has more than KR / E threads) skip the register stages but not the barriers.
template <int KR, int THREADS, int E>
__device__ __forceinline__ void register_sort(u64* cand, int k) {
  constexpr int RUN = 32 * E;  // a warp's elements
  static_assert(KR % RUN == 0 && KR / E <= THREADS, "the block's warps hold KR elements");
  const int first = thread_index() * E;
  const int width = max(RUN, 1 << (32 - __clz(k - 1)));  // k >= 1
  const bool holds = first < width;  // warp-uniform: width is a multiple of RUN
  u64 v[E];
#pragma unroll
  for (int e = 0; e < E; ++e) v[e] = holds && first + e < k ? cand[first + e] : 0ull;
  if (KR / E >= THREADS || holds) {  // a branch only where some warps hold nothing
    register_sort_runs<E, 2>(v, first);
  }
  register_merges<KR, THREADS, E, 2 * RUN>(v, cand, width, first, holds);
  if (holds) {
#pragma unroll
    for (int e = 0; e < E; ++e) cand[first + e] = v[e];
  }
  __syncthreads();
}

{% if large %}
// Bitonic sort, descending, of cand[0, k) for any k up to 2^31 - 1 (the large-k path, whose
// candidates lie in global memory): the merge network whose first step of each merge pairs
// position i with its mirror, so that every comparison keeps the larger key at the lower
// position. Positions at or past k stand for keys below every key and never move, so they
// need no padding (and no memory). Positions are 64-bit: the padded width may be 2^31.
template <int THREADS>
__device__ __forceinline__ void block_sort_global(u64* cand, long long k) {
  long long width = 1;
  while (width < k) width <<= 1;
  for (long long size = 2; size <= width; size <<= 1) {
    for (long long stride = size >> 1; stride > 0; stride >>= 1) {
      for (long long i = threadIdx.x; i < width / 2; i += THREADS) {
        long long lo, hi;
        if (stride == size >> 1) {  // the mirror step: i-th pair of its block of `size`
          const long long start = (i / stride) * size, p = i % stride;
          lo = start + p;
          hi = start + size - 1 - p;
        } else {
          lo = ((i / stride) * 2) * stride + i % stride;
          hi = lo + stride;
        }
        if (hi < k) {
          const u64 a = cand[lo], b = cand[hi];
          if (a < b) {
            cand[lo] = b;
            cand[hi] = a;
          }
        }
      }
      __syncthreads();
    }
  }
}

{% endif %}
// Bitonic sort of 32 * E packed values held by one warp (E per lane, element e * 32 + lane),
// descending, with shuffles only: no block barrier for k <= 64.
template <int E>
__device__ __forceinline__ void warp_sort(u64 (&v)[E]) {
  const int lane = lane_id();
#pragma unroll
  for (int size = 2; size <= 32 * E; size <<= 1) {
#pragma unroll
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      if (stride >= 32) {  // partners in the same lane (E == 2, size == 64: descending)
        const u64 a = v[0], b = v[E - 1];
        v[0] = a > b ? a : b;
        v[E - 1] = a > b ? b : a;
      } else {
#pragma unroll
        for (int e = 0; e < E; ++e) {
          const u64 other = __shfl_xor_sync(kFullMask, v[e], stride);
          const bool descending = ((e * 32 + lane) & size) == 0, lower = (lane & stride) == 0;
          v[e] = (lower == descending) == (v[e] > other) ? v[e] : other;
        }
      }
    }
  }
}

// ----------------------------------------------------------------------------- radix top-k

// Where a radix pass reads its keys: the row in global memory, the row's copy in dynamic
// shared memory, or the candidates (packed key and index) collected there.
enum Source { kGlobalRow = 0, kSharedRow = 1, kBuffer = 2 };

// The kernels' `flags` parameter (after row_stride, or largest for register kernels): how the output
// is written. kUnsorted: the k results in no promised order, so the final sort is skipped
// (deterministic kernels sort anyway: their gather's order follows atomics, which vary run
// to run on a GPU, and the sort is what makes the order repeatable); kInt32Indices: the
// indices output holds int32, written by the kernel (every index is below n <= 2^31 - 1).
constexpr int kUnsorted = 1, kInt32Indices = 2;

// Output i's index, as `flags` says: int64 (the default, torch's) or int32.
__device__ __forceinline__ void store_index(long long* indices, unsigned long long i, long long index, int flags) {
  if (flags & kInt32Indices) {
    store_global(reinterpret_cast<int*>(indices) + i, int(index));
  } else {
    store_global(indices + i, index);
  }
}

// The part of the input a CTA takes (topkgen.split): with chunk < n each row is cut into
// n / chunk chunks of `chunk` elements, CTA row * chunks + c taking chunk c (the last one
// also the rest of the row); otherwise one CTA takes a whole row. `offset` is the chunk's
// first element in x (and x_indices); `first` its position in the row. Recomputed where it
// is used, from blockIdx and the kernel's parameters, so that no register holds it through
// the passes.
struct Part {
  int row, first, n;
  unsigned long long offset;
};

__device__ __forceinline__ Part part_of_row(int n, int chunk, long long row_stride, int block) {
  if (!(chunk > 0 && chunk < n))  // one CTA a row: no division
    return Part{block, 0, n, (unsigned long long)block * (unsigned long long)row_stride};
  const int chunks = n / chunk;
  const int row = block / chunks, c = block - row * chunks;
  const int first = c * chunk;
  const int count = c == chunks - 1 ? n - first : chunk;
  return Part{row, first, count, (unsigned long long)row * (unsigned long long)row_stride + (unsigned long long)first};
}

// A ragged batch's windows (topkgen.runtime: lengths=, starts=). lengths null: every row is
// dense, and nothing below reads memory or changes a Part. Otherwise row r's candidates are
// x[r, S[r] : S[r] + L[r]] with L = lengths[r] and S = starts[r] (0 where starts is null),
// both of `bytes` bytes (4: int32, 8: int64), read on the device only. The kernel clamps each
// window to the row: S to [0, n], then L to [0, n - S] (the runtime's check=True refuses such
// windows on the host first). A split cuts the window, not the row, into the same chunks, so
// the chunks past a row's window are empty and do no work, and the candidates of a row's
// chunks lie first in stage 2's row: `split_n` (stage 2 only; 0 elsewhere) is stage 1's n,
// from which stage 2 finds each window and counts them (every chunk holds >= k elements).
struct Window {
  const void* lengths;
  const void* starts;
  int bytes;
  int split_n;
};

// Entry `row` of a lengths or starts array, read once per warp (lane 0) and shuffled to the
// others: every lane of a full warp calls it (a CTA's threads, or a register kernel's warp).
__device__ __forceinline__ long long window_entry(const void* p, int bytes, int row) {
  long long entry = 0;
  if (lane_id() == 0)
    entry = bytes == 8 ? load_global_nc(static_cast<const long long*>(p) + row)
                       : (long long)load_global_nc(static_cast<const int*>(p) + row);
  return __shfl_sync(kFullMask, entry, 0);
}

// Row `row`'s window [first, first + n) within its n elements, clamped to the row.
__device__ __forceinline__ void window_of(const Window& w, int row, int n, long long& first, int& length) {
  const long long s = w.starts == nullptr ? 0 : min(max(window_entry(w.starts, w.bytes, row), 0ll), (long long)n);
  const long long l = min(max(window_entry(w.lengths, w.bytes, row), 0ll), (long long)n - s);
  first = s;
  length = int(l);
}

// part_of_row of a ragged batch (its dense Part where lengths is null or the CTA has no row):
// the CTA's chunk of its row's window, empty (n = 0) past the window's end.
__device__ __forceinline__ Part part_of_window(int n, int chunk, long long row_stride, int rows, int k,
                                               const Window& w, int block) {
  Part part = part_of_row(n, chunk, row_stride, block);
  if (w.lengths == nullptr || part.row >= rows) return part;
  long long first;
  int length;
  window_of(w, part.row, w.split_n > 0 ? w.split_n : n, first, length);
  if (w.split_n > 0) {  // stage 2: the candidates of the stage-1 chunks of the window
    const int chunks = n / k, stage1_chunk = w.split_n / chunks, full = length / stage1_chunk;
    part.n = full >= chunks ? n : full * k + min(k, length - full * stage1_chunk);
    return part;
  }
  const int chunks = chunk > 0 && chunk < n ? n / chunk : 1;
  const int c = block - part.row * chunks;
  const long long lo = min((long long)c * chunk, (long long)length);
  const long long hi = c == chunks - 1 ? (long long)length : min(lo + chunk, (long long)length);
  part.first = int(first + lo);
  part.n = int(hi - lo);
  part.offset = (unsigned long long)part.row * (unsigned long long)row_stride + (unsigned long long)part.first;
  return part;
}

// A split in one launch (topkgen.policy.split, tickets): whether this CTA is the last of its
// row's chunks to have stored its candidates, and so merges them. The hand-over of the PTX
// memory model: the barrier orders every thread's stores before thread 0's fence (fences are
// cumulative), the fence before its ticket (release); the last ticket's fence orders the other
// chunks' stores before this CTA's reads of them (acquire), plain loads (load_global: the fence
// drops the SM's L1 lines). Each chunk takes one ticket, so the last finds chunks - 1 and
// returns the word to 0 for the next launch. The emulator checks each step (check_ordering).
__device__ __forceinline__ bool last_of_row(unsigned* tickets, int row, int chunks) {
  __shared__ int last;
  __syncthreads();
  if (thread_index() == 0) {
    __threadfence();
    last = atomic_add_global(tickets + row, 1u) == unsigned(chunks - 1);
    if (last) {
      atomic_exch_global(tickets + row, 0u);
      __threadfence();
    }
  }
  __syncthreads();
  return last != 0;
}

// Output slots [from, to) of a row with fewer than k candidates: index -1 and the value
// below every value (-inf for the largest, +inf for the smallest). Thread t of `stride`.
template <typename T>
__device__ __forceinline__ void pad_slots(T* values, long long* indices, unsigned long long base, int from, int to,
                                          bool largest, int t, int stride, int flags) {
  typedef KeyTraits<T> Tr;
  const typename Tr::Bits inf = typename Tr::Bits(Tr::kExp | (largest ? Tr::kSign : 0u));
  for (int i = from + t; i < to; i += stride) {
    store_global(reinterpret_cast<typename Tr::Bits*>(values) + base + i, inf);
    store_index(indices, base + i, -1ll, flags);
  }
}

// What the passes know about the k-th key. It lives in shared memory, written by thread 0
// between barriers, so that no register holds it through the passes' loops.
struct RadixState {
  unsigned prefix, mask;  // the k-th key's bits found so far
  int remaining;          // keys still to take among those matching the prefix
  int bucket;             // keys matching the prefix
  int source;             // where the next pass reads
};

// radix_topk's shared variables, one set per kernel whichever copies it holds: a split's merge
// (MERGE) runs after the chunk's selection, in the same CTA, and takes the same memory.
template <int KR>
struct RadixShared {
  __align__(16) int hist[kMaxBins];  // find_digit reads 16-byte runs
  int warp_sums[33];
  int found[3];
  unsigned span[2];  // smallest and largest key a pass counted
  int counters[3];   // output candidates, tie slots, collected candidates
  RadixState state;
  float stream_bound;      // the stream keeps values x with !(s x < bound) (keep_bound)
  bool stream_steps_done;  // the stream's top k can take no later key
  int stream_room;         // the entries a list may hold before the stream stops for a refill
  u64 cand[KR > 0 ? KR : 1];
};

template <int KR>
__device__ __forceinline__ RadixShared<KR>& radix_shared() {
  __shared__ RadixShared<KR> shared;
  return shared;
}

// Radix select, one CTA per row, reading the input once where it can. Its dynamic shared memory
// is the launch's `shared_bytes` (topkgen.policy.split.SharedMemory), within the SMEM_BYTES it
// was compiled for (0: none, the global-memory paths alone):
// - a row of at most shared_bytes is copied to dynamic shared memory by the first pass, and
//   is read from the copy from then on; the copy holds the keys, so no later pass transforms
//   (kRawCopy: the words, which the collect compares as they are, made keys where a pass or
//   the gather reads the copy whole);
// - the first later pass whose bucket (with the k - remaining keys above it) fits the
//   candidate buffer (past a resident row's copy, or all of dynamic shared memory for a
//   longer row) starts with one scan of the copy or the row that collects them, and that
//   pass, the ones after it and the gather read the candidates only. A bucket that never
//   fits is filtered from the copy or the row in each pass (the fallback).
// Passes take 11-bit digits MSB-first and stop early once the k-th key is resolved (its
// bucket holds exactly the keys still to take, or a single key). Deterministic mode takes
// the ties with the lowest indices (by index from the candidate buffer, or an ordered scan of
// the row); fast mode any of them.
// Row access goes through RowView alone, so a part of a row is served the same way: a CTA
// takes a chunk of a row when `chunk` splits it (Part), and writes the chunk's top k at
// blockIdx.x * k with indices in the row; with x_indices (a split's merge) the indices it
// writes are those x_indices holds for the elements it took. MERGE: a split's merge in the
// launch whose CTAs wrote the candidates (the last CTA of the row's `chunks`, radix_select.cu.j2):
// it reads them with plain loads (RowView WRITTEN), never streams (its row is chunks x k
// candidates), and its row is blockIdx.x / chunks.
template <typename T, int KR, int THREADS, bool DETERMINISTIC, int BODY_VECTORS, int TAIL_STEPS, int EXACT_N,
          int SMEM_BYTES, int UNROLL, int MIN_CTAS, bool MERGE = false>
__device__ __forceinline__ void radix_topk(const T* __restrict__ x, const long long* __restrict__ x_indices,
                                           T* __restrict__ values, long long* __restrict__ indices, int rows, int n_arg,
                                           int k_out, bool largest, int chunk, long long row_stride,
                                           unsigned char* dynamic_shared, int shared_bytes, int flags, u64* scratch,
                                           const Window window, int chunks = 1) {
  typedef typename KeyTraits<T>::Bits Bits;
  typedef RowView<Bits, THREADS, BODY_VECTORS, TAIL_STEPS, UNROLL, MERGE> View;
  constexpr int V = View::V;
  constexpr int KEY_BITS = KeyTraits<T>::kBits;
  constexpr int PASSES = (KEY_BITS + kDigitBits - 1) / kDigitBits;
  // The launch's dynamic shared memory, whole 16-byte units within the compiled maximum.
  const int smem = SMEM_BYTES > 0 ? min(max(shared_bytes, 0), SMEM_BYTES) & ~15 : 0;
  const int row_capacity = smem / int(sizeof(Bits));  // keys of a resident row
  RadixShared<KR>& shared = radix_shared<KR>();
  int (&hist)[kMaxBins] = shared.hist;
  int (&warp_sums)[33] = shared.warp_sums;
  int (&found)[3] = shared.found;
  unsigned (&span)[2] = shared.span;
  int (&counters)[3] = shared.counters;
  RadixState& state = shared.state;
  float& stream_bound = shared.stream_bound;
  bool& stream_steps_done = shared.stream_steps_done;
  int& stream_room = shared.stream_room;
{% if large %}
  // The large-k path (KR = 0): the k candidates are gathered into this row's slots of the
  // indices output (8 bytes each, what a packed candidate takes) and sorted there; int32
  // indices (4 bytes a slot) take them in `scratch` instead, rows x k x 8 bytes.
  u64* const cand = (scratch != nullptr ? scratch : reinterpret_cast<u64*>(indices)) +
                    (unsigned long long)blockIdx.x * (unsigned long long)k_out;
{% else %}
  u64 (&cand)[KR] = shared.cand;
{% endif %}

  // block_index (a fresh read where used) below 1024 threads; at 1024 (the large-k path, K=4096)
  // blockIdx, which ptxas may keep: block_index took 1 x 163840 k=40000 unsorted float32 from
  // 2.73 to 2.94 warp instructions per key, counted (its output loop).
  const int block = MERGE ? int(blockIdx.x) / chunks : THREADS < 1024 ? block_index() : int(blockIdx.x);
  const Part part = part_of_window(n_arg, chunk, row_stride, rows, k_out, window, block);
  if (part.row >= rows) return;
  const int n = EXACT_N > 0 && window.lengths == nullptr ? EXACT_N : part.n;
  // A window shorter than k yields its n candidates, then padding (k == k_out when dense).
  const int k = min(k_out, n);
  if (k == 0) {  // an empty window: a stage-1 chunk past it writes nothing (stage 2 skips it)
    if (!(chunk > 0 && chunk < n_arg))
      pad_slots<T>(values, indices, (unsigned long long)(MERGE ? block : int(blockIdx.x)) * k_out, 0, k_out, largest,
                   thread_index(), THREADS, flags);
    return;
  }
  const Bits* row_bits = reinterpret_cast<const Bits*>(x) + part.offset;
  const View global_row(row_bits, n);
  // The copy keeps the row's alignment phase, so the same vectors are aligned in both.
  const bool resident = SMEM_BYTES > 0 && n <= row_capacity - (V - 1);
  Bits* copy = reinterpret_cast<Bits*>(dynamic_shared) + (V - global_row.head()) % V;
  // Candidates are collected past the copy of a resident row (16-byte aligned), where the
  // row leaves room, or from the start of dynamic shared memory.
  const int buffer_offset = resident ? ((n + V - 1) * int(sizeof(Bits)) + 15) & ~15 : 0;
  u64* buffer = reinterpret_cast<u64*>(dynamic_shared + buffer_offset);
  const int buffer_capacity = (smem - buffer_offset) / int(sizeof(u64));  // collected candidates

  // The buffer is THREADS lists: thread t's entries are buffer[s * THREADS + t], s < held, so
  // that the stream below appends with no atomic (a compact fill, the slots of one counter, is
  // the same layout). The loops over a list step its index in the buffer by THREADS, an add a
  // slot where s * THREADS + t cost a multiply-add (131072 K=1024 float32 0.959 -> 0.888 warp
  // instructions per key, counted), and a drop writes every entry it reads, advancing past
  // the ones it keeps, with no branch.
  const int list_capacity = buffer_capacity / THREADS;
  int held = 0;

  // A row longer than shared memory is read once (`stream`): each thread appends its keys at
  // or above a floor to its list while the row is read, the floor starting below every key.
  // When a list may not take another step's keys (the first round: stream_room, below), the
  // passes refill the buffer: each pass over
  // it drops the keys below the bucket found so far, and once every list has room the floor
  // rises to that bucket's; where no pass leaves room, the top k of the buffer replace it and
  // the floor rises to their smallest key (past it where that key is exact: a later equal key
  // has a higher index, so it ranks below all k). The rest of the row is read on from there.
  // Every key dropped is below k kept keys, so the buffer holds the top k when the row ends,
  // and the passes select them from it. The stream compares values, not
  // keys (keep_bound), and makes a key of what it keeps only. Where a list cannot hold its
  // share of k and a step's keys, the row is read again in the passes instead; so is it in
  // blocks of 1024 threads, whose lists hold 12 entries: there the refills cost about what the
  // second read saves (K=1024 at 131072, float32 1.81 against 1.84 warp instructions per key,
  // bfloat16 2.90 against 1.44, counted), so the default policy runs K=512 to 2048 on 256
  // threads (threads_by_k), whose lists of 48 stream at 0.97 and 1.04.
  constexpr int kStepKeys = UNROLL * V;  // the most keys one step of for_each gives a thread
  // The stream and float32's first pass run a copy per direction where the launch bounds leave
  // a thread 64 registers or more; at 32 (1024 threads, 2 CTAs per SM) the copies spill.
  constexpr bool kCopyPerDirection = 65536 / (THREADS * MIN_CTAS) >= 64;
  // The first pass leaves NaNs as the flip makes them and asks after it whether the row had
  // one (nan_max), where the launch bounds cap a thread below 128 registers. Above it ptxas
  // took the kernels of K=512 to 2048 on 256 threads (2 CTAs per SM) from 96 registers, the
  // radix budget, to 104-110, their live count unchanged.
  constexpr bool kNanAfter = 65536 / (THREADS * MIN_CTAS) < 128;
  // The collect from a resident row's copy walks whole steps with no per-piece guard (WHOLE) in
  // fast kernels of at most 128 threads (16384 K=256 normal: float32 0.737 -> 0.701, bfloat16
  // 0.697 -> 0.678 warp instructions per key, counted). Elsewhere ptxas spilled 12 bytes (the
  // deterministic bfloat16 sm_90 kernels) or took float32 sm_100 kernels of K=1024 and 2048 on
  // 256 threads to 100-101 registers.
  constexpr bool kWholeCollect = !DETERMINISTIC && THREADS <= 128;
  // Where the collect walks whole steps, a row's copy keeps its words, not their keys
  // (`copy_raw`): the first pass counts the words' top digit (find_digit reads the bins through
  // the flip) and stores the words, taking no flip, 2 of its 6 instructions a key;
  // the collect compares words in the order of keys (one compare a key, as before). A copy
  // that a later pass or the gather reads whole is made keys first (copy_to_keys), once.
  // bfloat16 too since the in-place compare of 16-bit halves (16384 K=256 normal 0.608 ->
  // 0.572 warp instructions per key, counted, 2 rows), once block_index and a per-pass
  // word_bins gave the sm_90 kernels back the register whose lack spilled 4-12 bytes.
  constexpr bool kRawCopy = kWholeCollect && kNanAfter;
  constexpr bool kStreams = !MERGE && KR > 0 && SMEM_BYTES > 0 && THREADS < 1024;
  // Where rows longer than shared memory stream (kStreams), float32's first pass over a raw
  // copy keeps no nan_max (a max.NaN a word) and asks its bins after it whether the row may
  // hold a NaN whose word misorders it (16384 K=256 float32, normal 0.700 -> 0.674 warp
  // instructions per key, tie-heavy 1.061 -> 1.035, 90% -inf, whose copy is scanned, 0.659 ->
  // 0.685, counted). bfloat16 gained 0.003 and spilled 4 bytes in the sm_90 fast kernels.
  constexpr bool kNanBins = kRawCopy && kStreams && KEY_BITS == 32;
  // A raw copy of 16-bit keys is collected two keys a compare where the GPU has one (sm_90 and
  // later, kPairCompare), where a shift, a compare and a select a key cost 16384 K=256 normal
  // bfloat16 0.669 -> 0.610, uniform 0.965 -> 0.907 warp instructions per key (counted).
  constexpr bool kPairCollect = kRawCopy && kPairCompare && KEY_BITS == 16;
  constexpr unsigned kNanWord = KeyTraits<T>::kAll >> 1;  // a NaN in a raw copy: the top key either way
  bool copy_raw = false;
  auto copy_to_keys = [&] {  // block-uniform
    if (kRawCopy && copy_raw) {
      const unsigned invert = largest ? 0u : ~0u;
      __syncthreads();
      for (int i = thread_index(); i < n; i += THREADS) copy[i] = Bits(word_select_keys<T, false>(copy[i], invert));
      __syncthreads();
      copy_raw = false;
    }
  };
  const bool stream = kStreams && !resident && list_capacity - kStepKeys >= (k + THREADS - 1) / THREADS;
  int step = 0;  // the stream's next step of for_each
  // Counted once: the rounds' tests recomputed it after the first pass's NaN question came in
  // (131072 K=1024 normal bfloat16 0.803 -> 0.796 warp instructions per key, counted).
  const int row_steps = global_row.steps();
  if (thread_index() == 0) {
    counters[0] = counters[1] = counters[2] = 0;
    state = RadixState{0u, 0u, k, n, stream ? int(kBuffer) : int(kGlobalRow)};
    stream_bound = -__int_as_float(0x7f800000);  // -inf: every value passes
    // The first round, whose floor lies below every key, appends every key it reads, and the
    // first refill's passes walk them all. It stops near sqrt(n k) keys instead of at full
    // lists (a fill f and the n k / f keys that pass its bound: least near f = sqrt(n k),
    // here a power of two), at least a list's share of k and a piece, so that at its stop
    // (lists at most one head key apart) the lists hold k keys. Counted (normal rows, float32):
    // 24576 K=256 1.037 -> 0.854, 32000 K=64 0.754 -> 0.584, 65536 K=256 0.544 -> 0.512 warp
    // instructions per key (uniform 24576 K=64 1.217 -> 0.812); a resident row pays these
    // lines, 13 warp instructions (16384 K=256 0.6605 -> 0.6613). Later rounds fill the lists.
    const int sqrt_nk = 1 << ((62 - __clz(n) - __clz(k)) / 2);
    stream_room = min(list_capacity - kStepKeys, max((k + THREADS - 1) / THREADS + V, sqrt_nk / THREADS));
  }
  for (;;) {  // one round, or a round per refill of the buffer (stream)
  if (stream) {
    counter_phase("stream");
    __syncthreads();  // stream_bound and the buffer are the last round's
    const float bound = stream_bound;
    // Each copy in an arm of its own: on one line both would share the instruction counter's
    // path and both be charged.
    const int room = stream_room;
    uint4* const stage = reinterpret_cast<uint4*>(hist);  // free until the first pass clears it
    if constexpr (!kCopyPerDirection) {
      step = stream_above<T, 0, THREADS>(global_row, step, bound, buffer, held, room, largest, stage);
    } else if (largest) {
      step = stream_above<T, 1, THREADS>(global_row, step, bound, buffer, held, room, true, stage);
    } else {
      step = stream_above<T, -1, THREADS>(global_row, step, bound, buffer, held, room, false, stage);
    }
  }
  const bool refill = stream && step < row_steps;
  bool refilled = false;
  for (int pass = 0; pass < PASSES; ++pass) {
    counter_phase(pass == 0 ? "histogram, first pass" : "histogram, later passes");
    const int shift = digit_shift(KEY_BITS, pass);
    const int bins = 1 << (KEY_BITS - pass * kDigitBits - shift);
    clear_bins<THREADS>(hist, bins);
    if (thread_index() == 0) {
      span[0] = ~0u;
      span[1] = 0u;
    }
    __syncthreads();
    const unsigned prefix = state.prefix, mask = state.mask;
    int source = state.source;
    unsigned lo = ~0u, hi = 0u;
    // A later pass counts a key of the prefix's bucket by its digit; the span of those keys.
    // The collect from the copy and the walk after it (count_walk) call it; the passes below
    // spell it out, where calling it took the sm_100 K=1024 kernel on 256 threads
    // (test_large_k_build's) from 96 to 101 registers.
    auto count_key = [&](unsigned key) {
      if ((key & mask) == prefix) {
        lo = min(lo, key);
        hi = max(hi, key);
        hist_add(hist, (key >> shift) & unsigned(bins - 1));
      }
    };
    // Once the k-th key's bucket and the keys above it fit the buffer, one scan of the row (or
    // of its copy) collects them, each lane its own keys with one atomic a piece (a step, from
    // the copy: StepMarks), and this pass, the later ones and the gather read the buffer
    // alone. A key is at or above the prefix when key >= prefix: the prefix has no bits below
    // the mask. float32's collect from the copy counts this pass as it appends (`counted`),
    // where a walk over the lists cost 16384 K=256 tie-heavy float32 (1024 ties of the k-th
    // key) 0.1 warp instructions a key; the collect from the row leaves it to the lists:
    // counting there took the sm_100 kernels of K=1024 and 2048 on 256 threads past the radix
    // budget of 96 registers. 16-bit keys count in a walk of the buffer after the collect
    // (`count_walk`, nothing to drop): their pair collect's appends take a few lanes a trip,
    // each paying the count, where the walk takes 32 keys (4096 x 16384 K=256 bfloat16 normal
    // 0.611 -> 0.594, tie-heavy 0.901 -> 0.865 warp instructions per key; float32 0.675 -> 0.687,
    // counted).
    constexpr bool kCountInCollect = KEY_BITS == 32;
    auto on_collect = [&](unsigned key) {
      if constexpr (kCountInCollect) count_key(key);
    };
    bool counted = false, count_walk = false;
    bool word_bins = false;  // the first pass's bins count words (find_digit)
    if (SMEM_BYTES > 0 && pass > 0 && source != kBuffer && state.bucket <= buffer_capacity - (k - state.remaining)) {
      auto collect = [&](const uint4& keys, int first, int got) {
        unsigned keep = 0u;
#pragma unroll
        for (int j = 0; j < V; ++j) keep |= (j < got && piece_element<Bits>(keys, j) >= prefix ? 1u : 0u) << j;
        lane_append<Bits>(&counters[2], keep, keys, first, buffer, 0x7fffffff);
      };
      if (source == kSharedRow) {
        // From the copy, each step's words whose keys are at or above the prefix are marked and
        // appended at its end (StepMarks), as keys.
        const unsigned invert = largest ? 0u : ~0u;
        auto key_of = [&](unsigned word) {  // a 16-bit word's flip also sets its empty high half's sign
          return copy_raw ? word_select_keys<T, false>(word, invert) & KeyTraits<T>::kAll : word;
        };
        const View shared_row(copy, n);
        // A word's key is >= the prefix P, in the order of keys (the flip, word_select_keys,
        // is w ^ 0x80000000 for w >= 0, ~w below; smallest inverts it): largest takes the
        // words of one unsigned interval, [P ^ 0x80000000, 0x7fffffff] or [0, ~P], smallest
        // [P, ~0u] or those signed at most ~P ^ 0x80000000: one compare a word either way.
        constexpr unsigned kSign = KeyTraits<T>::kSign;
        int* const counter = &counters[2];
        constexpr bool W = kWholeCollect;
        if constexpr (kPairCollect) {
          // 16-bit words two an instruction, as values (pair_not_below), where the prefix
          // is not a zero's and holds no NaN key (largest: not above +inf's; smallest: not 0),
          // else from a copy made keys (block-uniform).
          if (copy_raw && prefix != kSign && (largest ? prefix <= (KeyTraits<T>::kExp | kSign) : prefix != 0u)) {
            const float v = keep_bound<T>(prefix, largest);
            const unsigned b2 = pair_bound<T>(largest ? v : -v);
            if (largest) {
              collect_marked<T, THREADS, UNROLL, W, 4>(shared_row, copy, b2, key_of, on_collect, counter, buffer);
            } else {
              collect_marked<T, THREADS, UNROLL, W, 5>(shared_row, copy, b2, key_of, on_collect, counter, buffer);
            }
          } else {
            copy_to_keys();
            collect_marked<T, THREADS, UNROLL, W, 0>(shared_row, copy, prefix, key_of, on_collect, counter, buffer);
          }
        } else if constexpr (!kRawCopy) {
          collect_marked<T, THREADS, UNROLL, W, 0>(shared_row, copy, prefix, key_of, on_collect, counter, buffer);
        } else if (!copy_raw || (!largest && prefix >= kSign)) {  // block-uniform
          collect_marked<T, THREADS, UNROLL, W, 0>(shared_row, copy, prefix, key_of, on_collect, counter, buffer);
        } else if (largest && prefix >= kSign) {
          collect_marked<T, THREADS, UNROLL, W, 2>(shared_row, copy, prefix ^ kSign, key_of, on_collect, counter,
                                                   buffer);
        } else if (largest) {
          collect_marked<T, THREADS, UNROLL, W, 1>(shared_row, copy, ~prefix, key_of, on_collect, counter, buffer);
        } else {
          collect_marked<T, THREADS, UNROLL, W, 3>(shared_row, copy, ~prefix ^ kSign, key_of, on_collect, counter,
                                                   buffer);
        }
      } else {
        global_row.template for_each<false>(as_keys<T>(collect, largest));
      }
      counted = kCountInCollect && source == kSharedRow;
      count_walk = !kCountInCollect;
      source = kBuffer;
      __syncthreads();
      held = (counters[2] - thread_index() + THREADS - 1) / THREADS;  // the compact fill's lists
    }
    // Counts the keys of a piece (see piece_keys) that match the prefix (bits j < got); the
    // span of the matching ones.
    auto later_pass = [&](const uint4& keys, int, int got) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const unsigned key = piece_element<Bits>(keys, j);
        if (j < got && (key & mask) == prefix) {
          lo = min(lo, key);
          hi = max(hi, key);
          hist_add(hist, (key >> shift) & unsigned(bins - 1));
        }
      }
    };
    // The first pass counts every key of the row (no prefix yet) by its top digit; a
    // resident row is copied to shared memory on the way. A whole vector takes no branch.
    // Its span tells one key from many. Fast mode keeps none while it reads (a min and a max
    // a key cost 16384 K=256 normal float32 0.795 -> 0.754 warp instructions per key,
    // bfloat16's XOR a word 0.82 -> 0.78, counted) and asks after it, below. Deterministic
    // mode's lo ANDs the keys and hi ORs them (16-bit keys: whole words, folded after the
    // pass), which the passes' reduction (a min of lo, a max of hi) leaves equal only where
    // every key is that one: the question below took its kernels of K=512 to 2048 on 256
    // threads from 96 registers, the radix budget, to 100-110 (ptxas, not the live count).
    auto first_pass = [&](const uint4& keys, int first, int got) {
      if (got == 0) return;
      const unsigned key0 = piece_element<Bits>(keys, 0);
      hist_add(hist, key0 >> (KEY_BITS - kDigitBits));
      if (got == V) {
        if (resident) *reinterpret_cast<uint4*>(copy + first) = keys;
#pragma unroll
        for (int j = 1; j < V; ++j) hist_add(hist, piece_element<Bits>(keys, j) >> (KEY_BITS - kDigitBits));
        if constexpr (DETERMINISTIC) {
          lo &= keys.x & keys.y & keys.z & keys.w;
          hi |= keys.x | keys.y | keys.z | keys.w;
        }
      } else {  // got == 1
        if (resident) copy[first] = Bits(key0);
        if constexpr (DETERMINISTIC) {
          lo &= sizeof(Bits) == 2 ? key0 * 0x10001u : key0;
          hi |= sizeof(Bits) == 2 ? key0 * 0x10001u : key0;
        }
      }
    };
    if (pass == 0 && source == kGlobalRow) {
      // float32: the words (kRawCopy), or a copy per direction, whose key transform folds the
      // invert away (make bench-kernels, 4096 x 16384 K=256: 0.82 -> 0.79 warp instructions per
      // key; 16-bit keys invert two keys an instruction, and there a second copy counted 0.839
      // -> 0.873). No NaN is made one key (kNanAfter): a max.NaN a word, where a compare and a
      // select a key cost 16384 K=256 normal float32 0.766 -> 0.733 warp instructions per key,
      // bfloat16's carry test 0.782 -> 0.735 (counted); a row that held a NaN is counted again
      // below.
      unsigned seen = 0u;
      if constexpr (kNanBins) {
        global_row.template for_each<false, true>(first_pass);
      } else if constexpr (kRawCopy) {
        global_row.template for_each<false, true>(as_words_nan_after<T>(first_pass, seen));
      } else if constexpr (sizeof(Bits) == 2 || !kCopyPerDirection) {
        global_row.template for_each<false, true>(as_keys_nan_after<T, kNanAfter>(first_pass, largest, seen));
      } else if (largest) {
        global_row.template for_each<false, true>(as_keys_nan_after<T, kNanAfter, 1>(first_pass, true, seen));
      } else {
        global_row.template for_each<false, true>(as_keys_nan_after<T, kNanAfter, -1>(first_pass, false, seen));
      }
      bool row_nan = kNanAfter && !kNanBins && __syncthreads_or(word_has_nan<T>(seen));
      if constexpr (kNanBins) {
        // The words whose exponent is all ones fill the bins from an infinity's up. A positive
        // NaN's word orders as the NaN key does (the top key, the bottom one for smallest), a
        // negative one's the other way: a resident row asks its copy only where a bin from
        // -inf's up counted a word, and a row read from global memory (whose later passes make
        // every NaN one key) where one from either infinity's did.
        // Each thread reads the 4 bins of each end (16 bytes, aligned), so that the answer is
        // block-uniform with no barrier past the one the bins need.
        typedef KeyTraits<T> Tr;
        constexpr int kShift = KEY_BITS - kDigitBits;
        static_assert(((Tr::kAll >> 1) >> kShift) - (Tr::kExp >> kShift) == 3, "4 bins from an infinity's");
        __syncthreads();
        const int4 low = *reinterpret_cast<const int4*>(hist + ((Tr::kSign | Tr::kExp) >> kShift));
        const int4 high = *reinterpret_cast<const int4*>(hist + (Tr::kExp >> kShift));
        const bool maybe =
            (low.x | low.y | low.z | low.w) != 0 || (!resident && (high.x | high.y | high.z | high.w) != 0);
        if (maybe) {  // block-uniform: the row holds an infinity or a NaN
          auto scan = [&](const uint4& q, int, int) { seen = nan_max4<T>(seen, q); };
          if (resident) {
            const View shared_row(copy, n);
            shared_row.template for_each<true, true>(scan);
          } else {
            global_row.template for_each<false>(scan);
          }
          row_nan = __syncthreads_or(word_has_nan<T>(seen));
        }
      }
      if (row_nan) {  // block-uniform: a row with a NaN counts again, every NaN one key
        clear_bins<THREADS>(hist, bins);
        lo = ~0u;
        hi = 0u;
        __syncthreads();
        if (resident) {  // from its copy, still read once: a NaN's key lies past an infinity's
          constexpr unsigned kTop = KeyTraits<T>::kExp | KeyTraits<T>::kSign, kBottom = ~kTop & KeyTraits<T>::kAll;
          for (int i = thread_index(); i < n; i += THREADS) {
            unsigned key = copy[i];  // or the word (kRawCopy)
            if (kRawCopy ? word_has_nan<T>(key) : key > kTop || key < kBottom) {
              key = kRawCopy ? kNanWord : largest ? KeyTraits<T>::kAll : 0u;
              copy[i] = Bits(key);
            }
            hist_add(hist, key >> (KEY_BITS - kDigitBits));
            if constexpr (DETERMINISTIC) {
              lo &= sizeof(Bits) == 2 ? key * 0x10001u : key;
              hi |= sizeof(Bits) == 2 ? key * 0x10001u : key;
            }
          }
        } else {
          global_row.template for_each<false, true>(as_keys<T>(first_pass, largest));
        }
      }
      // The bins count words, unless the row was read again as keys (a long row with a NaN).
      word_bins = kRawCopy && (resident || !row_nan);
      copy_raw = kRawCopy && resident;
      // Fast mode asks a resident row only where one bin holds every key, of its copy: the
      // row is one key where none differs from the first. A row read from global memory
      // leaves the question to the next pass's span.
      if constexpr (DETERMINISTIC) {
        if (sizeof(Bits) == 2 && lo <= hi) {  // fold the words' halves
          lo &= (lo >> 16) & 0xffffu;
          hi = (hi | (hi >> 16)) & 0xffffu;
        }
      } else if (resident) {  // block-uniform
        __syncthreads();
        const unsigned ref = copy[0];  // or the word (copy_raw): words are equal where keys are
        const unsigned ref_key =
            copy_raw ? word_select_keys<T, false>(ref, largest ? 0u : ~0u) & KeyTraits<T>::kAll : ref;
        if (hist[ref >> (KEY_BITS - kDigitBits)] == n) {  // its word's bin, or its key's
          unsigned differ = 0u;
          // Four keys a trip (8192 K=128 all-equal float32 1.07 -> 0.99 warp instructions per
          // key, counted); a walk of 16-byte words took the sm_100 K=2048 fast kernels on 256
          // threads to 102-106 registers.
#pragma unroll 4
          for (int i = thread_index(); i < n; i += THREADS) differ |= unsigned(copy[i]) ^ ref;
          lo = differ != 0u ? 0u : ref_key;
          hi = differ != 0u ? KeyTraits<T>::kAll : ref_key;
        }
      }
    } else if (source == kGlobalRow) {
      global_row.template for_each<false>(as_keys<T>(later_pass, largest));
    } else if (SMEM_BYTES > 0 && source == kSharedRow) {
      copy_to_keys();
      const View shared_row(copy, n);
      shared_row.template for_each<true>(later_pass);
    } else if (SMEM_BYTES > 0 && pass == 0) {
      // A refill's first pass over the lists has no prefix and drops nothing: a walk that
      // counts alone (131072 K=1024 float32 0.888 -> 0.808 warp instructions per key, counted),
      // two entries a trip (0.750 -> 0.745, bfloat16 0.803 -> 0.797, counted, 1 row).
#pragma unroll 2
      for (int s = thread_index(); s < thread_index() + held * THREADS; s += THREADS) {
        const unsigned key = unpack_key(buffer[s]);
        lo = min(lo, key);
        hi = max(hi, key);
        hist_add(hist, (key >> shift) & unsigned(bins - 1));
      }
    } else if (SMEM_BYTES > 0 && count_walk) {
#pragma unroll 2
      for (int s = thread_index(); s < thread_index() + held * THREADS; s += THREADS) count_key(unpack_key(buffer[s]));
    } else if (SMEM_BYTES > 0 && !counted) {
      // Each thread also drops the keys of its list below the prefix's bucket (never one of the
      // top k; the prefix has no bits below the mask, so key >= prefix is key & mask >= prefix).
      const int list = thread_index(), end = list + held * THREADS;
      int kept = list;
      // Two entries a trip: a stream's lists are long (131072 K=1024 normal float32 0.745 ->
      // 0.727, bfloat16 0.797 -> 0.782 warp instructions per key, counted, 1 row); a resident
      // row's are mostly 1-2 entries (16384 K=256 normal float32 0.5976 -> 0.5987, tie-heavy
      // 0.782 -> 0.777, counted, 4 rows).
#pragma unroll 2
      for (int s = list; s < end; s += THREADS) {
        const u64 entry = buffer[s];
        const unsigned key = unpack_key(entry);
        buffer[kept] = entry;  // slot kept <= s is read: no branch
        kept += key >= prefix ? THREADS : 0;
        if ((key & mask) == prefix) {  // a key of the bucket is at or above the prefix
          lo = min(lo, key);
          hi = max(hi, key);
          hist_add(hist, (key >> shift) & unsigned(bins - 1));
        }
      }
      held = unsigned(kept - list) / unsigned(THREADS);
    }
    // The span of the keys the pass counted, over the block (span[0], span[1]): equal ends tell
    // a bucket of one key, known whole. Only a bin that holds every key counted can be one, so
    // the block reduces it after find_digit, and only then, unless a refill asks first (a
    // reduction every pass cost 16384 K=256 float32 normal 0.648 -> 0.632, tie-heavy 0.83 ->
    // 0.80 warp instructions per key, counted).
    auto reduce_span = [&] {
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) {
        lo = min(lo, __shfl_xor_sync(kFullMask, lo, offset));
        hi = max(hi, __shfl_xor_sync(kFullMask, hi, offset));
      }
      if (lane_id() == 0 && lo <= hi) {
        atomicMin(&span[0], lo);
        atomicMax(&span[1], hi);
      }
    };
    if (refill) reduce_span();  // block-uniform
    // A refill (the stream has more of the row to read) needs room, not the k-th key: once
    // the drop above leaves every list room for a step, the stream reads on from the floor of
    // the bucket found so far, narrowed by this pass's bins: warp 0 finds the run of bins (one
    // a lane) that holds the k-th key so far, and the bound rises to the run's floor. The first
    // pass's bucket alone let in every key above its floor, an 11-bit bucket for a float32's
    // key (131072 normal, counted: K=256 float32 0.570 -> 0.523, K=1024 float32 0.728 -> 0.714,
    // bfloat16 0.783 -> 0.721 warp instructions per key). A second find_digit there, exact but
    // for a block-wide scan, cost more, and took the resident rows' kernels (no refill) from
    // 0.599 to 0.602 at 16384 (ptxas's code around it). Only where the launch bounds cap a
    // thread below 128 registers (kNanAfter): on 256 threads the run's search took
    // test_large_k_build's bfloat16 sm_100 kernels of K=1024 and 2048 to 106-110 registers.
    // And only where the run holds at most a quarter of the bucket's keys: a run of ties (16
    // values, one a run) made the bound the k-th key itself, whose ties, appended one piece in
    // sixteen, kept the lists from filling before the row's end, where the refill that takes
    // the top k alone and reads on past that key waits for them to fill (131072 K=256
    // tie-heavy float32 0.605 -> 0.660, counted; 0.603 with the quarter).
    // Where that bucket is one key, the k-th so far, the top k replace the buffer instead and
    // the stream reads on past that key (below): a later equal key is not needed. Reading on
    // from the key's own floor kept every later tie (131072 K=1024 tie-heavy float32: 8192
    // ties walked by every pass and the gather).
    const bool crowded = kStreams ? __syncthreads_or(held > list_capacity - kStepKeys) : (__syncthreads(), true);
    bool single_key = refill && span[0] == span[1];  // every key the pass counted is one value
    if (refill && pass > 0 && !crowded && !single_key) {  // block-uniform
      if (kNanAfter && thread_index() < 32) {  // warp 0 (a lane's run: bins / 32, or one)
        const int per = max(bins / 32, 1), top = bins - lane_id() * per;
        int c = 0;
        if (per % 4 == 0) {  // 16-byte reads (bins from 128): 131072 K=1024 float32 -0.006, counted
          const int4* const run = reinterpret_cast<const int4*>(hist + top - per);
          for (int i = 0; i < per / 4; ++i) c += (run[i].x + run[i].y) + (run[i].z + run[i].w);
        } else {
          for (int i = 1; i <= per; ++i) c += top - i >= 0 ? hist[top - i] : 0;
        }
        const int through = warp_inclusive_scan(c), total = __shfl_sync(kFullMask, through, 31);
        const unsigned reached = __ballot_sync(kFullMask, state.remaining <= through);
        const int src = max(__ffs(int(reached)) - 1, 0);
        const int floor = __shfl_sync(kFullMask, max(top - per, 0), src), in_run = __shfl_sync(kFullMask, c, src);
        if (lane_id() == 0 && reached != 0u && 4 * in_run <= total) state.prefix = prefix | (unsigned(floor) << shift);
      }
      refilled = true;
      break;
    }
    // A first pass that counted words (kRawCopy) finds the keys' digit through the flip: it
    // XORs a key's first digit with 0x7ff (largest) or 0x3ff below the digit's half, with 0x400
    // or 0 above it, which gives its word's.
    const bool words = pass == 0 && word_bins;
    // The warp's search of the digit's run (find_digit) where the launch bounds cap a thread
    // below 128 registers: it took the float32 sm_100 kernels of K=1024 and 2048 on 256 threads
    // (test_large_k_build's) to 100-101.
    const unsigned low_xor = words ? (largest ? 0x7ffu : 0x3ffu) : 0u, high_xor = words && largest ? 0x400u : 0u;
    // Where no key counted lies above the k-th key's bin, float32 asks whether that bin is one
    // key (below), which the third pass would otherwise count whole: 16384 K=256 tie-heavy
    // float32 1.025 -> 0.941, normal 0.6955 -> 0.6956 warp instructions per key (counted, 2
    // rows; its five conditions in one branch cost normal 0.698). 16-bit keys have no third
    // pass; on 1024 threads (64 registers) the walk spilled 20 bytes in the K=4096
    // deterministic kernel.
    constexpr bool kTopBinCheck = PASSES > 2 && SMEM_BYTES > 0 && THREADS < 1024;
    const int wanted = state.remaining;
    const int in_bins = find_digit<THREADS, kNanAfter>(hist, bins, wanted, warp_sums, found, low_xor, high_xor);
    const int take = found[1], in_bin = found[2];
    if (!refill && in_bin == in_bins) {  // block-uniform: one bin holds every key counted
      reduce_span();
      __syncthreads();
      single_key = span[0] == span[1];
      __syncthreads();  // read by every thread before the next pass clears it
    }
    if (thread_index() == 0) {
      state.prefix = single_key ? span[0] : prefix | (unsigned(found[0]) << shift);
      state.mask = single_key ? KeyTraits<T>::kAll : mask | (unsigned(bins - 1) << shift);
      state.remaining = take;
      state.bucket = in_bin;
      state.source = pass == 0 && resident ? int(kSharedRow) : source;
    }
    if (single_key || take == in_bin) break;  // the k-th key is known, or its bucket is taken whole
    if (kTopBinCheck && take == wanted) {  // a branch of its own: normal rows pay this compare alone
      if (pass + 1 < PASSES && source == kBuffer && !refill && in_bin < in_bins) {
        // Block-uniform: no key counted lies above the bin, so the largest one counted is in
        // it, and others lie below it (where the bin holds every key counted, the span answered
        // above). The bin is that one key where a walk of the buffer finds no other in it: the
        // next pass, which would count it whole, is not needed (16 values, ties of the top one).
        reduce_span();
        __syncthreads();
        const unsigned top = span[1], bin_mask = mask | (unsigned(bins - 1) << shift);
        unsigned differ = 0u;
        for (int s = thread_index(); s < thread_index() + held * THREADS; s += THREADS) {
          const unsigned key = unpack_key(buffer[s]);
          differ |= (key & bin_mask) == (top & bin_mask) ? key ^ top : 0u;
        }
        if (!__syncthreads_or(differ != 0u)) {
          if (thread_index() == 0) {
            state.prefix = top;
            state.mask = KeyTraits<T>::kAll;
          }
          break;
        }
      }
    }
  }
  if (refilled) {  // block-uniform: the stream reads on from the bucket's floor
    if (thread_index() == 0) {
      stream_bound = keep_bound<T>(state.prefix, largest);
      stream_room = list_capacity - kStepKeys;
      state = RadixState{0u, 0u, k, n, kBuffer};
    }
    continue;
  }
  __syncthreads();
  if (state.source == kSharedRow) copy_to_keys();  // block-uniform

  // Gather: cand[0, k - ties) takes the keys above the k-th key's bucket, cand[k - ties, k)
  // the ties needed. Deterministic mode takes the lowest-indexed ties: from the buffer, by a
  // radix select over their indices (tie_floor); from the row or its copy, by reading it in
  // index order, ranking the ties with a block-wide scan per piece (the fallback, when the
  // buffer never held the candidates).
  counter_phase("gather");
  const unsigned prefix = state.prefix, mask = state.mask;
  const int ties = state.remaining, above = k - ties;
  const bool ordered = DETERMINISTIC && state.remaining < state.bucket;  // ordered: the whole key is known
  const int source = state.source;
  int ties_before = 0;  // deterministic mode's ties ranked so far, in index order
  // The keys of a piece above the k-th key's bucket and in it (bits j < got).
  auto classify = [&](const uint4& keys, int got, unsigned& above_bits, unsigned& tie_bits) {
    above_bits = tie_bits = 0u;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const unsigned key = piece_element<Bits>(keys, j) & mask;
      if (j < got && key > prefix) above_bits |= 1u << j;
      if (j < got && key == prefix) tie_bits |= 1u << j;
    }
  };
  auto gather = [&](const uint4& keys, int first, int got) {
    unsigned above_bits, tie_bits;
    classify(keys, got, above_bits, tie_bits);
    // Each lane appends its own candidates, one atomic for a piece's keys of each kind. Fast
    // mode appends both kinds in one loop where a step holds one or two pieces (two loops
    // spill at 32 registers there; with four pieces in flight the one loop does instead);
    // deterministic mode appends the keys above, and the ties too unless ordered (the scan
    // ranks those).
    if constexpr (!DETERMINISTIC && UNROLL <= 2) {
      gather_append<Bits>(counters, above_bits, tie_bits, keys, first, cand, above, ties);
    } else {
      lane_append<Bits>(&counters[0], above_bits, keys, first, cand, 0x7fffffff);
      if (!ordered) lane_append<Bits>(&counters[1], tie_bits, keys, first, cand + above, ties);
      if (ordered && ties_before < ties) {  // block-uniform
        int total;
        int rank = ties_before + block_exclusive_scan<THREADS>(__popc(tie_bits), warp_sums, total);
        for (; tie_bits != 0u && rank < ties; ++rank) {
          const int j = __ffs(int(tie_bits)) - 1;
          tie_bits &= tie_bits - 1u;
          cand[above + rank] = pack(prefix, first + j);
        }
        ties_before += total;
      }
    }
  };
  if (SMEM_BYTES > 0 && source == kBuffer) {
    counter_phase("gather, from the candidates");
    // A tie is taken when its low word (~index) is at or above the floor on the floor's bits:
    // every tie in fast mode or when all are taken, the `ties` of lowest index otherwise.
    unsigned floor = 0u, floor_mask = 0u;
    if (ordered)
      floor = tie_floor<THREADS>(buffer, held, prefix, ties, n, hist, warp_sums, found, floor_mask);
    // Each thread first moves the entries it takes to the front of its list and counts both
    // kinds, then one scan a warp gives each lane its slots (the counts packed as above +
    // (ties << 16): each count is at most the buffer's entries, below 232448 / 8 < 32768), and
    // the lane writes what it took. A bucket collected whole and narrowed by later passes
    // costs a read of each entry and a write of those taken, not a warp-wide append a round
    // (16384 K=256 uniform float32: 2048 entries collected, 256 taken).
    const int t = thread_index();
    int kept = t, counts = 0;
#pragma unroll 1  // as the passes' loop over the lists (16384 K=256 normal float32 1.055 -> 1.045)
    for (int s = t; s < t + held * THREADS; s += THREADS) {
      const u64 entry = buffer[s];
      const unsigned key = unpack_key(entry) & mask;
      const bool is_above = key > prefix;
      const bool tie = key == prefix && (unsigned(entry) & floor_mask) >= floor;
      buffer[kept] = entry;  // slot kept <= s is read: no branch
      kept += is_above || tie ? THREADS : 0;
      counts += is_above ? 1 : tie ? 0x10000 : 0;
    }
    const int inclusive = warp_inclusive_scan(counts);
    int base = 0;
    if (lane_id() == 31 && inclusive != 0) {  // braced: the counter charges lane 31's atomics alone
      base = atomicAdd(&counters[0], inclusive & 0xffff) | (atomicAdd(&counters[1], inclusive >> 16) << 16);
    }
    base = __shfl_sync(kFullMask, base, 31) + inclusive - counts;
    int out = base & 0xffff, slot = base >> 16;
    // A thread stops once it has written its keys above and the ties' slots are gone (fast
    // mode takes every tie; 16384 K=256 tie-heavy float32 writes 256 of 1024).
    const int out_end = out + (counts & 0xffff);
#pragma unroll 1
    for (int s = t; s < kept && (out < out_end || slot < ties); s += THREADS) {
      const u64 entry = buffer[s];
      if ((unpack_key(entry) & mask) > prefix) {
        cand[out++] = entry;
      } else if (slot < ties) {
        cand[above + slot++] = entry;
      }
    }
  } else if (SMEM_BYTES > 0 && source == kSharedRow && !ordered) {
    // From the copy, each step's keys of both kinds are marked and appended at its end. Where
    // no key lies above the bucket (a row of one key), a thread stops after the step that
    // leaves every tie's slot taken: any `ties` keys of the bucket are the answer (16384 K=256
    // all-equal float32 1.116 -> 0.883, bfloat16 1.180 -> 0.971 warp instructions per key,
    // counted). Only where the collect walks whole steps (kWholeCollect): it took the sm_100
    // bfloat16 kernel of K=2048 on 256 threads (test_large_k_build's) from 96 to 104 registers.
    StepMarks<THREADS, V, UNROLL> marks;
    auto mark = [&](const uint4& keys, int first, int got) {
      unsigned above_bits, tie_bits;
      classify(keys, got, above_bits, tie_bits);
      marks.mark(above_bits, tie_bits, first);
    };
    auto append_marked = [&] {
      marks.template append<Bits>(0, &counters[0], copy, cand, 0x7fffffff);
      marks.template append<Bits>(1, &counters[1], copy, cand + above, ties);
      marks.next_step();
      return kWholeCollect && above == 0 && *reinterpret_cast<volatile int*>(&counters[1]) >= ties;
    };
    const View shared_row(copy, n);
    shared_row.template for_each<true>(mark, 0, 0x7fffffff, append_marked);
  } else if (SMEM_BYTES > 0 && source == kSharedRow) {
    const View shared_row(copy, n);
    shared_row.template for_each<true>(gather);
  } else {
    global_row.template for_each<false>(as_keys<T>(gather, largest));
  }
  __syncthreads();
  if (!stream || step == row_steps) break;  // block-uniform
  // The buffer is full: its top k become the buffer, and the floor rises to their smallest
  // key. When that key is exact and the top one (NaN), no later key can be in the top k.
  for (int i = thread_index(); i < k; i += THREADS) buffer[i] = cand[i];
  held = (k - thread_index() + THREADS - 1) / THREADS;  // buffer[i] is list i % THREADS's
  if (thread_index() == 0) {
    const bool exact = state.mask == KeyTraits<T>::kAll;
    stream_bound = keep_bound<T>(exact ? state.prefix + 1u : state.prefix, largest);
    stream_steps_done = exact && state.prefix == KeyTraits<T>::kAll;
    stream_room = list_capacity - kStepKeys;
    state = RadixState{0u, 0u, k, n, kBuffer};
    counters[0] = counters[1] = 0;
  }
  __syncthreads();
  if (stream_steps_done) step = row_steps;  // block-uniform
  }  // the stream's rounds

  // Sort and write. Values are rebuilt from the keys; only NaNs (one key for every payload)
  // are read again, from the row in global memory (the copy holds keys).
  counter_phase("sort and output");
  const int t = thread_index();
  const int out_block = MERGE ? block : int(blockIdx.x);
  const unsigned long long out_base = (unsigned long long)out_block * (unsigned long long)k_out;
  // Once: it may read memory.
  const Part where = part_of_window(n_arg, chunk, row_stride, rows, k_out, window, out_block);
  auto emit = [&](int i, u64 entry) {
    const int index = unpack_index(entry);  // in the chunk
    bool is_nan;
    Bits bits = key_bits<T>(unpack_key(entry), largest, is_nan);
    // the copy holds keys, not the payload; a merge's rows (MERGE) other CTAs wrote: load_global
    if (is_nan) bits = MERGE ? load_global(row_bits + index) : load_global_nc(row_bits + index);
    store_global(reinterpret_cast<Bits*>(values) + out_base + i, bits);
    store_index(indices, out_base + i, x_indices == nullptr ? (long long)(where.first + index)
                                       : MERGE ? load_global(x_indices + where.offset + index)
                                               : load_global_nc(x_indices + where.offset + index), flags);
  };
  // sorted=False skips the sort (see kUnsorted); the set is the sorted call's.
  const bool sort = DETERMINISTIC || (flags & kUnsorted) == 0;
{% if large %}
  // Each slot is read by the thread that then overwrites it with the index (or, with
  // scratch, writes the index elsewhere).
  if (sort) block_sort_global<THREADS>(cand, k);
  for (long long i = t; i < k; i += THREADS) emit(int(i), cand[i]);
  if (k < k_out) {  // the slots past a short window's candidates, once every candidate is read
    __syncthreads();
    pad_slots<T>(values, indices, out_base, k, k_out, largest, t, THREADS, flags);
  }
{% else %}
  if constexpr (KR <= 64) {
    constexpr int E = KR > 32 ? 2 : 1;
    if (t < 32) {
      u64 v[E];
#pragma unroll
      for (int e = 0; e < E; ++e) v[e] = e * 32 + t < k ? cand[e * 32 + t] : 0ull;
      if (sort) warp_sort<E>(v);
#pragma unroll
      for (int e = 0; e < E; ++e)
        if (e * 32 + t < k) emit(e * 32 + t, v[e]);
    }
  } else {
    // Where the launch bounds leave a thread 64 registers or more, each holding thread takes
    // 8 candidates (more where KR / THREADS is more), so K <= 256 sorts on one warp with no
    // block barrier but the last, and K = 1024 on 4 warps: strides below 8 swap in registers,
    // where one candidate a thread (K = 256 on 256 threads) made every stage a shuffle on 8
    // warps and each merge across warps a barrier a stage. Counted on the emulator (16384
    // K=256 float32): 1.25 -> 1.14 warp instructions per key, the sort's barriers 10 -> 1.
    // Under 64 (1024 threads at 2 CTAs per SM: 32) the 8 candidates spill: KR / THREADS.
    constexpr int kRegisters = 65536 / (THREADS * MIN_CTAS);  // sm_90's register file over the bound
    constexpr int kSpread = KR / THREADS > 1 ? KR / THREADS : 1;
    constexpr int SORT_E = kRegisters < 64 || kSpread > 8 ? kSpread : (KR / 32 < 8 ? KR / 32 : 8);
    if (sort) register_sort<KR, THREADS, SORT_E>(cand, k);
#pragma unroll
    for (int j = 0; j < (KR + THREADS - 1) / THREADS; ++j) {  // a fixed trip count: no loop in SASS
      const int i = j * THREADS + t;
      if (i < k) emit(i, cand[i]);
    }
  }
  if (k < k_out) pad_slots<T>(values, indices, out_base, k, k_out, largest, t, THREADS, flags);
{% endif %}
}

// Register top-k for one row held by one warp: each lane keeps PER packed keys (lane + 32j)
// in registers; each of k rounds takes the warp maximum with a butterfly of shuffles. Ties go
// to the lower index, so the result is deterministic by construction. Values are rebuilt
// from the keys (NaNs read again). The rounds find the results in sorted order, so there is
// no sort for kUnsorted to skip; `indices` is the output's start, the row's k from `out`.
template <typename T, int PER>
__device__ __forceinline__ void warp_topk_row(const T* __restrict__ row, T* __restrict__ values,
                                              long long* __restrict__ indices, unsigned long long out, int n, int k,
                                              bool largest, int flags, long long first = 0) {
  typedef typename KeyTraits<T>::Bits Bits;
  const Bits* bits = reinterpret_cast<const Bits*>(row);
  const int lane = lane_id();
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
    bool is_nan;
    Bits b = key_bits<T>(unpack_key(mine), largest, is_nan);
    if (is_nan) b = load_global_nc(bits + index);
    store_global(reinterpret_cast<Bits*>(values) + lane, b);
    store_index(indices, out + lane, first + index, flags);  // first: a ragged row's window start
  }
}

}  // namespace topk

#endif  // TOPKGEN_TOPK_COMMON_CUH
