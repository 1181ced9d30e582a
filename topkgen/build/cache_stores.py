"""Where the compile cache keeps its entries: the local store under TOPKGEN_CACHE_DIR and a
shared remote (TOPKGEN_CACHE_URL, any fsspec URL), each an action cache (ac/, records by key)
and a content-addressed store (cas/, cubins by digest), and the checks that a cache location
is usable: a directory, writable where it must be, and never reached through a link inside it."""

from __future__ import annotations

import contextlib
import os
import stat
import urllib.parse
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Protocol

from topkgen.common import settings
from topkgen.common.errors import InputError
from topkgen.common.files import atomic_write, directory_problem, read_regular, temporary_beside
from topkgen.common.paths import cache_root, cache_url, shared_cache_directory, unusable_message
LOCAL_DIR = "nvrtc-store"
# The most a read of one entry takes in: records are about 1 KiB, cubins and sources at most a few MiB.
ENTRY_LIMITS = {"ac": 1 << 20, "cas": 64 << 20}


class CacheError(RuntimeError):
    """The cache cannot be used as configured, or holds an entry that contradicts a compile."""


class CacheConfigError(CacheError, InputError):
    """TOPKGEN_CACHE_URL cannot be opened (no fsspec, an unknown protocol), or the local cache
    directory cannot be used: exit status 2."""


class CacheUnusable(CacheConfigError):
    """The local cache directory (TOPKGEN_CACHE_DIR) is not a directory this user can use."""


# ----------------------------------------------------------------------------- stores

class Store(Protocol):
    label: str

    def get(self, rel: str) -> bytes | None:
        """The entry's bytes; None when there is none, or none that can be used (not a regular
        file, larger than ENTRY_LIMITS): to verification, an entry that is missing or corrupt."""

    def create(self, rel: str, data: bytes) -> bool:
        """Write `data` unless `rel` exists; False when it did (the first writer wins)."""

    def names(self, folder: str) -> list[str]: ...


class LocalStore:
    """A directory. Create-if-absent is a hard link of a finished temporary file, which the
    kernel refuses when the name exists: atomic between processes."""

    def __init__(self, root: Path, label: str | None = None) -> None:
        self.root = root
        self.label = label or str(root)

    def get(self, rel: str) -> bytes | None:
        try:
            return read_regular(self.root / rel, ENTRY_LIMITS[rel.split("/", 1)[0]])
        except OSError:  # absent, or a symlink, FIFO, directory, oversized or unreadable file: corrupt
            return None

    def create(self, rel: str, data: bytes) -> bool:
        path = self.root / rel
        if os.path.lexists(path):
            return False  # nothing written: a cache that holds the entry and cannot be written is no error
        try:
            with temporary_beside(path, data) as tmp:
                try:
                    os.link(tmp, path)  # create-if-absent: the first writer wins
                    return True
                except FileExistsError:  # whatever holds the name: get() tells an entry from junk
                    return False
        except OSError as err:
            raise _naming(err, path) from None

    def replace(self, rel: str, data: bytes) -> None:
        """Repair a corrupt local entry (local entries are this machine's own). Renaming over
        the name replaces a symlink or FIFO there, never what a symlink points to."""
        path = self.root / rel
        try:
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISDIR(os.lstat(path).st_mode):
                    os.rmdir(path)  # an empty directory in an entry's place; a full one is refused below
            atomic_write(path, data)
        except OSError as err:
            raise _naming(err, path) from None

    def names(self, folder: str) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.root / folder) if not n.startswith("."))
        except FileNotFoundError:
            return []
        except OSError as err:  # the local tier's folders were checked by local_store(): a file:// remote's
            raise CacheConfigError(f"{self.label}/{folder}: cannot list it: {err.strerror}") from None


def _naming(err: OSError, path: Path) -> OSError:
    """`err` about the entry `path`, not about the temporary file beside it."""
    return OSError(err.errno, err.strerror, str(path))


class RemoteStore:
    """Any fsspec filesystem. Create-if-absent is fsspec's `pipe_file(mode="create")`:
    atomic where the service has conditional writes (S3 If-None-Match, GCS generation
    match, memory://)."""

    def __init__(self, url: str) -> None:
        try:
            import fsspec
        except ImportError:
            raise CacheConfigError(f"TOPKGEN_CACHE_URL={display_url(url)}: fsspec is not installed "
                                   f"(pip install 'topkgen[remote]', plus s3fs or gcsfs for s3:// or gs://)") from None
        try:
            self.fs, self.root = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError) as err:  # an unknown protocol, a missing s3fs or gcsfs
            raise CacheConfigError(f"TOPKGEN_CACHE_URL={display_url(url)}: cannot open this store: {err}") from None
        except Exception as err:  # noqa: BLE001 - a filesystem's constructor raises what it likes (ftp:// connects,
            # zip:// opens a file, github:// needs arguments): the URL's problem, not a bug in topkgen
            raise CacheConfigError(f"TOPKGEN_CACHE_URL={display_url(url)}: cannot open this store: "
                                   f"{type(err).__name__}: {err}") from None
        self.root = self.root.rstrip("/")
        self.label = display_url(url)

    def _path(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def get(self, rel: str) -> bytes | None:
        limit = ENTRY_LIMITS[rel.split("/", 1)[0]]
        try:
            data = self.fs.cat_file(self._path(rel), start=0, end=limit + 1)  # never more than that
        except FileNotFoundError:
            return None
        return data if len(data) <= limit else None

    def create(self, rel: str, data: bytes) -> bool:
        try:
            self.fs.pipe_file(self._path(rel), data, mode="create")
            return True
        except FileExistsError:
            return False

    def names(self, folder: str) -> list[str]:
        try:
            paths = self.fs.ls(self._path(folder), detail=False)
        except FileNotFoundError:
            return []
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in paths)


def display_url(url: str) -> str:
    """The URL without any user:password@ part, for messages and logs."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


@lru_cache(maxsize=4)
def _remote(url: str) -> RemoteStore:
    return RemoteStore(url)


def local_store() -> LocalStore:
    """The local tier, once it is known to be readable: CacheUnusable (exit 2) otherwise. A
    cache this user cannot write (a read-only mount, a shared copy) still serves its hits;
    each write that fails is a warning where it happens."""
    base = cache_root()
    root = base / LOCAL_DIR
    require_directories((base,), writable=False)
    require_directories((root, root / "ac", root / "cas"), writable=False, link=False)  # never written through
    return LocalStore(root)


def require_directories(paths: Iterable[Path], *, what: str = "the compile cache", writable: bool = True,
                        link: bool = True) -> None:
    """Each of `paths` usable as a cache directory (created if absent; see
    files.directory_problem; `link=False`: not a symbolic link), else CacheUnusable (exit 2)
    naming the first that is not."""
    for path in paths:
        problem = directory_problem(path, writable=writable, link=link)
        if problem:
            raise CacheUnusable(unusable_message(path, problem, what))


def remote_store() -> RemoteStore | None:
    """The store TOPKGEN_CACHE_URL names, opened once per process; None when unset."""
    url = cache_url()
    if not url:
        return None
    if "://" not in url:
        raise CacheConfigError(f"TOPKGEN_CACHE_URL={url}: not a URL (s3://bucket/prefix, gs://, file:///path, "
                               f"memory://name)")
    directory = shared_cache_directory()
    if directory is not None and not directory.is_absolute():
        # file:// wrote ac/ and cas/ into the current directory, file://host/x into ./host/x
        scheme = url.split("://", 1)[0]
        raise CacheConfigError(f"TOPKGEN_CACHE_URL={url}: a {scheme}:// URL names an absolute path, with three "
                               f"slashes: {scheme}:///shared/dir")
    if directory is not None:
        for folder in ("ac", "cas"):  # written through, entries would land in the link's target, outside the store
            if os.path.islink(directory / folder):
                raise CacheConfigError(f"TOPKGEN_CACHE_URL={display_url(url)}: {directory / folder} is a symbolic "
                                       f"link (a folder inside a cache must be a real directory)")
        return LocalStore(directory, url)  # atomic create-if-absent with a hard link
    return _remote(url)


def remote_readonly() -> bool:
    return settings.flag("TOPKGEN_CACHE_READONLY")
