"""A loader written from topkgen/schemas/manifest.schema.json's descriptions alone, the way
an outside author would write one: the standard library only, no topkgen import, nothing
known about the policy. test_independent_loader.py holds it against topkgen.policy.select.

Dispatch, per the schema: take dispatch[arch][dtype][mode] and the one row whose k and n
ranges hold k and n; its kernel serves when the loader can JIT, its aot_fallback when it
cannot (null: nothing serves)."""

from __future__ import annotations

import json
from pathlib import Path


class Refused(Exception):
    pass


class IndependentLoader:
    def __init__(self, bundle_dir: str | Path) -> None:
        self.manifest = json.loads((Path(bundle_dir) / "manifest.json").read_text())
        if self.manifest["schema_version"] != 2:
            raise Refused("schema_version is not 2")

    def pick(self, arch: str, dtype: str, k: int, n: int, deterministic: bool, jit: bool) -> str | None:
        """The kernel's name, or None where nothing serves the request."""
        if not (1 <= k <= 1024 and k <= n <= 2147483647):
            raise Refused(f"k={k} n={n} is outside the domain")
        rows = self.manifest["dispatch"][arch][dtype]["deterministic" if deterministic else "fast"]
        hits = [row for row in rows if row["k"][0] <= k <= row["k"][1] and row["n"][0] <= n <= row["n"][1]]
        if len(hits) != 1:
            raise Refused(f"{len(hits)} rows hold k={k} n={n}")
        return hits[0]["kernel"] if jit else hits[0]["aot_fallback"]
