"""How topkgen reads and writes files, in its caches and beside the user's: reads bounded
and only of regular files, writes atomic, and nothing a killed writer was writing left
behind for good."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import stat
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def temporary_beside(path: Path, data: bytes) -> Iterator[Path]:
    """`data` in a synced temporary file beside `path` (the same file system, so it can be
    renamed or linked into place); removed on exit if it is still there. Its name holds
    this process's pid and it is `claim`ed while in use, so that once a SIGKILL has left it
    behind, `remove_abandoned_temporaries` can tell it from a live writer's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    # O_EXCL|O_NOFOLLOW: a name planted there beforehand (a symlink, a FIFO) is an error, never written through
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    try:
        with contextlib.suppress(OSError):  # no flock on this file system: then no later write removes it
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with open(fd, "wb", closefd=False) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Write to a temporary file beside `path`, then rename it into place; first remove the
    temporaries that killed writes of `path` left beside it."""
    remove_abandoned_temporaries(path)
    with temporary_beside(path, data) as tmp:
        os.replace(tmp, path)


def remove_abandoned_temporaries(path: Path) -> None:
    """Remove the `temporary_beside` files of `path` that writers killed mid-write left."""
    remove_abandoned(path.parent, re.escape(f".{path.name}.") + r"([0-9]+)\.[0-9a-f]{8}\.tmp")


def claim(path: Path) -> int | None:
    """An open descriptor of the file or directory `path` holding an exclusive flock, which
    says "a live writer is using this" until the process ends, however it ends. None when it
    cannot be had: gone, neither a regular file nor a directory (a symlink is never
    followed, nor anything else opened), held by a live writer, or a file system without flock."""
    try:
        if stat.S_IFMT(os.lstat(path).st_mode) not in (stat.S_IFREG, stat.S_IFDIR):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def remove_abandoned(directory: Path, pattern: str) -> None:
    """Remove the files and directories in `directory` whose whole name `pattern` matches
    (its first group: the pid of the process that wrote them) that writers killed mid-write
    (SIGKILL, a power cut) left, which nothing else would ever remove. One is abandoned when
    the process its name holds is gone and no process holds its flock (`claim`): a
    concurrent writer's, in another pid namespace say, is never touched."""
    matcher = re.compile(pattern)
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        m = matcher.fullmatch(name)
        if m is None or process_exists(int(m.group(1))):
            continue
        path = directory / name
        fd = claim(path)
        if fd is None:
            continue
        try:
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        finally:
            os.close(fd)


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # none by that number (or none possible)
        return False
    except PermissionError:  # another user's
        pass
    return True


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of the regular file `path`, which must hold at most `limit` bytes.

    For files a hostile or damaged directory may hold (cache entries): the name is opened
    without following a symlink and without blocking, so a symlink to /dev/zero, a FIFO, a
    device or a directory in its place is an OSError, never a read without end or a hang.
    FileNotFoundError (or NotADirectoryError) when nothing is there; OSError(EFBIG) when it
    holds more than `limit` bytes (nothing beyond limit + 1 is read)."""
    _require_regular(os.lstat(path).st_mode, path)  # not even opened: opening a device can have effects
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        _require_regular(os.fstat(fd).st_mode, path)  # the file opened, whatever replaced the name since
        data = read_to_limit(fd, limit)
        if data is None:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(path))
        return data
    finally:
        os.close(fd)


def read_to_limit(fd: int, limit: int) -> bytes | None:
    """An open regular file's bytes, read no further than `limit`: None when it holds more
    (or grew past it while being read)."""
    if os.fstat(fd).st_size > limit:
        return None
    chunks, left = [], limit + 1
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return None if left <= 0 else b"".join(chunks)


_FILE_KINDS = {stat.S_IFREG: "a regular file", stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symbolic link",
               stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
               stat.S_IFSOCK: "a socket"}


def file_kind(mode: int) -> str:
    """What kind of file a stat mode is, for messages ("a FIFO")."""
    return _FILE_KINDS.get(stat.S_IFMT(mode), "of an unknown kind")


def open_lock(path: Path | str) -> int:
    """A descriptor, for flock, of the lock file `path`, created if absent: opened as
    read_regular opens, so a FIFO or a symlink planted there is an OSError, not a hang. One
    this user cannot write (another user's, made with umask 022) is opened for reading:
    flock needs no more, and its writers still serialise."""
    flags = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o666)
    except OSError as err:
        if err.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        try:
            fd = os.open(path, os.O_RDONLY | flags)
        except FileNotFoundError:
            raise err from None
    try:
        _require_regular(os.fstat(fd).st_mode, path)
    except OSError:
        os.close(fd)
        raise
    return fd


def _require_regular(mode: int, path: Path) -> None:
    if not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, f"not a regular file but {file_kind(mode)}", str(path))


def directory_problem(path: Path, *, writable: bool = True, link: bool = True) -> str | None:
    """Why `path` cannot serve as a cache directory (it is created if absent), or None: for
    a message that begins with the path ("/x is not a directory", "/x: Permission denied").
    `writable=False`: reading it is enough (a read-only cache still serves its hits).
    `link=False`: a folder inside a cache, which is never a symbolic link (entries written
    through one would land in its target, outside the cache)."""
    if not link and os.path.islink(path):
        return "is a symbolic link (a folder inside a cache must be a real directory)"
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        try:
            os.makedirs(path, exist_ok=True)
            return None
        except FileExistsError:  # a dangling symlink, or a file made meanwhile
            return "is not a directory"
        except OSError as err:
            return f"cannot be created: {err.strerror}"
    except OSError as err:  # ENOTDIR (a file above it), EACCES, ELOOP
        return err.strerror
    if not stat.S_ISDIR(mode):
        return "is not a directory"
    if not os.access(path, os.R_OK | os.X_OK):
        return "Permission denied"  # not readable and searchable by this user
    if writable and not os.access(path, os.W_OK):
        return "is on a read-only file system" if os.statvfs(path).f_flag & os.ST_RDONLY else "Permission denied"
    return None
