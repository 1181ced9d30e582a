// Drives the kernels' row access (topk::RowView) at the end of rows up to 2^31 - 1 elements
// (tests/templates/test_index_arithmetic.py). Prepended: render.device_library().
//
// Each thread records the (index, key) pairs it is given in step 0 and in the last
// `last_steps` steps of the row at `row_address`, piece after piece: slot
// (t * (1 + last_steps * UNROLL) + piece) * 8 + j, unused slots -1.
template <typename Bits, int THREADS, int TAIL_STEPS, int UNROLL>
__device__ void visit_row_end(unsigned long long row_address, int n, int last_steps, long long* index_out,
                              unsigned* key_out) {
  typedef topk::RowView<Bits, THREADS, 0, TAIL_STEPS, UNROLL> View;
  const View view(reinterpret_cast<const Bits*>(row_address), n);
  const int steps = view.steps();
  const long long base = (long long)threadIdx.x * (1 + last_steps * UNROLL);
  int piece = 0;
  auto record = [&](const uint4& q, int first, int count) {
    for (int j = 0; j < count; ++j) {
      const long long slot = (base + piece) * 8 + j;
      topk::store_global(index_out + slot, (long long)first + j);
      topk::store_global(key_out + slot, unsigned(topk::piece_element<Bits>(q, j)));
    }
    ++piece;
  };
  view.template for_each<false>(record, 0, 1);
  view.template for_each<false>(record, steps - last_steps > 1 ? steps - last_steps : 1, steps);
}

// Fixed tails of 4 steps (sm_90's policy) and runtime tails (sm_100), 256 and 1024 threads,
// one or four vectors per thread a step.
extern "C" __global__ void rows_f32_t256_fixed4(unsigned long long row, int n, int last_steps, long long* index_out,
                                                 unsigned* key_out) {
  visit_row_end<unsigned, 256, 4, 1>(row, n, last_steps, index_out, key_out);
}
extern "C" __global__ void rows_f32_t256_runtime(unsigned long long row, int n, int last_steps, long long* index_out,
                                                  unsigned* key_out) {
  visit_row_end<unsigned, 256, 0, 4>(row, n, last_steps, index_out, key_out);
}
extern "C" __global__ void rows_f32_t1024_fixed4(unsigned long long row, int n, int last_steps, long long* index_out,
                                                  unsigned* key_out) {
  visit_row_end<unsigned, 1024, 4, 1>(row, n, last_steps, index_out, key_out);
}
extern "C" __global__ void rows_b16_t256_fixed4(unsigned long long row, int n, int last_steps, long long* index_out,
                                                 unsigned* key_out) {
  visit_row_end<unsigned short, 256, 4, 4>(row, n, last_steps, index_out, key_out);
}
extern "C" __global__ void rows_b16_t1024_runtime(unsigned long long row, int n, int last_steps, long long* index_out,
                                                   unsigned* key_out) {
  visit_row_end<unsigned short, 1024, 0, 1>(row, n, last_steps, index_out, key_out);
}
