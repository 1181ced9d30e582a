"""A loader written from topkgen/schemas/manifest.schema.json's descriptions alone, the way
an outside author would write one: the standard library only, no topkgen import, nothing
known about the policy. test_independent_loader.py holds it against topkgen.policy.select.

Dispatch, per the schema: take dispatch[arch][dtype][mode] and the one row whose k, n and
rows ranges hold k, n and rows (rows unknown or 0: 2147483647, launched unsplit); its kernel
serves with its chunks when the loader can JIT, its aot_fallback with its aot_chunks when
it cannot (null: nothing serves). A split of C chunks per row needs a workspace of
align_up(rows x C x k x 8, 256) + rows x C x k x sizeof(dtype) bytes, candidate values from
byte align_up(rows x C x k x 8, 256), and stage 1 runs chunks of floor(n / C) elements. Each
launch's dynamic shared memory (schema 6): with D = launch.dynamic_shared_bytes and s the
dtype's size, 0 when D is 0, else min(D, align_up((e + 16 / s - 1) x s, 16) +
launch.shared_buffer_bytes) for the e elements a CTA reads: n unsplit, the last chunk in
stage 1, C x k in stage 2."""

from __future__ import annotations

import json
from pathlib import Path

ROWS_MAX = 2147483647
SIZES = {"float32": 4, "bfloat16": 2, "float16": 2}


class Refused(Exception):
    pass


class IndependentLoader:
    def __init__(self, bundle_dir: str | Path) -> None:
        self.manifest = json.loads((Path(bundle_dir) / "manifest.json").read_text())
        if self.manifest["schema_version"] != 7:
            raise Refused("schema_version is not 7")
        self.launches = {e["name"]: e["launch"] for e in self.manifest["kernels"] + self.manifest["jit_kernels"]}

    def pick(self, arch: str, dtype: str, k: int, n: int, deterministic: bool, jit: bool,
             rows: int | None = None) -> tuple[str, int] | None:
        """(the kernel's name, chunks per row), or None where nothing serves the request."""
        if not (1 <= k <= n <= 2147483647) or not (rows is None or 0 <= rows <= ROWS_MAX):
            raise Refused(f"k={k} n={n} rows={rows} is outside the domain")
        table = self.manifest["dispatch"][arch][dtype]["deterministic" if deterministic else "fast"]
        r = rows or ROWS_MAX  # unknown (None) or empty (0): the unsplit row
        hits = [row for row in table if row["k"][0] <= k <= row["k"][1] and row["n"][0] <= n <= row["n"][1]
                and row["rows"][0] <= r <= row["rows"][1]]
        if len(hits) != 1:
            raise Refused(f"{len(hits)} rows hold k={k} n={n} rows={r}")
        kernel, chunks = (hits[0]["kernel"], hits[0]["chunks"]) if jit else (hits[0]["aot_fallback"], hits[0]["aot_chunks"])
        if kernel is None:
            return None
        return kernel, chunks if rows else 1

    def shared_bytes(self, kernel: str, dtype: str, k: int, n: int, chunks: int) -> list[int]:
        """Each launch's dynamic shared memory: one, or a split's stage 1 and stage 2."""
        launch, s = self.launches[kernel], SIZES[dtype]
        if launch["dynamic_shared_bytes"] == 0:
            return [0] * (1 if chunks == 1 else 2)
        sizes = [n] if chunks == 1 else [n - (chunks - 1) * (n // chunks), chunks * k]
        return [min(launch["dynamic_shared_bytes"], -(-(e + 16 // s - 1) * s // 16) * 16 + launch["shared_buffer_bytes"])
                for e in sizes]

    @staticmethod
    def workspace(dtype: str, k: int, n: int, rows: int, chunks: int) -> dict[str, int]:
        count = rows * chunks * k
        offset = -(-count * 8 // 256) * 256
        return {"chunk": n // chunks, "values_offset": offset, "workspace_bytes": offset + count * SIZES[dtype]}
