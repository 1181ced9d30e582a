// Small kernels whose traffic counts are known by hand (tests/emulator/test_counters.py). The test
// prepends templates/topk_memory.cuh, the helpers the top-k kernels use.

// Each thread copies one 16-byte vector and one 2-byte and one 8-byte scalar.
extern "C" __global__ void copy(const uint4* in, uint4* out, const unsigned short* in16,
                                unsigned short* out16, const long long* in64, long long* out64) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  topk::store_global(out + i, topk::load_global_nc(in + i));
  topk::store_global(out16 + i, topk::load_global(in16 + i));
  topk::store_global(out64 + i, topk::load_global_nc(in64 + i));
}

// One shared atomic per lane at word (lane * stride) % 1024, in phase "stride".
// Then `rounds` atomics per lane in a loop (one instruction per round), in phase "loop";
// then only even lanes, in phase "even lanes"; then one global atomic per thread.
extern "C" __global__ void banks(int stride, int rounds, int* global_counter, int* out) {
  __shared__ int s[1024], u[1024];
  const int lane = threadIdx.x & 31;
  for (int i = threadIdx.x; i < 1024; i += blockDim.x) s[i] = u[i] = 0;
  __syncthreads();
  topk::counter_phase("stride");
  atomicAdd(&s[(lane * stride) & 1023], 1);
  topk::counter_phase("loop");
  for (int r = 0; r < rounds; ++r) atomicAdd(&s[lane + 32 * r], 1);
  topk::counter_phase("even lanes");
  if ((lane & 1) == 0) atomicAdd(&s[lane], 1);
  topk::counter_phase("global");
  atomicAdd(global_counter, 1);
  // Issue 27: the same addresses with a result used, and with another operand than 1:
  // ATOMS.ADD, whose same-address lanes serialise (a no-return +1 is ATOMS.POPC.INC).
  topk::counter_phase("returned");
  int seen = atomicAdd(&u[(lane * stride) & 1023], 1);
  topk::counter_phase("operand 2");
  atomicAdd(&u[(lane * stride) & 1023], 2);
  topk::counter_phase("min");
  atomicMin(&u[(lane * stride) & 1023], lane);
  __syncthreads();
  if (threadIdx.x == 0) topk::store_global(out + blockIdx.x, s[0] + 0 * seen);
}

// A histogram of `bins[i]`, one element per thread, warp-aggregated: the lanes that share a
// bin elect a leader (__match_any_sync), which adds their count in one atomic.
extern "C" __global__ void aggregated_histogram(const int* bins, int* hist_out) {
  __shared__ int hist[256];
  const int lane = threadIdx.x & 31;
  for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
  __syncthreads();
  const int bin = topk::load_global_nc(bins + blockIdx.x * blockDim.x + threadIdx.x);
  const unsigned peers = __match_any_sync(0xffffffffu, bin);
  if (lane == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
  __syncthreads();
  for (int i = threadIdx.x; i < 256; i += blockDim.x) atomicAdd(hist_out + i, hist[i]);
}

// A warp reduction (5 shuffles per warp), one ballot, two __match_all_sync and three barriers.
extern "C" __global__ void collectives(const int* in, int* out) {
  int v = topk::load_global_nc(in + blockIdx.x * blockDim.x + threadIdx.x);
  __syncthreads();
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const unsigned odd = __ballot_sync(0xffffffffu, v & 1);
  int same = 0, lanes_same = 1;
  const unsigned all = __match_all_sync(0xffffffffu, v, &same);                    // every lane holds the sum
  const unsigned none = __match_all_sync(0xffffffffu, threadIdx.x & 31, &lanes_same);  // all differ
  __syncthreads();
  __syncthreads();
  if ((threadIdx.x & 31) == 0) {
    const int w = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    topk::store_global(out + 3 * w, v);
    topk::store_global(out + 3 * w + 1, int(odd));
    topk::store_global(out + 3 * w + 2, same * __popc(all) + 100 * (lanes_same + int(none)));
  }
}
