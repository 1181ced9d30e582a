// Global-memory access of the topkgen kernels. Every load and store of global memory goes
// through these helpers, so that the CPU emulator counts the traffic exactly
// (Module.launch(..., counters=True)); on the GPU they are the plain access and compile to
// the same PTX as before them. counter_phase labels the counts that follow in the calling
// thread (a no-op on the GPU).
#ifndef TOPKGEN_TOPK_MEMORY_CUH
#define TOPKGEN_TOPK_MEMORY_CUH

namespace topk {

// A load of data no thread of the launch writes (the input rows). It is a plain access:
// NVRTC (compute_90) emits plain ld.global / ld.global.v4 for the row loads (their pointer
// is formed through the row view), and ld.global.nc only where it can prove the data
// read-only (the x_indices loads); tests/templates/test_global_access_census.py records it.
// __ldg (ld.global.nc) is not used: it moved register allocation, and the emulator's __ldg
// is an uncounted plain load.
template <typename T>
__device__ __forceinline__ T load_global_nc(const T* p) {
#ifdef TOPKGEN_EMULATOR
  ::tk::global_load(p, sizeof(T), ::tk::kLoadReadOnly);
#endif
  return *p;
}

// A load of global data threads of this launch write: the CTA's own stores, or another CTA's
// after their release and this CTA's acquire (a global atomic, then __threadfence(), which on
// sm_70 and later drops the SM's L1 lines: CCTL.IVALL, tests/emulator/test_ordering_check.py).
// A plain ld.global. The emulator's ordering check (Module.launch(check_ordering=True)) fails a
// read of another CTA's stores through load_global_nc, or without the release and acquire.
template <typename T>
__device__ __forceinline__ T load_global(const T* p) {
#ifdef TOPKGEN_EMULATOR
  ::tk::global_load(p, sizeof(T), ::tk::kLoadWritten);
#endif
  return *p;
}

template <typename T>
__device__ __forceinline__ void store_global(T* p, const T& value) {
#ifdef TOPKGEN_EMULATOR
  ::tk::global_store(p, sizeof(T));
#endif
  *p = value;
}

// The global atomics of a split in one launch (its tickets): the emulator orders them itself
// (its atomics are the hand-over's release and acquire points, check_ordering).
__device__ __forceinline__ unsigned atomic_add_global(unsigned* p, unsigned value) { return atomicAdd(p, value); }

__device__ __forceinline__ unsigned atomic_exch_global(unsigned* p, unsigned value) { return atomicExch(p, value); }

__device__ __forceinline__ void counter_phase(const char* label) {
#ifdef TOPKGEN_EMULATOR
  ::tk::counter_phase(label);
#else
  (void)label;
#endif
}

}  // namespace topk

#endif  // TOPKGEN_TOPK_MEMORY_CUH
