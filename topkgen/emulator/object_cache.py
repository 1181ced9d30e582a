"""The emulator's entries in the compile cache (`emulator/`): a kernel's shared object, or the
runtime's, under the hash of what built it, with a record that only this machine's builds can
write; one process compiles an entry while the others wait for it."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import os
from pathlib import Path
from typing import Iterator

from topkgen.common import machine_key
from topkgen.common.errors import DISK_FULL
from topkgen.common.files import read_regular
from topkgen.common.paths import cache_root, unusable_message

SO_LIMIT = 256 << 20  # the most a cached shared object may hold (they are about 100 KiB)


def cache_dir() -> Path:
    """The emulator's folder of the compile cache (exit status 2 where it cannot be one)."""
    cache = cache_root() / "emulator"
    from topkgen.build.cache import require_directories  # exit status 2: the shared object must live somewhere

    require_directories((cache_root(),), what="the emulator cache", writable=False)
    require_directories((cache,), what="the emulator cache", writable=False, link=False)  # never through a link
    return cache


@contextlib.contextmanager
def compile_lock(key: str) -> Iterator[None]:
    """One process at a time compiles a translation unit; the others wait for it and load its
    entry (pytest-xdist workers, a fleet's processes on one cache), so that no module is
    compiled twice at once. Best effort: where the lock cannot be had (a read-only cache, a
    link where its folder belongs), each process compiles, as safely as before."""
    folder = cache_root() / "locks"
    try:
        if folder.is_symlink():
            raise OSError("a link where the lock folder belongs")
        folder.mkdir(exist_ok=True)
        fd = os.open(folder / f"emulator-{key}", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def cache_writes(cache: Path) -> Iterator[None]:
    """A write in the emulator cache that fails (disk full; a directory where an entry
    belongs) as one line naming the path, exit status 2, instead of a traceback."""
    try:
        yield
    except OSError as err:
        from topkgen.build.cache import CacheUnusable

        raise CacheUnusable(unusable_message(err.filename2 or err.filename or cache, err.strerror or str(err),
                                             "the emulator cache")) from None


def no_room(stderr: str, cache: Path) -> None:
    """A host compile that failed for want of room (the compiler's or linker's own words for
    a full disk or quota, in the cache or in TMPDIR): the environment, one line, exit 2."""
    for code in DISK_FULL:
        if os.strerror(code) in stderr:
            from topkgen.build.cache import CacheUnusable

            raise CacheUnusable(unusable_message(cache, f"the host compiler could not write its output: "
                                                 f"{os.strerror(code)} (here or in TMPDIR)", "the emulator cache"))


def record(key: str, image: bytes) -> str:
    """What `<key>.sha256` holds: an HMAC-SHA256, under this machine's key (machine_key), of
    the rebuild key (the translation unit, compiler, flags and header that built the object)
    and the object's sha256. Only this machine's builds can write one that verifies."""
    return "hmac-sha256:" + machine_key.tag(b"topkgen-emulator-1", key.encode(), hashlib.sha256(image).digest())


def intact(so_path: Path, key: str) -> bytes | None:
    """The shared object's bytes when the cache entry is one this machine built for `key`
    (its record verifies, see record), else None: a missing, partial or corrupt entry is
    compiled again, and so is one that is not a regular file (a symlink to /dev/zero, a
    FIFO: read_regular neither follows nor blocks) and one planted with a digest of itself,
    whose constructor would otherwise have run on load."""
    try:
        recorded = read_regular(so_path.with_suffix(".sha256"), 1024).decode().strip()
        image = read_regular(so_path, SO_LIMIT)
    except (OSError, ValueError):  # ValueError: a record that is not text
        return None
    return image if hmac.compare_digest(recorded, record(key, image)) else None
