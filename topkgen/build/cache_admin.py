"""`topkgen cache import` and `topkgen cache verify`: seed the compile cache from a released
bundle, and recompile a sample of entries to prove they hold what NVRTC makes.

Why import re-derives every key: an imported entry is later served to builds as if NVRTC had
made it, so an entry goes in only when this checkout renders the same source for that
kernel and the manifest's cache_key is the key of that source under the bundle's toolchain.
Why verify exists: keys are only as exact as their inputs; recompiling a sample and
comparing bytes is how a fleet finds a missed input before it serves a wrong cubin.
"""

from __future__ import annotations

import math
import os
import random
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, TypeVar

from topkgen.build import cache, workers
from topkgen.manifest import reading as manifests
from topkgen.manifest import checks as manifest_checks
from topkgen.build import toolchain as tc
from topkgen.common.errors import InputError
from topkgen.common.paths import cache_root
from topkgen.common.reader import printable


# What topkgen's kernels include: the CUDA headers its templates name. verify compiles a
# source from the cache (perhaps a shared remote one) only when that is all it could include:
# NVRTC opens whatever an #include names, blocks on a FIFO, and quotes the file in errors.
ALLOWED_INCLUDES = frozenset({"#include <cuda_bf16.h>", "#include <cuda_fp16.h>"})
_FILE_WORDS = re.compile(r"[A-Za-z0-9_]*(?:include|import|embed)[A-Za-z0-9_]*")
_OPENS_FILES = {"include", "include_next", "import", "embed", "__has_include", "__has_include_next", "__has_embed"}


def foreign_include(source: str) -> str | None:
    """The first line of `source` that could make the preprocessor open a file other than
    ALLOWED_INCLUDES, or None. Conservative: the word anywhere (a comment, a string) counts,
    after line splices are joined, as the preprocessor joins them first."""
    for line in re.sub(r"\\\r?\n", "", source).splitlines():
        if line.strip() in ALLOWED_INCLUDES:
            continue
        if any(word in _OPENS_FILES for word in _FILE_WORDS.findall(line)):
            return line.strip()
    return None


T = TypeVar("T")


class CacheInputError(InputError, ValueError):
    """A bundle that cannot seed the cache, or a bad verify request: exit status 2."""


@dataclass(frozen=True)
class ImportResult:
    kernels: int                 # kernels in the bundle
    added: int                   # entries new to the local cache
    present: int                 # entries the local cache already held
    skipped: list[str]           # kernels whose source this checkout renders differently
    toolchain_matches: bool      # whether this machine's builds can hit the entries
    remote: str | None           # the remote store also written, if any
    remote_written: int          # bytes written to it


def import_bundle(path: Path) -> ImportResult:
    """Check every kernel first (nothing is written if one fails), then write the entries
    through the same tiers as a compile: local, and the remote unless read-only. A local
    cache that cannot be used or written (not a directory, no permission, disk full) is a
    cache.CacheUnusable (exit 2) naming the path. Filling the stores is import's whole job,
    so a remote write that fails (a build only warns) is a cache.CacheConfigError (exit 2)
    too, raised once the local part is done, which it says."""
    from topkgen.build.compile import cache_key, toolchain
    from topkgen.policy import plan
    from topkgen.build.render import render

    try:
        manifest, root = manifests.load_manifest(path)
        policy = manifests.manifest_policy(manifest, str(path))
    except manifests.ManifestError as err:
        raise CacheInputError(str(err)) from None
    try:  # every cubin checked as a loader checks it: sha256, ELF machine, SM and symbol
        files = manifests.read_files(root, manifest)
    except manifests.ManifestError as err:  # it names the manifest and the key
        raise CacheInputError(str(err)) from None
    specs = {spec.name: spec for arch in manifest["archs"] if arch in policy.archs for spec in plan(policy, arch)}
    chosen, skipped = [], []
    for entry in manifest["kernels"]:
        spec = specs.get(entry["name"])
        if spec is None or spec.arch != entry["arch"]:
            raise CacheInputError(f"{path}: kernel {entry['name']} is not in the plan of the policy the bundle embeds")
        cubin = files[entry["name"]]
        source = render(spec)
        if cache.sha256(source.encode()) != entry["source_sha256"]:
            skipped.append(entry["name"])  # its key cannot be checked, and this checkout would never ask for it
            continue
        key = cache_key(source, spec.name, spec.nvrtc_target, manifest["toolchain"])
        if key != entry["cache_key"]:
            raise CacheInputError(f"{path}: kernel {entry['name']}: cache_key is not the key of its source under "
                                  f"the bundle's toolchain (tampered or from another topkgen)")
        _check_resources(path, entry, cubin)
        fields = {"name": spec.name, "arch": spec.arch, "symbol": entry["symbol"], "resources": entry["resources"],
                  "toolchain": manifest["toolchain"]}
        chosen.append((key, fields, cubin, source))
    remote = cache.remote_store()
    added, written, failure = 0, 0, None
    for key, fields, cubin, source in chosen:
        # After one remote failure the rest go to the local tier only: an outage fails once, not per kernel.
        outcome = cache.store(key, fields, cubin, source, cache.Outcome("compiled"), strict=True,
                              write_remote=failure is None)
        added += outcome.local_added  # what this process created: a concurrent import counts the others
        written += outcome.remote_written
        failure = failure or next(iter(outcome.errors), None)
    present = len(chosen) - added
    if failure is not None and remote is not None:
        raise cache.CacheConfigError(
            f"TOPKGEN_CACHE_URL={remote.label}: cannot write this store: {failure}; the local cache was filled "
            f"all the same ({added} entries added, {present} already present)")
    return ImportResult(
        kernels=len(manifest["kernels"]), added=added, present=present, skipped=skipped,
        toolchain_matches=tc.digest(manifest["toolchain"]) == tc.digest(toolchain()),
        remote=remote.label if remote is not None and not cache.remote_readonly() else None,
        remote_written=written)


def _check_resources(path: Path, entry: dict, cubin: bytes) -> None:
    """A cache entry's resources are served to builds as ptxas's own (budgets are checked
    against them, manifests ship them): the register count and stack frame are checked
    against what the cubin records. The spill counts, static shared memory and barriers
    cannot be read back from a cubin, so import trusts the manifest for those."""
    counts = manifest_checks.elf_function_counts(cubin, entry["symbol"])
    if counts is None:
        raise CacheInputError(f"{path}: kernel {entry['name']}: {entry['cubin']} records no register count and "
                              f"stack frame for '{entry['symbol']}'")
    for name, value in counts.items():
        if entry["resources"][name] != value:
            raise CacheInputError(f"{path}: kernel {entry['name']}: resources.{name} is {entry['resources'][name]}, "
                                  f"but {entry['cubin']} records {value}")


@dataclass
class VerifyResult:
    store: str
    entries: int
    sampled: int
    seed: int
    identical: int = 0
    skipped: int = 0                                  # entries of another toolchain
    problems: list[str] = field(default_factory=list)  # one line each: the key, the kernel, what is wrong


def verify(percent: float, *, remote: bool = False, seed: int | None = None, jobs: int = 1) -> VerifyResult:
    """Recompile `percent`% of the entries (chosen at random with `seed`) and compare bytes."""
    if not 0 < percent <= 100:
        raise CacheInputError(f"--sample {percent}: expected a percentage in (0, 100]")
    base = cache_root()
    if not remote and (_absent(base) or (base.is_dir() and _absent(base / cache.LOCAL_DIR))):
        raise _nothing_to_verify(str(base / cache.LOCAL_DIR), remote)  # local_store() would create it
    store: cache.Store | None = cache.remote_store() if remote else cache.local_store()
    if store is None:
        raise CacheInputError("--remote: TOPKGEN_CACHE_URL is not set")
    keys = [n[:-len(".json")] for n in _reading(store, "ac/", lambda: store.names("ac")) if n.endswith(".json")]
    if not keys:
        raise _nothing_to_verify(store.label, remote)
    seed = seed if seed is not None else int.from_bytes(os.urandom(4), "big")
    sample = sorted(random.Random(seed).sample(keys, math.ceil(len(keys) * percent / 100)))
    result = VerifyResult(store.label, len(keys), len(sample), seed)
    for verdict in workers.run_all(lambda key: _verify_one(store, key), sample, jobs):  # a Ctrl-C waits for none
        if verdict == "identical":
            result.identical += 1
        elif verdict == "skipped":
            result.skipped += 1
        else:
            result.problems.append(verdict)
    return result


def _absent(path: Path) -> bool:
    """Nothing at all at `path` (what is there but unusable, local_store() names)."""
    return not os.path.lexists(path)


def _nothing_to_verify(where: str, remote: bool) -> CacheInputError:
    """A cache with no entries, or none at all, to verify: refused, since a check that checked
    nothing must not pass (a misspelt location reads as an empty cache), and verify creates
    no directory (it did, then said "verified 0 of 0", exit 0)."""
    setting = "TOPKGEN_CACHE_URL" if remote else "TOPKGEN_CACHE_DIR"
    return CacheInputError(f"{printable(where)}: no cache entries there, nothing to verify "
                           f"(is {setting} the cache's location?)")


def _reading(store: cache.Store, what: str, read: Callable[[], T]) -> T:
    """`read()`; its failure (an outage, a refused permission) is the store's, not an entry's:
    the verification stops with one line naming the store, not a traceback."""
    try:
        return read()
    except Exception as err:  # noqa: BLE001 - network, credentials, OSError: whatever the store's library raises
        raise CacheInputError(f"{store.label}: cannot read {what}: {cache.store_failure(err)}") from None


def _verify_one(store: cache.Store, key: str) -> str:
    """'identical', 'skipped', or a line that says what is wrong with the entry."""
    from topkgen.build.compile import CompileError, cache_key, compile_kernel, toolchain

    def get(rel: str) -> bytes | None:
        return _reading(store, rel, lambda: store.get(rel))

    data = get(cache.ac_path(key))
    record = cache.parse_record(data, key) if data is not None else None
    if record is None:
        return f"{key[:16]}: not a valid action record"
    label = f"{key[:16]} {record['name']} ({record['arch']})"
    if tc.digest(record["toolchain"]) != tc.digest(toolchain()):
        return "skipped"
    source = get(cache.cas_path(record["source_sha256"]))
    cubin = get(cache.cas_path(record["cubin_sha256"]))
    if source is None or cache.sha256(source) != record["source_sha256"]:
        return f"{label}: its source is missing or fails its sha256"
    if cubin is None or cache.sha256(cubin) != record["cubin_sha256"]:
        return f"{label}: its cubin is missing or fails its sha256"
    try:
        text = source.decode()
    except UnicodeDecodeError:
        return f"{label}: its source is not UTF-8 text"
    foreign = foreign_include(text)
    if foreign is not None:  # not compiled: no topkgen kernel includes anything else
        return f"{label}: its source includes what no topkgen kernel does: {foreign[:120]!r}"
    try:
        if cache_key(text, record["name"], record["arch"]) != key:
            return f"{label}: the key is not the key of its source, name and arch"
        fresh = compile_kernel(text, record["name"], record["arch"], use_cache=False)
    except CompileError as err:
        return f"{label}: does not compile: {str(err).splitlines()[0]}"
    if fresh.cubin != cubin:
        return (f"{label}: recompiled cubin differs (cached sha256 {record['cubin_sha256'][:16]}..., "
                f"recompiled {cache.sha256(fresh.cubin)[:16]}...)")
    if fresh.symbol != record["symbol"] or asdict(fresh.resources) != record["resources"]:
        return f"{label}: recompiled symbol or resources differ from the record"
    return "identical"

