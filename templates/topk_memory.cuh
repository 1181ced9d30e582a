// Global-memory access of the topkgen kernels. Every load and store of global memory goes
// through these helpers, so that the CPU emulator counts the traffic exactly
// (Module.launch(..., counters=True)); on the GPU they are the plain access and compile to
// the same PTX as before them. counter_phase labels the counts that follow in the calling
// thread (a no-op on the GPU).
#ifndef TOPKGEN_TOPK_MEMORY_CUH
#define TOPKGEN_TOPK_MEMORY_CUH

namespace topk {

// A load of data no thread of the launch writes (the input rows). Through the kernels'
// `const __restrict__` parameters NVRTC emits ld.global.nc for it; an explicit __ldg gave
// the same loads but moved register allocation, so the plain access stays.
template <typename T>
__device__ __forceinline__ T load_global_nc(const T* p) {
#ifdef TOPKGEN_EMULATOR
  ::tk::count_global_load(sizeof(T));
#endif
  return *p;
}

// A coherent load: for global data the launch itself writes (scratch buffers).
template <typename T>
__device__ __forceinline__ T load_global(const T* p) {
#ifdef TOPKGEN_EMULATOR
  ::tk::count_global_load(sizeof(T));
#endif
  return *p;
}

template <typename T>
__device__ __forceinline__ void store_global(T* p, const T& value) {
#ifdef TOPKGEN_EMULATOR
  ::tk::count_global_store(sizeof(T));
#endif
  *p = value;
}

__device__ __forceinline__ void counter_phase(const char* label) {
#ifdef TOPKGEN_EMULATOR
  ::tk::counter_phase(label);
#else
  (void)label;
#endif
}

}  // namespace topk

#endif  // TOPKGEN_TOPK_MEMORY_CUH
