"""A resident float32 row's copy of words (kRawCopy in templates/topk_common.cuh): the fast
radix kernels whose collect walks whole steps keep the row's words in shared memory, not their
keys, count the words' top digit (find_digit reads those bins through the flip), and collect by
comparing words in the order of keys: one of four compares, chosen by the direction and the k-th key's
sign. A copy that a later pass or the gather reads whole is made keys first. The default
policy's sm_90 K=64 kernel (it serves rows from 4096 on; shorter rows reach the same code), as
the runtime compiles it, checked against the reference."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

from topkgen import policy as pol
from topkgen.build.render import render
from topkgen.emulator import compile_source
from topkgen.runtime import reference

from ..conftest import DEFAULT_POLICY
from ..support.topk_cases import check_topk, launch_kernel

K = 64
N = 240


@lru_cache(maxsize=None)
def _spec() -> pol.KernelSpec:
    (spec,) = [s for s in pol.plan(pol.load(DEFAULT_POLICY), "sm_90") if s.name == "topk_radix_dyn_k64_fast_f32_sm_90"]
    # The template's rule: fast, at most 128 threads, and a thread under 128 registers (kNanAfter).
    assert spec.mode == "fast" and spec.threads <= 128, spec.name
    assert 65536 // (spec.threads * spec.min_ctas_per_sm) < 128, spec.name
    return spec


def _run(x: np.ndarray, largest: bool, shared_bytes: int | None = None) -> float:
    """Runs the kernel under two schedules, checks each result; returns global bytes read per
    input byte."""
    spec = _spec()
    module = compile_source(render(spec), name=spec.name)
    for seed in (1, 2):
        values, indices, counters = launch_kernel(module, spec, x, K, largest, schedule_seed=seed, workers=1,
                                                  counters=True, shared_bytes=shared_bytes)
        check_topk(x, values, indices, K, largest, False, "float32",
                   what=f"{spec.name} largest={largest} shared_bytes={shared_bytes} seed={seed}")
    return counters.global_load_bytes / x.nbytes


def _one_sign(sign: float) -> np.ndarray:
    """Rows of one sign: normal magnitudes; that sign's zero and infinity; quiet and signalling
    NaNs of both signs, with payloads, in the last two rows."""
    rng = np.random.default_rng(int(sign > 0))
    x = (np.abs(rng.standard_normal((4, N))) * sign).astype(np.float32)
    x[1, :6] = sign * 0.0
    x[1, 6:9] = sign * np.inf
    bits = x.view(np.uint32)
    bits[2, [3, 100]] = [0x7FC00001, 0xFF800002]
    bits[3, [0, 50, 239]] = [0xFFC12345, 0x7F800001, 0x7FFFFFFF]
    return x


def _kth_at_the_floor(sign: float, largest: bool) -> np.ndarray:
    """Rows of one sign whose K-th key is the first of its first-digit bucket (its low 21 bits
    zero), 5 times: the bucket is not taken whole, so the second pass collects it, with that
    key's word for its bound, which it must take."""
    word = {(1.0, True): 0x3F800000, (-1.0, True): 0xBF9FFFFF,  # largest: key = w | sign, ~w
            (1.0, False): 0x3F9FFFFF, (-1.0, False): 0xBF800000}[(sign, largest)]  # smallest: ~ of those
    edge = np.array([word], np.uint32).view(np.float32)[0]
    rng = np.random.default_rng(3)
    high, low = (edge * 4, edge / 4) if sign > 0 else (edge / 4, edge * 4)  # of the same sign, above and below
    up = (np.nextafter(edge, high), high)  # values above the edge, then below it
    down = (low, np.nextafter(edge, low))
    better = rng.uniform(*(up if largest else down), (2, K - 2))
    worse = rng.uniform(*(down if largest else up), (2, N - K - 3))
    rows = np.concatenate([better, np.full((2, 5), edge), worse], axis=1).astype(np.float32)
    return np.stack([rng.permutation(r) for r in rows])


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["positive", "negative"])
@pytest.mark.parametrize("largest", [True, False], ids=["largest", "smallest"])
def test_words_are_collected_in_the_order_of_keys(sign, largest):
    """Rows of one sign reach each of the four compares (largest of positive rows: signed at
    least P ^ 0x80000000; of negative rows: unsigned at most ~P; smallest of positive rows:
    signed at most ~P ^ 0x80000000; of negative rows: unsigned at least P), with the k-th key
    at its bucket's floor (the bound itself). The row is read once, and once more for each NaN
    output's payload."""
    for x in (_one_sign(sign), _kth_at_the_floor(sign, largest)):
        nan_outputs = int(np.isnan(reference.topk(x, K, largest=largest)[0]).sum())
        assert _run(x, largest) == 1.0 + nan_outputs / x.size


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["positive", "negative"])
@pytest.mark.parametrize("largest", [True, False], ids=["largest", "smallest"])
def test_a_copy_read_whole_is_made_keys_first(sign, largest):
    """A row of one value: the gather reads the copy. Keys that share their top 22 bits, with
    room for 2 candidates past the copy: the later passes read the copy, then the gather. Both
    still read the row once."""
    one = np.full((2, N), sign * 0.75, np.float32)
    assert _run(one, largest) == 1.0
    near = (np.uint32(0x3F800000) + np.arange(2 * N, dtype=np.uint32).reshape(2, N) % 1024).view(np.float32) * sign
    shared = _spec().shared  # the launch rule's copy with its alignment room, then 16 bytes
    assert _run(near, largest, shared_bytes=shared.bytes_for(N) - shared.buffer_bytes + 16) == 1.0
