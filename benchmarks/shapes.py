"""The shapes and data kinds of issue 13, shared by `make bench-kernels` (counted on the
emulator) and `make gpu-check` (timed on a GPU), so that both speak of the same cases."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DATA_KINDS = ("normal", "uniform", "all-equal", "90% -inf", "tie-heavy")


@dataclass(frozen=True)
class ShapeSet:
    name: str
    model_rows: int                        # the batch the H200 model assumes
    emulated_rows: int                     # rows bench-kernels runs (the counts are per row)
    gpu_rows: tuple[int, ...]              # batches gpu-check times
    shapes: tuple[tuple[str, int, int], ...]  # (dtype, n, k)
    data: tuple[str, ...] = DATA_KINDS     # the data kinds both run
    per_batch: bool = False                # dispatch depends on the batch (split rows): bench-kernels
                                           # plans each of gpu_rows and runs emulated_rows of it


SETS = (
    ShapeSet("seed grid", 4096, 4, (132, 4096),
             tuple((d, n, k) for d in ("float32", "bfloat16") for n, k in ((2048, 64), (8192, 128), (16384, 256)))),
    ShapeSet("LLM sampling", 64, 2, (1, 64),
             (("float32", 131072, 16), ("float32", 262144, 256), ("float32", 262144, 1024),
              ("bfloat16", 131072, 16), ("bfloat16", 262144, 256))),
    ShapeSet("rows of 131072", 1024, 2, (1024,),
             tuple((d, 131072, k) for d in ("float32", "bfloat16") for k in (256, 1024))),
    ShapeSet("register ladder", 4096, 8, (4096,), (("float32", 1024, 16), ("bfloat16", 1024, 16))),
    # LLM vocabularies (32000, GPT-2's 50257) sampled at K=50: float32 rows longer than shared
    # memory and shorter than a split, which the stream reads once.
    ShapeSet("vocab rows", 256, 2, (256,), (("float32", 32000, 50), ("float32", 50257, 50), ("bfloat16", 50257, 50)),
             ("normal", "uniform")),
    # Issue 14: LLM sampling batches, whose rows the default policy splits across CTAs.
    ShapeSet("small batch", 1, 1, (1, 4, 16, 64),
             tuple(("float32", n, k) for n in (131072, 262144) for k in (16, 256, 1024)), ("normal",), True),
)


def select_sets(names: str | None) -> list[ShapeSet]:
    """The sets named in a comma-separated list (all when None); unknown names raise ValueError."""
    if names is None:
        return list(SETS)
    wanted = [name.strip() for name in names.split(",")]
    unknown = [name for name in wanted if name not in {s.name for s in SETS}]
    if unknown:
        raise ValueError(f"unknown shape set {unknown[0]!r} (known: {', '.join(s.name for s in SETS)})")
    return [s for s in SETS if s.name in wanted]


def make_rows(kind: str, rows: int, n: int, seed: int) -> np.ndarray:
    """float64 rows of one data kind; callers cast to the dtype under test."""
    rng = np.random.default_rng(seed)
    if kind == "normal":
        return rng.standard_normal((rows, n))
    if kind == "uniform":
        return rng.random((rows, n))
    if kind == "all-equal":
        return np.full((rows, n), 0.75)
    if kind == "90% -inf":  # masked logits: 90% -inf, the rest normal
        return np.where(rng.random((rows, n)) < 0.9, -np.inf, rng.standard_normal((rows, n)))
    if kind == "tie-heavy":  # 16 distinct values (quantised scores): every bucket is a tie run
        return rng.integers(0, 16, (rows, n)).astype(np.float64) / 4
    raise ValueError(f"unknown data kind {kind!r}")
