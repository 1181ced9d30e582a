// Kernels with planted bugs that the emulator must catch.

// Reads a neighbour's shared value without a barrier: the result depends on the schedule.
extern "C" __global__ void missing_barrier(float* out) {
  __shared__ float s[256];
  unsigned t = threadIdx.x;
  s[t] = float(t) + 1.f;
  // __syncthreads() missing here
  out[t] = s[(t + 1) % blockDim.x];
}

extern "C" __global__ void with_barrier(float* out) {
  __shared__ float s[256];
  unsigned t = threadIdx.x;
  s[t] = float(t) + 1.f;
  __syncthreads();
  out[t] = s[(t + 1) % blockDim.x];
}

extern "C" __global__ void divergent_barrier(int* out) {
  if (threadIdx.x < 32) {
    __syncthreads();
    out[threadIdx.x] = 1;
  } else {
    __syncthreads();
    out[threadIdx.x] = 2;
  }
}

extern "C" __global__ void early_return_barrier(int* out) {
  if (threadIdx.x >= 48) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

// Full mask, but only half the warp executes the shuffle.
extern "C" __global__ void shuffle_wrong_mask(int* out) {
  int v = int(threadIdx.x);
  if ((threadIdx.x & 31) < 16) v = __shfl_sync(0xffffffffu, v, 0);
  out[threadIdx.x] = v;
}

// The mask leaves out the calling lanes 16..31.
extern "C" __global__ void shuffle_mask_excludes_caller(int* out) {
  out[threadIdx.x] = __shfl_sync(0x0000ffffu, int(threadIdx.x), 0);
}

extern "C" __global__ void oob_global_write(float* out, int n) {
  out[threadIdx.x] = 1.f;  // launched with more threads than n
}

extern "C" __global__ void oob_global_far_write(float* out, int n) {
  if (threadIdx.x == 7) out[n + 5000] = 1.f;
}

extern "C" __global__ void oob_global_read(const float* x, float* out, int n) {
  out[threadIdx.x] = x[threadIdx.x + 4096];  // reads a page past the input
}

extern "C" __global__ void oob_dynamic_shared(float* out, int n) {
  extern __shared__ float dyn[];
  dyn[threadIdx.x] = 1.f;       // n floats of dynamic shared memory, more threads than n
  out[threadIdx.x % n] = 0.f;
}

extern "C" __global__ void oob_dynamic_shared_far(float* out, int n) {
  extern __shared__ float dyn[];
  out[0] = dyn[n + 2048];
}

// Warp 0 waits in a shuffle for warp-mates stuck at a block barrier.
extern "C" __global__ void deadlock(int* out) {
  int v = int(threadIdx.x);
  if ((threadIdx.x & 31) < 16) {
    v = __shfl_sync(0xffffffffu, v, 0);
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = v;
}

// Spins on a flag that another CTA would set: not allowed, caught by the watchdog.
extern "C" __global__ void spin_on_other_cta(int* flag) {
  if (blockIdx.x == 0) {
    while (atomicAdd(flag, 0) == 0) {
    }
  } else {
    atomicExch(flag, 0);
  }
}

// A 16-byte vector load one float off the 16-byte boundary: faults on a GPU.
extern "C" __global__ void misaligned_vector_load(const float* x, float* out) {
  const float4 v = reinterpret_cast<const float4*>(x + 1)[threadIdx.x];
  out[threadIdx.x] = v.x + v.y + v.z + v.w;
}
