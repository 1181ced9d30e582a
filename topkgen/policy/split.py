"""Split rows: the layout of a request whose rows are cut into chunks.

`topkgen.policy.select` decides whether a request splits and into how many chunks per row
(the manifest's dispatch rows carry that number, so loaders look it up); everything else
follows from it by the arithmetic here, which manifest schema 3 states for every loader
(loaders/cpp repeats it, and tests hold the two together):

- chunk c of a row covers elements [c * chunk, (c + 1) * chunk) with chunk = floor(n / chunks);
  the last chunk also takes the n - chunks * chunk elements after it;
- stage 1 launches the kernel on rows * chunks CTAs (x_indices null, chunk, row_stride n) and
  writes each chunk's k candidates, ordered as any output is, to the workspace at
  (row * chunks + c) * k: candidate indices (int64, global positions in the row) from byte 0,
  candidate values from `values_offset`;
- stage 2 launches the same kernel on rows CTAs over those rows of chunks * k candidates
  (x = the candidate values, x_indices = the candidate indices, chunk = row_stride =
  chunks * k) and writes the output;
- or, schema 7, the two in one launch: stage 1's, given `tickets` (rows zeroed 32-bit words,
  which the kernel leaves zero) and the output (merged_values, merged_indices, merged_flags):
  the last CTA of each row to store its candidates runs stage 2's selection on them, with
  the dynamic shared memory of the larger stage. It saves the second launch's latency.
  topkgen.runtime keeps the tickets in the workspace (`one_launch`: tickets_offset, past the
  candidates) and zeroes them on the stream before each launch.

In deterministic mode stage 1 orders a chunk's candidates by (key desc, index asc) and
chunks lie in chunk order, so a lower position among stage 2's candidates is a lower index
in the row: stage 2's ties by lower position are the unsplit kernel's ties by lower index.
"""

from __future__ import annotations

from dataclasses import dataclass

ROWS_MAX = 2**31 - 1          # rows per request: the runtime refuses more
WORKSPACE_ALIGN = 256         # the candidate values start at a multiple of this many bytes
WORKSPACE_ALIGNMENT = 16      # and the workspace itself at a multiple of this (16-byte loads)
INDEX_BYTES = 8               # candidate indices are int64, as the output's are
TICKET_BYTES = 4              # a split in one launch: a 32-bit ticket per row
UNSORTED_FLAG = 1             # topkgen.manifest.params.OUTPUT_FLAGS["unsorted"] (the policy stage comes first)
SHARED_ALIGN = 16             # a resident row's copy (with its alignment room) ends at a multiple of this
# How a launch's dynamic shared memory follows from the elements e (of s bytes) its CTA reads, in
# the manifest's words (kernels[i].launch.shared_bytes, schema 6): SharedMemory.bytes_for.
SHARED_BYTES_RULE = ("0 if dynamic_shared_bytes == 0 else min(dynamic_shared_bytes, "
                     "align_up((e + 16 / s - 1) * s, 16) + shared_buffer_bytes)")


@dataclass(frozen=True)
class SharedMemory:
    """The dynamic shared memory rule of a kernel's launches (manifest schema 6: kernels[i].launch's
    dynamic_shared_bytes and shared_buffer_bytes, the kernel's dtype size): a launch whose CTA reads
    at most `elements` elements gets `bytes_for(elements)`, and passes the same number to the
    kernel (its `shared_bytes` parameter), which sizes its resident row and candidate buffer by it."""

    maximum: int       # launch.dynamic_shared_bytes: what the kernel was compiled for (0: none)
    buffer_bytes: int  # launch.shared_buffer_bytes: the candidate buffer a resident row gets past its copy
    itemsize: int      # bytes per element of x

    def bytes_for(self, elements: int) -> int:
        """0 when the kernel has none, else min(maximum, align_up((elements + V - 1) x size, 16)
        + buffer_bytes) with V = 16 / size: the row's copy with its alignment room, then the buffer
        (the maximum when the row does not fit: all of it holds candidates)."""
        if self.maximum == 0:
            return 0
        vec = SHARED_ALIGN // self.itemsize
        copy = -(-(elements + vec - 1) * self.itemsize // SHARED_ALIGN) * SHARED_ALIGN
        return min(self.maximum, copy + self.buffer_bytes)


NO_SHARED = SharedMemory(0, 0, 1)  # a register kernel's launches: no dynamic shared memory


def scratch_bytes(rows: int, k: int) -> int:
    """The large-k path's scratch for int32 indices: a packed candidate (8 bytes) per output."""
    return rows * k * INDEX_BYTES


@dataclass(frozen=True)
class ChunkPlan:
    """The launches and workspace of one split request."""

    rows: int
    n: int
    k: int
    chunks: int    # per row: stage 1 runs rows * chunks CTAs
    itemsize: int  # bytes per element of x
    one_launch: bool = False  # its kernel merges in stage 1's launch (takes tickets): the workspace holds them too

    @property
    def chunk(self) -> int:
        """Elements of every chunk but the last (the kernel's `chunk` parameter in stage 1)."""
        return self.n // self.chunks

    @property
    def last_chunk(self) -> int:
        return self.n - (self.chunks - 1) * self.chunk

    @property
    def candidates(self) -> int:
        """Candidates per row: stage 2's n, chunk and row stride."""
        return self.chunks * self.k

    @property
    def values_offset(self) -> int:
        """Where the candidate values start in the workspace (the indices start at 0)."""
        index_bytes = self.rows * self.candidates * INDEX_BYTES
        return -(-index_bytes // WORKSPACE_ALIGN) * WORKSPACE_ALIGN

    @property
    def tickets_offset(self) -> int:
        """Where a split in one launch keeps its tickets (rows 32-bit words, zeroed before
        the launch): past the candidate values, at a multiple of 16 bytes."""
        end = self.values_offset + self.rows * self.candidates * self.itemsize
        return -(-end // WORKSPACE_ALIGNMENT) * WORKSPACE_ALIGNMENT

    @property
    def workspace_bytes(self) -> int:
        """The candidates' bytes (the manifest's W), and a split in one launch's tickets."""
        if self.one_launch:
            return self.tickets_offset + TICKET_BYTES * self.rows
        return self.values_offset + self.rows * self.candidates * self.itemsize

    def record(self) -> dict[str, int]:
        """The plan as plain data (explain's JSON)."""
        return {"chunks": self.chunks, "chunk": self.chunk, "last_chunk": self.last_chunk,
                "stage1_ctas": self.rows * self.chunks, "merge_candidates": self.candidates,
                "workspace_bytes": self.workspace_bytes, "values_offset": self.values_offset}


@dataclass(frozen=True)
class Stage:
    """One launch of a request: CTAs for `grid_rows` rows (the grid is
    ceil_div(grid_rows, rows_per_block)); `buffers` maps each pointer parameter to the buffer
    it gets ("x", "values", "indices", "candidate_values", "candidate_indices", or None for
    null), `scalars` holds the others. Every backend and loader launches these, with
    `shared_bytes` of dynamic shared memory (SharedMemory.bytes_for the elements one of its CTAs
    reads; also the kernel's `shared_bytes` scalar)."""

    grid_rows: int
    buffers: dict[str, str | None]
    scalars: dict[str, int]
    shared_bytes: int = 0


def stages(rows: int, n: int, k: int, largest: bool, plan: ChunkPlan | None, *, flags: int = 0,
           scratch: bool = False, window_bytes: int = 0, starts: bool = False,
           shared: SharedMemory = NO_SHARED) -> list[Stage]:
    """The launches of a request: one, or a split's two (stage 1 over chunks into the
    workspace's candidates, stage 2 over the candidates into the output), or the split's
    one (plan.one_launch: stage 1 merging into the output, through the buffer "tickets":
    rows zeroed 32-bit words at the workspace's tickets_offset). `flags` is the
    output's (topkgen.manifest.params.OUTPUT_FLAGS: 1 unsorted, 2 int32 indices); stage 1
    writes int64 candidate indices in no order stage 2 needs, so it gets the unsorted bit
    whatever the request asks: stage 2 selects again and sorts (a deterministic kernel sorts
    anyway, which stage 2's ties by position need). Sorting every chunk's k candidates cost
    more than the selection at K=1024 (bench-kernels' split table). `scratch`: the large-k path's
    candidates go to the buffer "scratch" (int32 indices), else null. `window_bytes`: a
    ragged batch's lengths element size (4 or 8; 0: dense rows, its pointers null), with
    `starts` when it has window starts: both stages read them on the device, and stage 2
    gets stage 1's n (`split_n`) to find each row's candidates. `shared`: the kernel's dynamic
    shared memory rule; a launch's CTA reads n elements (one CTA per row), the last chunk (a
    split's stage 1: the largest) or chunks x k candidates (stage 2; one launch: the larger)."""
    flag = int(bool(largest))
    buffers = {"lengths": "lengths" if window_bytes else None, "starts": "starts" if window_bytes and starts else None,
               "scratch": None, "tickets": None, "merged_values": None, "merged_indices": None}
    scalars = {"window_bytes": window_bytes, "merged_flags": 0}
    if plan is None:
        one = shared.bytes_for(n)
        return [Stage(rows, {"x": "x", "x_indices": None, "values": "values", "indices": "indices",
                             **buffers, "scratch": "scratch" if scratch else None},
                      {"rows": rows, "n": n, "k": k, "largest": flag, "chunk": n, "row_stride": n, "flags": flags,
                       **scalars, "split_n": 0, "shared_bytes": one}, one)]
    m = plan.candidates
    first, second = shared.bytes_for(plan.last_chunk), shared.bytes_for(m)
    stage1 = {"x": "x", "x_indices": None, "values": "candidate_values", "indices": "candidate_indices", **buffers}
    stage1_scalars = {"rows": rows, "n": n, "k": k, "largest": flag, "chunk": plan.chunk, "row_stride": n,
                      "flags": UNSORTED_FLAG, **scalars, "split_n": 0}
    if plan.one_launch:
        both = max(first, second)
        return [Stage(rows * plan.chunks,
                      {**stage1, "tickets": "tickets", "merged_values": "values", "merged_indices": "indices"},
                      {**stage1_scalars, "shared_bytes": both, "merged_flags": flags}, both)]
    return [Stage(rows * plan.chunks, stage1, {**stage1_scalars, "shared_bytes": first}, first),
            Stage(rows,
                  {"x": "candidate_values", "x_indices": "candidate_indices", "values": "values", "indices": "indices",
                   **buffers},
                  {"rows": rows, "n": m, "k": k, "largest": flag, "chunk": m, "row_stride": m, "flags": flags,
                   **scalars, "split_n": n if window_bytes else 0, "shared_bytes": second}, second)]
