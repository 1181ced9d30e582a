// Blocks of one launch handing data to one another (tests/emulator/test_ordering_check.py). The
// test prepends templates/topk_memory.cuh, the helpers the top-k kernels use.
//
// Each block sums its part of x and writes the sum to partial[block]; the block that takes the
// last ticket from a global atomic adds the partials into *total, records its index in *last_block
// and returns the ticket counter to 0. `variant` breaks one step of the hand-over:
//   0: none (stores, fence, ticket; the last block: fence, reads through load_global);
//   1: no fence between a block's store and its ticket (nothing released);
//   2: the fence after the ticket instead of before it (released too late);
//   3: the last block reads without its fence after the ticket (nothing acquired);
//   4: the last block reads through load_global_nc, the path for data no thread writes.
extern "C" __global__ void last_block_sum(const int* x, int* partial, unsigned* ticket, int* total,
                                          int* last_block, int variant) {
  __shared__ int sum;
  __shared__ bool last;
  if (threadIdx.x == 0) sum = 0;
  __syncthreads();
  atomicAdd(&sum, topk::load_global_nc(x + blockIdx.x * blockDim.x + threadIdx.x));
  __syncthreads();
  if (threadIdx.x == 0) {
    topk::store_global(partial + blockIdx.x, sum);
    if (variant != 1 && variant != 2) __threadfence();
    last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    if (variant == 2 || (last && variant != 3)) __threadfence();
  }
  __syncthreads();
  if (last && threadIdx.x == 0) {
    int s = 0;
    for (unsigned b = 0; b < gridDim.x; ++b)
      s += variant == 4 ? topk::load_global_nc(partial + b) : topk::load_global(partial + b);
    topk::store_global(total, s);
    topk::store_global(last_block, int(blockIdx.x));
    atomicExch(ticket, 0u);
  }
}
