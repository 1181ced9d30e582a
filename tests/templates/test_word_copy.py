"""A resident row's copy of words (kRawCopy in templates/topk_common.cuh): the fast radix
kernels whose collect walks whole steps keep the row's words in shared memory, not their keys,
count the words' top digit (find_digit reads those bins through the flip), and collect by
comparing words in the order of keys: one of four compares, chosen by the direction and the
k-th key's sign (16-bit words two a register, each half in place; on sm_90 and later, 16-bit
words as values, two keys a compare). A copy that a later pass or the gather reads whole is
made keys first. The default policy's sm_90 K=64 kernels of float32
and bfloat16 (they serve rows from 4096 on; shorter rows reach the same code), as the runtime
compiles them, checked against the reference."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

from topkgen import policy as pol
from topkgen.build.render import render
from topkgen.emulator import compile_source
from topkgen.runtime import reference

from ..conftest import DEFAULT_POLICY
from ..support.topk_cases import BITS, NUMPY_DTYPES, check_topk, launch_kernel

K = 64
N = 240
DTYPES = ["float32", "bfloat16"]
MANTISSA_BITS = {"float32": 23, "bfloat16": 7}


@lru_cache(maxsize=None)
def _spec(dtype: str) -> pol.KernelSpec:
    name = f"topk_radix_dyn_k64_fast_{pol.DTYPE_TAGS[dtype]}_sm_90"
    (spec,) = [s for s in pol.plan(pol.load(DEFAULT_POLICY), "sm_90") if s.name == name]
    # The template's rule: fast, at most 128 threads, and a thread under 128 registers (kNanAfter).
    assert spec.mode == "fast" and spec.threads <= 128, spec.name
    assert 65536 // (spec.threads * spec.min_ctas_per_sm) < 128, spec.name
    return spec


def _run(dtype: str, x: np.ndarray, largest: bool, shared_bytes: int | None = None, key_compare: bool = False) -> float:
    """Runs the kernel under two schedules, checks each result; returns global bytes read per
    input byte. key_compare: the collect of sm_75 to sm_89 (TOPKGEN_KEY_COMPARE=1), which
    compares 16-bit keys one at a time where sm_90 and later compare two."""
    spec = _spec(dtype)
    module = compile_source(render(spec), name=spec.name + ("_kc" if key_compare else ""),
                            defines=("TOPKGEN_KEY_COMPARE=1",) if key_compare else ())
    for seed in (1, 2):
        values, indices, counters = launch_kernel(module, spec, x, K, largest, schedule_seed=seed, workers=1,
                                                  counters=True, shared_bytes=shared_bytes)
        check_topk(x, values, indices, K, largest, False, dtype,
                   what=f"{spec.name} largest={largest} shared_bytes={shared_bytes} seed={seed}")
    return counters.global_load_bytes / x.nbytes


def _one_sign(dtype: str, sign: float) -> np.ndarray:
    """Rows of one sign: normal magnitudes; that sign's zero and infinity; quiet and signalling
    NaNs of both signs, with payloads, in the last two rows."""
    rng = np.random.default_rng(int(sign > 0))
    x = (np.abs(rng.standard_normal((4, N))) * sign).astype(NUMPY_DTYPES[dtype])
    x[1, :6] = sign * 0.0
    x[1, 6:9] = sign * np.inf
    bits = x.view(BITS[dtype])
    drop = 32 - 8 * x.itemsize  # a 16-bit word is the float32 word's top half
    bits[2, [3, 100]] = [w >> drop for w in (0x7FC10000, 0xFF820000)]
    bits[3, [0, 50, 239]] = [w >> drop for w in (0xFFC12345, 0x7F810000, 0x7FFFFFFF)]
    return x


def _kth_at_the_floor(dtype: str, sign: float, largest: bool) -> np.ndarray:
    """Rows of one sign whose K-th key is the first of its first-digit bucket (its bits below
    the top 11 zero), 5 times: the bucket is not taken whole, so the second pass collects it,
    with that key's word for its bound, which it must take. Words of one sign order the
    values as they are (positive) or reversed (negative)."""
    word = {(1.0, True): 0x3F800000, (-1.0, True): 0xBF9FFFFF,  # largest: key = w | sign, ~w
            (1.0, False): 0x3F9FFFFF, (-1.0, False): 0xBF800000}[(sign, largest)]  # smallest: ~ of those
    edge = word >> (32 - 8 * np.dtype(NUMPY_DTYPES[dtype]).itemsize)
    span = 2 << MANTISSA_BITS[dtype]  # two binades
    above, below = (edge + 1, edge + span), (edge - span, edge - 1)  # in words
    up, down = (above, below) if sign > 0 else (below, above)  # in values
    rng = np.random.default_rng(3)
    better = rng.integers(*(up if largest else down), (2, K - 2), endpoint=True)
    worse = rng.integers(*(down if largest else up), (2, N - K - 3), endpoint=True)
    words = np.concatenate([better, np.full((2, 5), edge), worse], axis=1).astype(BITS[dtype])
    return np.stack([rng.permutation(r) for r in words]).view(NUMPY_DTYPES[dtype])


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["positive", "negative"])
@pytest.mark.parametrize("largest", [True, False], ids=["largest", "smallest"])
@pytest.mark.parametrize("dtype,key_compare", [("float32", False), ("bfloat16", False), ("bfloat16", True)],
                         ids=["float32", "bfloat16", "bfloat16-key-at-a-time"])
def test_words_are_collected_in_the_order_of_keys(dtype, key_compare, sign, largest):
    """Rows of one sign reach each of the four compares (largest of positive rows: signed at
    least P ^ 0x80000000; of negative rows: unsigned at most ~P; smallest of positive rows:
    signed at most ~P ^ 0x80000000; of negative rows: unsigned at least P), with the k-th key
    at its bucket's floor (the bound itself). bfloat16 takes them where no pair compare exists
    (key_compare; sm_90's pair compare of values elsewhere). The row is read once, and once
    more for each NaN output's payload."""
    for x in (_one_sign(dtype, sign), _kth_at_the_floor(dtype, sign, largest)):
        nan_outputs = int(np.isnan(reference.topk(x, K, largest=largest)[0].astype(np.float32)).sum())
        assert _run(dtype, x, largest, key_compare=key_compare) == 1.0 + nan_outputs / x.size


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["positive", "negative"])
@pytest.mark.parametrize("largest", [True, False], ids=["largest", "smallest"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_copy_read_whole_is_made_keys_first(dtype, sign, largest):
    """A row of one value: the gather reads the copy. Keys that share every digit but the
    last (float32: their top 22 bits; bfloat16: their top 11), with room for 2 candidates past
    the copy: the later passes read the copy, then the gather. Both still read the row once."""
    np_dtype = NUMPY_DTYPES[dtype]
    one = np.full((2, N), sign * 0.75, np_dtype)
    assert _run(dtype, one, largest) == 1.0
    last_digit = {"float32": 1 << 10, "bfloat16": 1 << 5}[dtype]
    base = 0x3F800000 >> (32 - 8 * np.dtype(np_dtype).itemsize)
    near = (base + np.arange(2 * N).reshape(2, N) % last_digit).astype(BITS[dtype]).view(np_dtype)
    near = (near.astype(np.float32) * sign).astype(np_dtype)
    shared = _spec(dtype).shared  # the launch rule's copy with its alignment room, then 16 bytes
    assert _run(dtype, near, largest, shared_bytes=shared.bytes_for(N) - shared.buffer_bytes + 16) == 1.0


def _nans_of_one_sign(dtype: str) -> np.ndarray:
    """Normal rows with words whose exponent is all ones: row 0 positive NaNs, with payloads, and
    +inf; row 1 -inf; row 2 -inf and one negative NaN whose payload leaves it in -inf's
    first-digit bin; row 3 a negative NaN alone."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, N)).astype(NUMPY_DTYPES[dtype])
    bits = x.view(BITS[dtype])
    drop = 32 - 8 * x.itemsize  # a 16-bit word is the float32 word's top half

    def words(*ws: int) -> list[int]:
        return [w >> drop for w in ws]

    bits[0, [7, 70, 200, 201]] = words(0x7FC10000, 0x7F810000, 0x7FFFFFFF, 0x7F800000)
    bits[1, 10:60] = words(0xFF800000)
    bits[2, 10:60] = words(0xFF800000)
    bits[2, [123]] = words(0xFF800001 if x.itemsize == 4 else 0xFF810000)
    bits[3, [99]] = words(0xFFC00000)
    return x


@pytest.mark.parametrize("largest", [True, False], ids=["largest", "smallest"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_row_is_asked_about_nan_where_its_bins_say_it_may_hold_one(dtype, largest):
    """float32's first pass keeps no NaN test a word: its bins of words whose exponent is all ones
    say whether the row may hold a NaN whose word does not order as the NaN key (a negative
    one), and only then is the copy (resident) or the row (not resident, shared_bytes 0: NaNs of
    either sign) scanned. A positive NaN stays the word it is, so its output needs no second
    read of the row, but for the word whose key is every NaN's key (0x7FFFFFFF); a negative NaN
    in -inf's bin is found. bfloat16 tests each word (every NaN output reads its value again)."""
    x = _nans_of_one_sign(dtype)
    nan_outputs = int(np.isnan(reference.topk(x[:1], K, largest=largest)[0].astype(np.float32)).sum())
    rereads = (1 if largest else 0) if dtype == "float32" else nan_outputs
    assert _run(dtype, x[:1], largest) == 1.0 + rereads / N
    _run(dtype, x, largest)
    _run(dtype, x, largest, shared_bytes=0)


def _kth_at_a_zero_or_nan(dtype: str, largest: bool) -> np.ndarray:
    """Row 0: 40 values of the direction's side, 30 of its zero, 30 of the other zero, the rest
    beyond: the K-th key is a zero's, whose bucket holds that zero alone. Row 1: 70 NaNs, 100 of
    the direction's infinity: the K-th key is the NaN key. Row 2: 150 NaNs, which smallest
    leaves, and 90 values, 30 of them in the K-th smallest key's bucket ([1, 1.25)) and 40
    below."""
    rng = np.random.default_rng(7)
    s = 1.0 if largest else -1.0
    side = np.abs(rng.standard_normal(N)).astype(NUMPY_DTYPES[dtype])
    zeros = np.concatenate([side[:40] * s, np.full(30, s * 0.0), np.full(30, -s * 0.0), -s * side[100:]])
    nans = np.concatenate([np.full(70, np.nan), np.full(100, s * np.inf), s * side[170:]])
    left = np.concatenate([np.full(150, np.nan), -50 - side[:40], 1 + np.arange(30) / 128, 2 + side[:20]])
    return np.stack([rng.permutation(r) for r in (zeros, nans, left)]).astype(NUMPY_DTYPES[dtype])


@pytest.mark.parametrize("largest", [True, False], ids=["largest", "smallest"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_bound_that_values_cannot_state_collects_keys(dtype, largest):
    """sm_90 collects 16-bit words two a compare, as values: where the K-th key's bucket is a
    zero's (+0 and -0 are one value and two keys) or the NaN key's (whose bound would be an
    infinity), the copy is made keys and collected by key instead, which takes the K-th zero's
    equals only, and the NaNs only; smallest's compare leaves NaNs. The candidate buffer has room
    for 80: the 70 keys of the bucket and above, not the other zeros, infinities or NaNs too."""
    shared = _spec(dtype).shared
    _run(dtype, _kth_at_a_zero_or_nan(dtype, largest), largest,
         shared_bytes=shared.bytes_for(N) - shared.buffer_bytes + 80 * 8)
    # 40 values and 200 NaNs: smallest's K-th key is the NaN key, with the launch's buffer
    values = np.abs(np.random.default_rng(8).standard_normal((1, N)))
    values[:, 40:] = np.nan
    _run(dtype, values.astype(NUMPY_DTYPES[dtype]), largest)
