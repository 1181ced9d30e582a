"""How far a build trusts its compile cache (issue 33, point 3), as the user says:

- `TOPKGEN_CACHE_PINS=FILE` pins the cache: FILE is the provenance of a build you trust
  (`build --provenance FILE`, from your main branch's CI job), and it maps each kernel's cache
  key to the sha256 of its cubin. With pins set, a remote entry serves only when its key is
  pinned to exactly its cubin: an unpinned one is compiled here instead and never copied into
  the local cache; one pinned to other bytes is rejected. A local entry pinned to other bytes
  is compiled again (the store then refuses to overwrite it: a loud conflict naming it).
- `build --verify-cache P` recompiles about P% of the kernels the cache serves (the same
  kernels run to run: chosen by their key) and fails the build, exit 2, naming the entry, when
  one differs from its fresh compile: other code under a key no other check can tell apart.
- `build --provenance FILE` writes, outside the bundle (its manifest stays as it was), where
  each kernel came from: the local cache, the remote (by URL, without credentials) or NVRTC,
  and whether it was recompiled to verify it.
- `TOPKGEN_CACHE_READONLY=1` keeps a job from writing the remote at all.

Content is addressed by sha256, not signed: these say how far what a store holds is believed.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from topkgen.common.errors import InputError
from topkgen.common.files import atomic_write, read_regular

PROVENANCE_FORMAT = "topkgen-provenance-1"
MAX_PINS_BYTES = 64 << 20  # a pin file of every fleet kernel is about 100 KiB
PINS_VARIABLE = "TOPKGEN_CACHE_PINS"


class PinsError(InputError, ValueError):
    """TOPKGEN_CACHE_PINS names no file of pins; exit 2."""


def pins() -> dict[str, str] | None:
    """The pinned cache keys (key -> cubin sha256) of TOPKGEN_CACHE_PINS, None when unset."""
    path = os.environ.get(PINS_VARIABLE, "").strip()
    return _read_pins(path) if path else None


@lru_cache(maxsize=4)
def _read_pins(path: str) -> dict[str, str]:
    where = f"{PINS_VARIABLE}={path}"
    try:
        document = json.loads(read_regular(Path(path), MAX_PINS_BYTES))
    except OSError as err:
        raise PinsError(f"{where}: cannot read it: {err.strerror}") from None
    except (ValueError, RecursionError):
        raise PinsError(f"{where}: not the JSON of `topkgen build --provenance`") from None
    kernels = document.get("kernels") if isinstance(document, dict) else None
    if not isinstance(kernels, list) or document.get("format") != PROVENANCE_FORMAT:
        raise PinsError(f"{where}: not a provenance file of `topkgen build --provenance` ({PROVENANCE_FORMAT})")
    found: dict[str, str] = {}
    for i, entry in enumerate(kernels):
        key, digest = (entry.get("key"), entry.get("cubin_sha256")) if isinstance(entry, dict) else (None, None)
        if not (isinstance(key, str) and isinstance(digest, str) and len(key) == len(digest) == 64):
            raise PinsError(f"{where}: kernels[{i}]: expected a key and a cubin_sha256 of 64 hex digits")
        found[key] = digest
    return found


def pin_problem(key: str, cubin_sha256: str, pinned: dict[str, str] | None, *, remote: bool) -> str | None:
    """Why pins forbid serving this entry, or None: a remote entry must be pinned to its very
    cubin; a local one, when pinned, too."""
    if pinned is None:
        return None
    want = pinned.get(key)
    if want is None:
        return "its key is not pinned" if remote else None
    return None if want == cubin_sha256 else f"pinned to cubin {want[:16]}..., it names {cubin_sha256[:16]}..."


def chosen_for_verification(key: str, percent: float) -> bool:
    """Whether a served entry is recompiled under `--verify-cache percent`: by its key, so
    the same kernels each run and about percent of them."""
    return percent >= 100 or int(key[:8], 16) % 10000 < percent * 100


def provenance(entries: Iterable[dict[str, Any]]) -> bytes:
    """The provenance file's bytes: sorted, so that two builds of one cache write the same."""
    kernels = sorted(entries, key=lambda e: (e["arch"], e["name"]))
    return (json.dumps({"format": PROVENANCE_FORMAT, "kernels": kernels}, indent=1, sort_keys=True) + "\n").encode()


def write_provenance(path: Path, entries: Iterable[dict[str, Any]]) -> None:
    atomic_write(path, provenance(entries))
