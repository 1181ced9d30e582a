"""The NVRTC compile cache: action records `ac/<key>.json` that name content `cas/<sha256>`,
in a local directory first and, when TOPKGEN_CACHE_URL names one (cache_stores.py holds both stores), a remote fsspec store
that CI jobs share (s3://, gs://, file://, memory://).

Why this shape: a key covers every input of a compile (`action_key`), so two machines share
an entry only when they would have compiled the same bytes. Content is addressed by its
sha256, so every byte read from any tier is checked before use, and an entry serves only
when its cubin passes a loader's checks for the kernel and arch asked for (entry_problem).
Writes go content first and action record last, create-if-absent: a reader never finds a
record without its content, the first writer wins, and a record that already names other
bytes of the same kernel means a key missed an input. That is an error (`CacheConflict`),
never an overwrite. TOPKGEN_CACHE_READONLY=1 keeps a job (a pull request from a fork) from
writing the remote at all.

A damaged or hostile cache directory: every entry is read as a regular file of bounded size,
opened without following a symlink and without blocking (files.read_regular); anything else
in its place (a symlink to /dev/zero, a FIFO, a directory, an oversized or unreadable file)
is a corrupt entry, handled as one whose sha256 is wrong: the kernel is compiled again and
the local entry repaired. A local cache that cannot be used at all (TOPKGEN_CACHE_DIR names a
file, or a directory this user cannot read) stops a command before any compile, exit 2, with
one message naming TOPKGEN_CACHE_DIR and the path: a build that silently compiled everything
on every run, in CI, would hide the misconfiguration behind slowness. So does a folder inside
a cache (nvrtc-store, its ac/ and cas/, the emulator's folder, a file:// store's ac/ and cas/)
that is a symbolic link: entries written through it would land in its target, outside the
cache. One this user can only read still serves its hits. A write that fails during a build (read-only, disk full) is not
fatal: the kernels were compiled, and the CLI warns that they were not cached.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from topkgen.build import cache_trust
from topkgen.manifest import checks as manifest_checks
from topkgen.policy.dispatch_table import FieldError
from topkgen.common.paths import cache_root, unusable_message
from topkgen.build.cache_stores import (  # noqa: F401 (callers name the stores and their errors as cache.X)
    ENTRY_LIMITS, LOCAL_DIR, CacheConfigError, CacheError, CacheUnusable, LocalStore, RemoteStore, Store, display_url,
    local_store, remote_readonly, remote_store, require_directories)

CACHE_FORMAT = 1  # part of every key: a new record layout never reads an old one
RECORD_FIELDS = {"key": str, "name": str, "arch": str, "symbol": str, "resources": dict, "cubin_sha256": str,
                 "cubin_size": int, "source_sha256": str, "toolchain": dict}
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class CacheRecordLies(CacheConfigError):
    """An action record whose resources contradict its own cubin's ELF (registers, stack
    frame): no compile wrote it, so it is refused loudly, naming the entry (exit 2), never
    built into a bundle nor quietly replaced."""


class CachePoisoned(CacheConfigError):
    """A served entry whose cubin differs from a fresh compile of its key (build --verify-cache):
    other code under a key that every other check passes; exit 2, naming the entry."""


class CacheConflict(CacheError):
    """An action record names a different cubin than the one just compiled for its key."""


def action_key(*, source: str, name: str, arch: str, options: list[str], toolchain_digest: str) -> str:
    """The key of one compile: everything NVRTC's output depends on, nothing machine-specific
    (include paths are left out of `options`; the headers are in the toolchain digest)."""
    payload = {"format": CACHE_FORMAT, "source": source, "name": name, "arch": arch, "options": options,
               "toolchain": toolchain_digest}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def ac_path(key: str) -> str:
    return f"ac/{key}.json"


def cas_path(digest: str) -> str:
    return f"cas/{digest}"


def record_bytes(record: dict[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


def parse_record(data: bytes, key: str) -> dict[str, Any] | None:
    """An action record if `data` is one for `key`, else None (corrupt or foreign)."""
    try:
        record = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: a record of nested brackets
        return None
    if not isinstance(record, dict) or record.get("key") != key:
        return None
    if any(not isinstance(record.get(field), kind) for field, kind in RECORD_FIELDS.items()):
        return None
    if not all(SHA256_HEX.fullmatch(record[field]) for field in ("cubin_sha256", "source_sha256")):
        return None  # a digest is a file name under cas/: never a path
    if record["symbol"] != record["name"]:
        return None  # every kernel is extern "C": its symbol is its name
    if any(type(value) is not int or value < 0 for value in record["resources"].values()):
        return None  # counts of registers, bytes, barriers (a bool is no count)
    return record


def entry_problem(record: dict[str, Any], cubin: bytes | None, name: str, arch: str) -> str | None:
    """Why an entry (its record and the cubin it names, None when absent) cannot serve kernel
    `name` for `arch`, or None. An entry serves only when its record is for that kernel and
    arch and a loader would accept its cubin in a bundle (manifest_checks.check_file: sha256,
    ELF machine, SM, the symbol defined as a function): a record that names another kernel's
    cubin, its sha256 intact, or claims another arch, was otherwise served, copied into the
    local tier and written into a bundle every loader refuses."""
    if (record["name"], record["arch"]) != (name, arch):
        return f"its record is for {record['name']} ({record['arch']}), not {name} ({arch})"
    if cubin is None:
        return f"{cas_path(record['cubin_sha256'])} is missing"
    entry = manifest_checks.Entry("cubin", True, {"cubin": cas_path(record["cubin_sha256"]), "arch": arch,
                                                  "sha256": record["cubin_sha256"], "symbol": record["symbol"]})
    try:
        manifest_checks.check_file(entry, cubin)
    except FieldError as err:
        return err.message
    return None


# ----------------------------------------------------------------------------- the tiers

@dataclass(frozen=True)
class Outcome:
    """How one kernel was obtained, and what that cost the remote tier."""

    origin: str              # "local" | "remote" | "compiled"
    remote_read: int = 0     # bytes read from the remote
    remote_written: int = 0  # bytes written to the remote
    rejected: int = 0        # remote entries that failed verification (so compiled here)
    errors: tuple[str, ...] = ()  # remote I/O failures (the remote was skipped)
    local_errors: tuple[str, ...] = ()  # local writes that failed (disk full): the kernel was not cached
    local_added: bool = False  # this process wrote the local record (not another process, not an earlier run)
    unpinned: int = 0        # remote entries TOPKGEN_CACHE_PINS kept from serving (so compiled here)
    verified: bool = False   # served, and recompiled to the same cubin (build --verify-cache)


@dataclass(frozen=True)
class Hit:
    record: dict[str, Any]
    cubin: bytes
    outcome: Outcome


def _read(store: Store, key: str, name: str, arch: str) -> tuple[dict[str, Any], bytes, int] | None:
    """A verified entry for kernel `name` on `arch` (record, cubin, bytes read), or None when
    there is none; ValueError for an entry that exists but fails verification (entry_problem)."""
    data = store.get(ac_path(key))
    if data is None:
        return None
    record = parse_record(data, key)
    if record is None:
        raise ValueError(f"{store.label}/{ac_path(key)} is not a valid action record")
    cubin = store.get(cas_path(record["cubin_sha256"]))
    problem = entry_problem(record, cubin, name, arch)
    if problem is not None:
        raise ValueError(f"{store.label}/{ac_path(key)}: {problem}")
    assert cubin is not None
    lie = resources_lie(record, cubin)
    if lie is not None:
        raise CacheRecordLies(f"{store.label}/{ac_path(key)}: kernel {name} ({arch}): {lie}; no compile wrote this "
                              f"record (tampered with or damaged): delete the entry, and run `topkgen cache verify` "
                              f"on that store")
    return record, cubin, len(data) + len(cubin)


def resources_lie(record: dict[str, Any], cubin: bytes) -> str | None:
    """How a record's resources contradict what its cubin's ELF records for its symbol
    (registers and stack frame: what a cubin can prove; spills, shared memory and barriers
    it does not record as plain), or None. Builds check budgets against a record's
    resources and manifests ship them, so a record claiming 1 register for a cubin of 48
    reached every loader."""
    where = record["cubin"] if "cubin" in record else cas_path(record["cubin_sha256"])  # a manifest's entry, a record
    counts = manifest_checks.elf_function_counts(cubin, record["symbol"])
    if counts is None:
        return f"{where} records no register count and stack frame for '{record['symbol']}'"
    for field, value in counts.items():
        if record["resources"].get(field) != value:
            return f"its record says resources.{field} {record['resources'].get(field)}, but its cubin {where} records {value}"
    return None


def store_failure(err: Exception) -> str:
    """A store's failure in one line: its library's exception type says what failed."""
    return f"{type(err).__name__}: {err}"


def lookup(key: str, source: str, name: str, arch: str) -> Hit | Outcome:
    """A verified hit for kernel `name` on `arch` from the local tier, else from the remote
    one (which then fills the local tier); on a miss, the Outcome so far (rejected remote
    entries, remote failures). An entry that fails verification is never served nor copied:
    the kernel is compiled and store() repairs the local entry."""
    pinned = cache_trust.pins()
    local = local_store()
    try:
        found = _read(local, key, name, arch)
    except ValueError:
        found = None  # compiled again; store() repairs the entry
    if found is not None and cache_trust.pin_problem(key, found[0]["cubin_sha256"], pinned, remote=False) is None:
        return Hit(found[0], found[1], Outcome("local"))
    remote = remote_store()
    if remote is None:
        return Outcome("compiled")
    try:
        found = _read(remote, key, name, arch)
    except ValueError:
        return Outcome("compiled", rejected=1)
    except CacheRecordLies:
        raise  # loud, as for the local tier: a remote that lies is no outage
    except Exception as err:  # network, credentials: an outage of the shared tier must not fail a build
        return Outcome("compiled", errors=(store_failure(err),))
    if found is None:
        return Outcome("compiled")
    record, cubin, nbytes = found
    if cache_trust.pin_problem(key, record["cubin_sha256"], pinned, remote=True) is not None:
        pinned_here = pinned is not None and key in pinned  # pinned to other bytes: a rejected entry
        return Outcome("compiled", remote_read=nbytes, rejected=int(pinned_here), unpinned=int(not pinned_here))
    try:
        _put(local, record, cubin, source, repair=True)
        local_errors: tuple[str, ...] = ()
    except OSError as err:  # the verified remote entry serves this build all the same
        local_errors = (_local_failure(err),)
    return Hit(record, cubin, Outcome("remote", remote_read=nbytes, local_errors=local_errors))


def store(key: str, fields: dict[str, Any], cubin: bytes, source: str, miss: Outcome, *,
          strict: bool = False, write_remote: bool = True) -> Outcome:
    """Record a compile (symbol, resources, toolchain in `fields`) in the local tier and,
    unless read-only or not `write_remote`, the remote one; `miss` is what the lookup before
    it found. A failed local write (disk full) is in the Outcome's local_errors, or with
    `strict` (cache import, whose whole job is the write) a CacheUnusable; a failed remote
    write is in its errors."""
    record = {**fields, "key": key, "cubin_sha256": sha256(cubin), "cubin_size": len(cubin),
              "source_sha256": sha256(source.encode())}
    local_errors, added = miss.local_errors, False
    try:
        added = _put(local_store(), record, cubin, source, repair=True)[1]
    except OSError as err:
        if strict:
            raise CacheUnusable(unusable_message(Path(err.filename or cache_root()), err.strerror)) from None
        local_errors += (_local_failure(err),)
    remote = remote_store()
    written, errors = 0, miss.errors
    if remote is not None and not remote_readonly() and write_remote:
        try:
            written = _put(remote, record, cubin, source, repair=False)[0]
        except CacheError:
            raise
        except Exception as err:
            errors += (store_failure(err),)
    return Outcome("compiled", remote_read=miss.remote_read, remote_written=written, rejected=miss.rejected,
                   errors=errors, local_errors=local_errors, local_added=added, unpinned=miss.unpinned)


def _local_failure(err: OSError) -> str:
    return f"{err.filename}: {err.strerror}" if err.filename else str(err)


def _put(target: Store, record: dict[str, Any], cubin: bytes, source: str, *, repair: bool) -> tuple[int, bool]:
    """Content first, the action record last, each create-if-absent; returns the bytes
    written and whether this call wrote the record (no other writer did, no earlier run).
    `repair` (the local tier only) replaces entries that fail verification."""
    written = 0
    for digest, data in ((record["cubin_sha256"], cubin), (record["source_sha256"], source.encode())):
        if target.create(cas_path(digest), data):
            written += len(data)
        elif repair and sha256(target.get(cas_path(digest)) or b"") != digest:
            target.replace(cas_path(digest), data)  # type: ignore[attr-defined]
    data = record_bytes(record)
    if target.create(ac_path(record["key"]), data):
        return written + len(data), True
    existing = target.get(ac_path(record["key"]))
    other = parse_record(existing, record["key"]) if existing is not None else None
    if other is not None and (_forged(target, other, record) or repair and cache_trust.pin_problem(
            record["key"], other["cubin_sha256"], cache_trust.pins(), remote=False) is not None):
        other = None  # corrupt, like a record that does not parse (or against the pins): repaired locally, left
        # alone in the remote
    if other is not None and other["cubin_sha256"] != record["cubin_sha256"]:
        raise CacheConflict(
            f"cache conflict for kernel {record['name']} ({record['arch']}): {target.label}/{ac_path(record['key'])} "
            f"names cubin sha256 {other['cubin_sha256'][:16]}..., this compile produced "
            f"{record['cubin_sha256'][:16]}...; the key misses an input (or NVRTC is not deterministic). "
            f"Nothing was overwritten: find the cause, then delete that entry.")
    if other is None and repair:
        target.replace(ac_path(record["key"]), data)  # type: ignore[attr-defined]
        return written + len(data), True
    return written, False


def _forged(target: Store, other: dict[str, Any], record: dict[str, Any]) -> bool:
    """Whether the record `other`, found under `record`'s key, is one no compile of that
    kernel could have written: for another kernel or arch, or naming a cubin that is there
    and fails entry_problem. A conflict is a record that names other bytes only because
    the key missed an input: a cubin of the same kernel and arch, or one not there at all
    (content is written before its record, so a reader never finds a record without it)."""
    cubin = target.get(cas_path(other["cubin_sha256"]))
    if cubin is None and (other["name"], other["arch"]) == (record["name"], record["arch"]):
        return False
    return entry_problem(other, cubin, record["name"], record["arch"]) is not None


# ----------------------------------------------------------------------------- statistics

@dataclass(frozen=True)
class Stats:
    """One build's cache statistics, as data: the CLI formats them."""

    kernels: int
    local_hits: int
    remote_hits: int
    compiled: int
    remote_read: int
    remote_written: int
    rejected: int
    errors: tuple[str, ...]
    local_errors: tuple[str, ...]  # failed local writes: those kernels were compiled and not cached
    remote: str | None      # the remote store's URL (no credentials), None when unset
    readonly: bool
    unpinned: int = 0       # remote entries TOPKGEN_CACHE_PINS kept from serving
    verified: int = 0       # served entries recompiled to the same cubin (build --verify-cache)

    @classmethod
    def of(cls, outcomes: Iterable[Outcome]) -> "Stats":
        outcomes = list(outcomes)
        remote = remote_store()
        return cls(
            kernels=len(outcomes),
            local_hits=sum(o.origin == "local" for o in outcomes),
            remote_hits=sum(o.origin == "remote" for o in outcomes),
            compiled=sum(o.origin == "compiled" for o in outcomes),
            remote_read=sum(o.remote_read for o in outcomes),
            remote_written=sum(o.remote_written for o in outcomes),
            rejected=sum(o.rejected for o in outcomes),
            errors=tuple(dict.fromkeys(e for o in outcomes for e in o.errors)),
            local_errors=tuple(dict.fromkeys(e for o in outcomes for e in o.local_errors)),
            remote=remote.label if remote is not None else None,
            readonly=remote_readonly(),
            unpinned=sum(o.unpinned for o in outcomes),
            verified=sum(o.verified for o in outcomes),
        )
