// Drives the kernels' row access (topk::RowView) at the end of rows up to 2^31 - 1 elements
// (tests/test_index_arithmetic.py). Prepended: render.device_library().
//
// Each thread records the (index, key) pairs it loads in step 0 and in the last `last_steps`
// steps of the row at `row_address`; slot (t * (1 + last_steps) + i) * 8 + j, unused slots -1.
template <typename Bits, int THREADS, int TAIL_STEPS>
__device__ void visit_row_end(unsigned long long row_address, int n, int last_steps, long long* index_out,
                              unsigned* key_out) {
  typedef topk::RowView<Bits, THREADS, 0, TAIL_STEPS> View;
  const View view(reinterpret_cast<const Bits*>(row_address), n);
  const int steps = view.steps();
  const int t = threadIdx.x;
  for (int i = 0; i <= last_steps; ++i) {
    const int s = i == 0 ? 0 : steps - last_steps - 1 + i;
    if (s <= 0 && i > 0) continue;
    Bits keys[View::V];
    int first = -1;
    const int count = view.load(s, keys, first);
    for (int j = 0; j < count; ++j) {
      const long long slot = ((long long)t * (1 + last_steps) + i) * 8 + j;
      topk::store_global(index_out + slot, (long long)first + j);
      topk::store_global(key_out + slot, unsigned(keys[j]));
    }
  }
}

// Fixed tails of 4 steps (sm_90's policy) and runtime tails (sm_100), 256 and 1024 threads.
extern "C" __global__ void rows_f32_t256_fixed4(unsigned long long row, int n, int last_steps, long long* index_out,
                                                 unsigned* key_out) {
  visit_row_end<unsigned, 256, 4>(row, n, last_steps, index_out, key_out);
}
extern "C" __global__ void rows_f32_t256_runtime(unsigned long long row, int n, int last_steps, long long* index_out,
                                                  unsigned* key_out) {
  visit_row_end<unsigned, 256, 0>(row, n, last_steps, index_out, key_out);
}
extern "C" __global__ void rows_f32_t1024_fixed4(unsigned long long row, int n, int last_steps, long long* index_out,
                                                  unsigned* key_out) {
  visit_row_end<unsigned, 1024, 4>(row, n, last_steps, index_out, key_out);
}
extern "C" __global__ void rows_b16_t256_fixed4(unsigned long long row, int n, int last_steps, long long* index_out,
                                                 unsigned* key_out) {
  visit_row_end<unsigned short, 256, 4>(row, n, last_steps, index_out, key_out);
}
extern "C" __global__ void rows_b16_t1024_runtime(unsigned long long row, int n, int last_steps, long long* index_out,
                                                   unsigned* key_out) {
  visit_row_end<unsigned short, 1024, 0>(row, n, last_steps, index_out, key_out);
}
