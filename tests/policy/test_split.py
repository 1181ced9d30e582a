"""Split rows on the emulator (issue 14): a small batch of long rows cut into chunks, each
chunk's top k found by its own CTA, then merged by the same kernel reading candidate
indices. Against topkgen.runtime.reference for every K rung, n at and around chunk boundaries, NaN of
both signs, +-0, all-equal rows and ties across chunk boundaries; deterministic mode
bit-exact and identical to the unsplit launch; the workspace the caller passes, laid out as
topkgen.policy.split says; and, on the default policy, a row of 131072 spread over 32 CTAs that read
each element once.

Most cases run under a copy of the default policy whose split section cuts rows of a few
thousand elements (the emulator runs every thread of every CTA on the CPU), and whose dtypes
are all JIT, so its bundle compiles nothing: the kernels are the default policy's."""

from __future__ import annotations

import subprocess
import sys

import jsonschema
import numpy as np
import pytest
import yaml

from topkgen import policy as pol
from topkgen.runtime import reference
from topkgen.emulator import compile_source
from topkgen.build.render import render
from topkgen.runtime import TopK, TopKError, arguments
from topkgen.common.schema import load_schema
from topkgen.policy.split import ChunkPlan, stages

from ..conftest import DEFAULT_POLICY
from ..support.topk_cases import BITS, NUMPY_DTYPES, check_topk, launch_kernel, make_rows

SMALL_SPLIT = {"sm_count": 48, "ctas_per_sm": 1, "rows_below": 8, "min_n": 2048, "max_chunks": 8,
               "min_chunk": 1024, "chunk_per_k": 1}


def small_split_policy(shared_row_bytes: int | None = None) -> str:
    doc = yaml.safe_load(DEFAULT_POLICY.read_text())
    doc["archs"]["sm_90"]["split"] = SMALL_SPLIT
    if shared_row_bytes is not None:
        doc["archs"]["sm_90"]["shared_row_bytes"] = shared_row_bytes
    doc["dtypes"] = {"aot": [], "jit": ["float32", "bfloat16", "float16"]}
    return yaml.safe_dump(doc, sort_keys=False)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """TopK over the small-split policy's bundle (all JIT: nothing to compile), emulated."""
    root = tmp_path_factory.mktemp("split")
    (root / "policy.yaml").write_text(small_split_policy())
    proc = subprocess.run([sys.executable, "-m", "topkgen", "build", "--policy", str(root / "policy.yaml"),
                           "--arch", "sm_90", "--out", str(root / "bundle")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return TopK(root / "bundle", arch="sm_90", backend="emulator")


def unsplit(op: TopK, x: np.ndarray, k: int, largest: bool, deterministic: bool) -> tuple[np.ndarray, np.ndarray]:
    """The same kernel, launched once with one CTA per row (what a batch too large to split gets)."""
    dtype = next(d for d, t in NUMPY_DTYPES.items() if t == x.dtype.type)
    spec = pol.select(op.policy, "sm_90", dtype, k, x.shape[1], deterministic=deterministic).kernel
    values, indices, _ = launch_kernel(compile_source(render(spec), name=spec.name), spec, x, k, largest, workers=1)
    return values, indices


def check_split(op: TopK, x: np.ndarray, k: int, largest: bool, deterministic: bool, chunks: int, what: str) -> None:
    dtype = next(d for d, t in NUMPY_DTYPES.items() if t == x.dtype.type)
    rows, n = x.shape
    assert op.choose(dtype, k, n, deterministic, rows).chunks == chunks, what
    values, indices = op(x, k, largest=largest, deterministic=deterministic)
    check_topk(x, values, indices, k, largest, deterministic, dtype, what=what)
    if deterministic:
        once_values, once_indices = unsplit(op, x, k, largest, deterministic)
        np.testing.assert_array_equal(indices, once_indices, err_msg=f"{what}: indices differ from the unsplit launch")
        np.testing.assert_array_equal(values.view(BITS[dtype]), once_values.view(BITS[dtype]),
                                      err_msg=f"{what}: values differ from the unsplit launch")


# ----------------------------------------------------------------------------- every K rung

@pytest.mark.parametrize("k", [1, 64, 65, 128, 200, 256, 257, 512, 513, 1024])
def test_every_k_rung_against_the_reference(small, k):
    """Six rows (random with duplicates, few-valued ties, all equal, NaN of both signs with
    +-0 and infinities, ascending, -inf with NaNs) of 8199: 8 chunks of 1024, the last 1031."""
    x = make_rows("float32", 6, 8199, seed=k)
    largest = k % 2 == 0
    check_split(small, x, k, largest, True, 8, f"det k={k} largest={largest}")
    if k in (65, 256, 1024):
        check_split(small, x, k, not largest, False, 8, f"fast k={k} largest={not largest}")


@pytest.mark.parametrize("n,chunks", [(2047, 1), (2048, 2), (4097, 4), (8191, 4), (8192, 8), (8199, 8)])
def test_n_at_and_around_chunk_boundaries(small, n, chunks):
    """Rows of min_n - 1 (not split), min_n (2 chunks of k elements at K=1024), and a multiple
    of the chunk count, one more, and one less (fewer chunks, the last one longer)."""
    x = make_rows("float32", 6, n, seed=n)
    check_split(small, x, 1024 if n < 4096 else 300, True, True, chunks, f"n={n}")


def test_bfloat16_and_float16(small):
    for dtype, k in (("bfloat16", 100), ("float16", 700)):
        x = make_rows(dtype, 6, 6000, seed=7)
        check_split(small, x, k, True, True, 4, f"{dtype} k={k}")
        check_split(small, x, k, False, False, 4, f"{dtype} k={k} smallest fast")


def test_ties_across_chunk_boundaries_go_to_the_lower_index(small):
    """Equal keys on both sides of every chunk boundary, and a tie that every chunk holds more
    of than k: deterministic mode takes the lowest indices of the row, as one CTA would."""
    n, k = 8192, 9
    boundaries = np.zeros((3, n), np.float32)
    for c in range(1, 8):
        boundaries[0, c * 1024 - 1] = boundaries[0, c * 1024] = 5.0   # 14 ties of the top key, k = 9
        boundaries[1, [c * 1024 - 2, c * 1024 - 1, c * 1024]] = -0.0   # -0 and +0 ties
    boundaries[1] += np.where(np.arange(n) % 1024 < 3, -1.0, 0.0).astype(np.float32)
    boundaries[2] = np.where(np.arange(n) % 512 < 20, 7.0, 1.0)        # every chunk ties on 7.0, 40 each
    values, indices = small(boundaries, k, deterministic=True)
    np.testing.assert_array_equal(indices[0], [1023, 1024, 2047, 2048, 3071, 3072, 4095, 4096, 5119])
    np.testing.assert_array_equal(indices[2], np.arange(9))
    check_split(small, boundaries, k, True, True, 8, "boundary ties")
    check_split(small, boundaries, 700, False, True, 8, "boundary ties, smallest")


def test_chunks_longer_than_shared_memory(tmp_path):
    """With 4 KB of shared memory a chunk of 2048 is not resident: stage 1 collects candidates
    from global memory (or filters the row), as one CTA does with a long row."""
    (tmp_path / "policy.yaml").write_text(small_split_policy(shared_row_bytes=4096))
    proc = subprocess.run([sys.executable, "-m", "topkgen", "build", "--policy", str(tmp_path / "policy.yaml"),
                           "--arch", "sm_90", "--out", str(tmp_path / "bundle")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    op = TopK(tmp_path / "bundle", arch="sm_90", backend="emulator")
    x = make_rows("float32", 6, 16384, seed=5)
    check_split(op, x, 256, True, True, 8, "chunks not resident")


# ----------------------------------------------------------------------------- the workspace

def test_the_workspace_holds_each_chunks_candidates_in_order(small):
    """The reasoning behind deterministic merges, checked on the caller's workspace: stage 1
    leaves chunk c's k candidates at (row x chunks + c) x k, each with an index inside chunk
    c, ordered by (key desc, index asc); so candidate position order is index order among
    equal keys, and stage 2's ties by lower position are ties by lower index."""
    rows, n, k = 2, 8192, 50
    x = np.where(np.random.default_rng(3).random((rows, n)) < 0.3, 2.0, np.arange(n) % 7).astype(np.float32)
    plan = small.plan("float32", k, n, rows, deterministic=True)
    assert plan == ChunkPlan(rows, n, k, 8, 4) and small.workspace_bytes("float32", k, n, rows, True) == \
        plan.workspace_bytes == plan.values_offset + rows * 8 * k * 4
    workspace = np.zeros(plan.workspace_bytes + 100, np.uint8)
    values, indices = small(x, k, deterministic=True, workspace=workspace)
    check_topk(x, values, indices, k, True, True, "float32")
    cand_indices = workspace[:rows * 8 * k * 8].view(np.int64).reshape(rows, 8, k)
    cand_values = workspace[plan.values_offset:plan.values_offset + rows * 8 * k * 4].view(np.float32).reshape(rows, 8, k)
    for r in range(rows):
        for c in range(8):
            lo, hi = c * plan.chunk, n if c == 7 else (c + 1) * plan.chunk
            ref_values, ref_indices = reference.topk(x[r, lo:hi], k)
            np.testing.assert_array_equal(cand_indices[r, c], ref_indices + lo)
            np.testing.assert_array_equal(cand_values[r, c], ref_values)
        merged = cand_indices[r].reshape(-1)
        order = np.lexsort((merged, -cand_values[r].reshape(-1)))  # by key desc, then index asc
        assert (order[np.argsort(order)] == np.arange(order.size)).all()
        for key in np.unique(cand_values[r]):
            tied = merged[cand_values[r].reshape(-1) == key]
            assert (np.diff(tied) > 0).all(), "equal keys must lie in index order"


def test_a_workspace_too_small_is_refused(small):
    x = make_rows("float32", 2, 8192, seed=1)
    need = small.workspace_bytes("float32", 64, 8192, 2)
    with pytest.raises(TopKError, match=rf"workspace: {need - 1} bytes, this call needs {need}"):
        small(x, 64, workspace=np.zeros(need - 1, np.uint8))
    buffer = np.zeros(need + 32, np.uint8)  # 16-byte loads: a workspace off a 16-byte boundary faults on a GPU
    base = buffer.ctypes.data
    off = next(o for o in range(1, 16) if (base + o) % 16)
    with pytest.raises(TopKError, match="workspace: must start at a multiple of 16 bytes"):
        small(x, 64, workspace=buffer[off:off + need])
    aligned = (-base) % 16
    check_topk(x, *small(x, 64, workspace=buffer[aligned:aligned + need]), 64, True, False, "float32", what="aligned")
    assert small.workspace_bytes("float32", 64, 8192, 8) == 0  # a batch of rows_below: not split
    assert small.workspace_bytes("float32", 64, 2047, 1) == 0  # rows below min_n


def test_the_runtime_launches_what_split_stages_plans():
    """Both backends bind the stages' buffers by parameter name in the order of params: the
    stage-2 call reads the candidates stage 1 wrote and writes the output."""
    policy = pol.load(DEFAULT_POLICY)
    spec = pol.select(policy, "sm_90", "float32", 100, 131072).kernel
    from topkgen.manifest.params import params

    from topkgen.manifest.params import output_flags

    flags = output_flags(False, "int32")  # stage 1 writes int64 candidates in no order: the unsorted bit alone
    first, second = stages(3, 131072, 100, True, ChunkPlan(3, 131072, 100, 32, 4), flags=flags)
    pointers = {name: name for name in ("x", "values", "indices", "candidate_values", "candidate_indices")}
    dense = [None, None, 0, 0]  # lengths, starts, window_bytes, split_n: no ragged windows
    assert arguments(params(spec), first, pointers, None) == [
        "x", None, "candidate_values", "candidate_indices", 3, 131072, 100, 1, 4096, 131072, output_flags(False, "int64"),
        *dense, 0]  # shared_bytes: no shared memory rule given, none
    assert arguments(params(spec), second, pointers, None) == [
        "candidate_values", "candidate_indices", "values", "indices", 3, 3200, 100, 1, 3200, 3200, flags, *dense, 0]
    # A sorted request's stage 1 is unsorted too: stage 2 selects and sorts its candidates again.
    sorted_first, sorted_second = stages(3, 131072, 100, True, ChunkPlan(3, 131072, 100, 32, 4), flags=0)
    assert sorted_first.scalars["flags"] == output_flags(False, "int64") and sorted_second.scalars["flags"] == 0
    assert (first.grid_rows, second.grid_rows) == (96, 3)
    assert [type(a) for a in arguments(params(spec), second, pointers, None)[4:]] == \
        [np.int32] * 5 + [np.int64, np.int32, type(None), type(None), np.int32, np.int32, np.int32]
    # a ragged batch of int32 lengths and starts: both stages read them; stage 2 gets stage 1's n
    pointers |= {"lengths": "lengths", "starts": "starts"}
    first, second = stages(3, 131072, 100, True, ChunkPlan(3, 131072, 100, 32, 4), window_bytes=4, starts=True)
    assert arguments(params(spec), first, pointers, None)[-5:-1] == ["lengths", "starts", 4, 0]
    assert arguments(params(spec), second, pointers, None)[-5:-1] == ["lengths", "starts", 4, 131072]
    (only,) = stages(3, 131072, 100, True, None, window_bytes=8)
    assert arguments(params(spec), only, pointers, None)[-5:-1] == ["lengths", None, 8, 0]
    # The kernel's shared memory rule: each launch's bytes, passed as its last argument too.
    first, second = stages(3, 131072, 100, True, ChunkPlan(3, 131072, 100, 32, 4), shared=spec.shared)
    assert (first.shared_bytes, second.shared_bytes) == (spec.shared.bytes_for(4096), spec.shared.bytes_for(3200))
    assert [arguments(params(spec), s, pointers, None)[-1] for s in (first, second)] == \
        [first.shared_bytes, second.shared_bytes]


# ----------------------------------------------------------------------------- the default policy

def test_one_row_of_131072_spreads_over_32_ctas_that_read_it_once(default_policy):
    """The default policy's plan for 1 x 131072, K=256, on the traffic counters: stage 1 runs
    32 CTAs and reads each element once (the chunks are resident in shared memory); stage 2
    reads 8192 candidates; the result is the reference's, bit for bit."""
    rows, n, k = 1, 131072, 256
    sel = pol.select(default_policy, "sm_90", "float32", k, n, deterministic=True, rows=rows)
    assert sel.split is not None and sel.split.chunks == 32
    spec = sel.kernel
    module = compile_source(render(spec), name=spec.name)
    x = make_rows("float32", 1, n, seed=11)
    values, indices = np.zeros((rows, k), np.float32), np.zeros((rows, k), np.int64)
    workspace = np.zeros(sel.split.workspace_bytes, np.uint8)
    count = rows * sel.split.candidates
    pointers = {"x": x, "values": values, "indices": indices,
                "candidate_indices": workspace[:count * 8].view(np.int64),
                "candidate_values": workspace[sel.split.values_offset:sel.split.values_offset + count * 4].view(np.float32)}
    counts = []
    for stage in stages(rows, n, k, True, sel.split, shared=spec.shared):
        counts.append(module.launch(spec.name, stage.grid_rows, spec.threads, arguments(_params(spec), stage, pointers, None),
                                    shared_bytes=stage.shared_bytes, counters=True))
    first, second = counts
    reads = first.global_load_bytes / x.nbytes
    print(f"1 x {n}, K={k}: {sel.split.chunks} CTAs per row, stage 1 reads {reads:.3f} per element, "
          f"stage 2 {second.global_load_bytes} bytes for {count} candidates")
    assert reads <= 1.2
    assert second.global_load_bytes <= count * 4 * 1.2 + k * 8  # candidate values, and k candidate indices
    check_topk(x, values, indices, k, True, True, "float32")


def _params(spec):
    from topkgen.manifest.params import params

    return params(spec)


def test_explain_shows_the_split_plan(cli):
    args = ("explain", "--arch", "sm_90", "--dtype", "float32", "--k", "256", "--n", "131072")
    one = cli(*args, "--rows", "1").stdout
    assert ("split:  32 chunks per row of 4096 elements (the last 4096), 32 CTAs; then "
            "topk_radix_dyn_k256_fast_f32_sm_90 merges 8192 candidates per row; workspace 98304 bytes") in one
    many = cli(*args, "--rows", "4096").stdout
    below = pol.load(DEFAULT_POLICY).archs["sm_90"].split.rows_below_for(256)
    assert "split:  none: one CTA per row" in many and f"not split: rows=4096 >= rows_below {below}" in many
    record = __import__("json").loads(cli(*args, "--rows", "1", "--format", "json").stdout)
    jsonschema.validate(record, load_schema("explain.schema.json"))
    assert record["request"]["rows"] == 1 and record["split"]["chunks"] == 32
    assert record["split"]["stage2_kernel"] == record["kernel"]
    bad = cli(*args, "--rows", "-1")
    assert bad.exit_code == 2 and "--rows" in bad.stderr


def test_an_empty_batch_is_explained_as_served_unsplit_everywhere(cli, default_policy):
    """rows=0 has one answer in select, the CLI and the runtime: an empty batch launches
    nothing, so it is served unsplit with no workspace (once the CLI refused it, TopK.explain
    printed "no batch size given" and recorded null, and the C++ loader refused it)."""
    args = ("explain", "--arch", "sm_90", "--dtype", "float32", "--k", "256", "--n", "131072", "--rows", "0")
    text = cli(*args)
    assert text.exit_code == 0, text.stderr
    assert "rows=0 mode=fast" in text.stdout and "split:  none: an empty batch launches nothing" in text.stdout
    assert "not split: rows=0, an empty batch launches nothing" in text.stdout
    record = __import__("json").loads(cli(*args, "--format", "json").stdout)
    jsonschema.validate(record, load_schema("explain.schema.json"))
    assert record["request"]["rows"] == 0 and record["split"] is None
    sel = pol.select(default_policy, "sm_90", "float32", 256, 131072, rows=0)
    assert sel.split is None and sel.kernel == pol.select(default_policy, "sm_90", "float32", 256, 131072).kernel
    with pytest.raises(pol.DispatchError, match=r"^rows: must be >= 0, got -1$"):
        pol.select(default_policy, "sm_90", "float32", 256, 131072, rows=-1)
