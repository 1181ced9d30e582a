"""Where topkgen writes into the user's tree: checked before any work is done, so nothing
is compiled or run only to fail at the end, and nothing of the user's is replaced unless
they asked for it.

`topkgen build --out DIR` (and `merge --out DIR`) replaces DIR only when DIR is missing, empty
or a topkgen bundle (or with --force). Some directories are never replaced, --force or not,
because losing them cannot be what the user meant (`protected`): the current directory and
its parents, a file system's root, the home directory, a git repository, the compile caches
(local and a file:// shared one) and the command's own inputs; nor does --force reach a top-level directory of the file
system or a tree holding a git repository (`_forced_too_far`). `topkgen run -o FILE`
replaces FILE only when it is the output of an earlier run (or with --force), and never a
device, FIFO or socket, an input, or a file inside the bundle it reads. Writers of one
destination serialise on a lock file beside it (`locked`), which its holder removes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import tempfile
import zipfile
from pathlib import Path
from typing import Iterable, Iterator

from topkgen.common.errors import InputError
from topkgen.common.files import file_kind, open_lock
from topkgen.common.paths import cache_root, shared_cache_directory
from topkgen.common.reader import ReadError, printable, read_json

_ARCH_DIR = re.compile(r"sm_[0-9]{2,3}a?")
RUN_OUTPUT_MEMBERS = ["indices.npy", "values.npy"]


class DestinationError(InputError, ValueError):
    """A destination topkgen must not or cannot write; the message says which and why."""


def _show(path: Path) -> str:
    return printable(os.fspath(path))


def _resolve(path: Path) -> Path:
    """`path.resolve()`, with a symbolic-link loop raised as the OSError (ELOOP) every other
    unusable path is, as Python 3.13 does, not as 3.11's RuntimeError (an internal error)."""
    try:
        return path.resolve()
    except RuntimeError:
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), os.fspath(path)) from None


def check_bundle_destination(out: Path, *, force: bool = False, inputs: Iterable[Path] = ()) -> None:
    """Refuse a bundle destination that would lose the user's files or cannot be written.
    `inputs` are the files and directories the command reads (its policy, merge's parts):
    the destination may not be, hold or lie inside any of them, even with `force`."""
    try:
        _check_bundle_destination(Path(out), force, tuple(Path(i) for i in inputs))
    except OSError as err:  # a directory on the way that cannot be read
        raise DestinationError(f"--out {_show(Path(out))}: {err.strerror} ({_show(Path(err.filename or out))})") from None


def _check_bundle_destination(out: Path, force: bool, inputs: tuple[Path, ...]) -> None:
    if out.is_symlink():
        raise DestinationError(f"--out {_show(out)}: is a symbolic link; name the directory itself")
    reason = protected(out, inputs)
    if reason is not None:
        raise DestinationError(f"--out {_show(out)}: {reason}; the --out directory is replaced as a whole, "
                               f"--force or not, so name a new directory or an earlier bundle")
    if out.exists() or os.path.lexists(out):
        if not out.is_dir():
            raise DestinationError(f"--out {_show(out)}: exists and is not a directory")
        problem = foreign_content(out)
        if problem is not None and not force:
            raise DestinationError(f"--out {_show(out)}: exists, is not empty and is not a topkgen bundle "
                                   f"({problem}); pass --force to replace it, or choose another directory")
        reason = _forced_too_far(out) if problem is not None else None
        if reason is not None:
            raise DestinationError(f"--out {_show(out)}: {reason}; --force replaces the whole directory, "
                                   f"so name a new directory or an earlier bundle")
    _check_writable(_resolve(out).parent, f"--out {_show(out)}")


def protected(out: Path, inputs: tuple[Path, ...] = ()) -> str | None:
    """Why `out` must never be replaced, even with --force (None when it may be): a build
    swaps the whole directory for the bundle, and for these that loses what the user cannot
    have meant to give up: the current directory or a parent (where the user works), a file
    system's root or the home directory (everything), a git repository (its history), the
    compile caches, local and shared (the build's own stores) or the command's inputs (what it reads)."""
    resolved = _resolve(out)
    cwd = _resolve(Path.cwd())
    if resolved == cwd or resolved in cwd.parents:
        return "is the current directory or one of its parents"
    if resolved == Path(resolved.anchor) or os.path.ismount(resolved):
        return "is the root of a file system (a mount point: name a directory inside it)"
    with contextlib.suppress(RuntimeError, KeyError, OSError):  # no HOME, no passwd entry, a loop: nothing to protect
        home = _resolve(Path.home())
        if resolved == home or resolved in home.parents:
            return f"{'is' if resolved == home else 'holds'} the home directory {_show(home)}"
    for source in inputs:
        relation = _relation_to(resolved, source)
        if relation:
            return f"{relation} the input {_show(source)}"
    relation = _relation_to(resolved, cache_root())
    if relation:
        return f"{relation} the compile cache {_show(cache_root())} (TOPKGEN_CACHE_DIR)"
    shared = shared_cache_directory()
    relation = shared and _relation_to(resolved, shared)
    if relation:
        return f"{relation} the shared compile cache {_show(shared)} (TOPKGEN_CACHE_URL)"
    if os.path.lexists(resolved / ".git"):
        return "is a git repository (it holds .git)"
    return None


def _relation_to(out: Path, other: Path) -> str | None:
    """`_relation` of `out` to the path `other` resolved; None when `other` cannot be (a
    symbolic-link loop): nothing there can be lost, and its reader names the problem."""
    try:
        return _relation(out, _resolve(other))
    except OSError:
        return None


def _relation(out: Path, other: Path) -> str | None:
    """How the directory `out` stands to the path `other`: 'is', 'holds', 'lies inside', or None."""
    if out == other:
        return "is"
    if out in other.parents:
        return "holds"
    if other in out.parents:
        return "lies inside"
    return None


def _forced_too_far(out: Path) -> str | None:
    """Why --force must not replace `out`, a directory with files that are not a bundle's
    (None when it may): a top-level directory of the file system (/usr, /home, /etc: the
    system's, or other users'; an empty one, or a bundle, such as a container's /out, is
    still fine), or one that holds a git repository (history that exists nowhere else)."""
    resolved = _resolve(out)
    if resolved.parent == Path(resolved.anchor):
        return "is a top-level directory of the file system"
    for top, dirs, files in os.walk(out):
        if ".git" in dirs or ".git" in files:  # a submodule or worktree has a .git file
            return f"holds a git repository ({_show(Path(top).relative_to(out) / '.git')})"
        dirs.sort()
    return None


def foreign_content(out: Path) -> str | None:
    """What in an existing directory is not part of a topkgen bundle (None when nothing is):
    a bundle holds manifest.json, written by topkgen, <arch>/<kernel>.cubin and
    jit/<arch>/<kernel>.cu files only."""
    entries = sorted(out.iterdir())
    if not entries:
        return None
    names = {e.name for e in entries}
    if "manifest.json" not in names:
        return f"no manifest.json, and it holds {_show(entries[0].relative_to(out))}"
    for entry in entries:
        rel = entry.relative_to(out)
        if entry.name == "manifest.json":
            if entry.is_symlink() or not entry.is_file():
                return f"{rel} is not a file"
            continue
        if entry.is_symlink() or not entry.is_dir():
            return f"it holds {_show(rel)}"
        if entry.name == "jit":
            for arch_dir in entry.iterdir():
                if arch_dir.is_symlink() or not arch_dir.is_dir() or not _ARCH_DIR.fullmatch(arch_dir.name):
                    return f"it holds {_show(arch_dir.relative_to(out))}"
                problem = _foreign_file(out, arch_dir, ".cu")
                if problem:
                    return problem
            continue
        if not _ARCH_DIR.fullmatch(entry.name):
            return f"it holds {_show(rel)}"
        problem = _foreign_file(out, entry, ".cubin")
        if problem:
            return problem
    try:
        manifest = read_json(out / "manifest.json", limit=64 << 20, what="manifest")
    except ReadError as err:
        return f"its manifest.json cannot be read: {err.message}"
    generator = manifest.get("generator") if isinstance(manifest, dict) else None
    if not isinstance(generator, dict) or generator.get("name") != "topkgen":
        return "its manifest.json was not written by topkgen"
    return None


def _foreign_file(out: Path, directory: Path, suffix: str) -> str | None:
    for item in directory.iterdir():
        if item.is_symlink() or not item.is_file() or item.suffix != suffix:
            return f"it holds {_show(item.relative_to(out))}"
    return None


def check_output_file(path: Path, *, force: bool = False, inputs: tuple[Path, ...] = ()) -> None:
    """Refuse an output file that would replace the user's data, or that cannot be written."""
    try:
        _check_output_file(Path(path), force, inputs)
    except OSError as err:
        raise DestinationError(f"-o {_show(Path(path))}: {err.strerror}") from None


def _check_output_file(path: Path, force: bool, inputs: tuple[Path, ...]) -> None:
    """The output is written beside `path` and renamed over it: whatever is there is gone,
    so --force may replace a regular file (or a link) only, never a device, FIFO or socket
    (`-o /dev/null --force` as root deleted /dev/null), an input, or a file inside an input
    directory (the bundle being read)."""
    label = f"-o {_show(path)}"
    if path.is_dir():
        raise DestinationError(f"{label}: is a directory")
    parent = path.parent
    if not parent.is_dir():
        raise DestinationError(f"{label}: {_show(parent)} is not an existing directory")
    for follow in (False, True):  # the name, then what a link there points to (-o /dev/stdout)
        try:
            mode = os.stat(path, follow_symlinks=follow).st_mode
        except OSError:  # nothing there, or a dangling link
            break
        if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            raise DestinationError(f"{label}: {'points to' if follow else 'is'} {file_kind(mode)}, not a regular "
                                   f"file, and -o replaces regular files only, --force or not")
    resolved = _resolve(path.parent) / path.name  # the name is replaced, not what a link there points to
    for source in inputs:
        with contextlib.suppress(OSError):
            if source.is_dir() and _resolve(source) in resolved.parents:
                raise DestinationError(f"{label}: lies inside the input {_show(source)}")
            if path.exists() and os.path.samefile(path, source):
                raise DestinationError(f"{label}: is the input file {_show(source)}")
    if path.exists() and not force:
        if path.is_symlink() or not path.is_file() or not _is_run_output(path):
            raise DestinationError(f"{label}: exists and is not the output of an earlier topkgen run "
                                   f"(an .npz with values and indices); pass --force to replace it")
    _check_writable(parent, label)


def _is_run_output(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as archive:
            return sorted(archive.namelist()) == RUN_OUTPUT_MEMBERS
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


def _check_writable(directory: Path, label: str) -> None:
    """Create and remove a directory in the nearest existing ancestor: the only sure test
    (permissions, read-only mounts, root, ACLs) that a build or run can write there."""
    probe = directory
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise DestinationError(f"{label}: {_show(probe)} is not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".topkgen-probe-", dir=probe))
    except OSError as err:
        raise DestinationError(f"{label}: cannot write in {_show(probe)}: {err.strerror}") from None


@contextlib.contextmanager
def locked(destination: Path) -> Iterator[None]:
    """Serialise the writers of one destination, whatever compile cache each uses: an
    exclusive flock on `.<name>.lock` beside it (the same directory, so every process and
    user that can write the destination shares it; a lock keyed in the cache serialised
    only builds that shared a cache). A second writer waits for the first, then checks the
    destination again and swaps its own complete bundle in. The holder removes the file on
    the way out, so nothing is left beside the destination unless a SIGKILL ended the holder
    (an empty file then, which the next writer takes and removes). A FIFO or symlink planted
    there is refused, not waited on."""
    destination = Path(destination)
    lock = destination.parent / f".{destination.name}.lock"
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        fd = _hold(lock)
    except OSError as err:
        raise DestinationError(f"--out {_show(destination)}: cannot lock {_show(lock)}: {err.strerror}") from None
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_size == 0:  # only ever an empty lock file, never a file of the user's
                os.unlink(lock)  # still held: a writer waiting on it finds it gone and opens a new one
        os.close(fd)  # releases the flock


def _hold(lock: Path) -> int:
    """A descriptor of `lock` holding its flock, once the name still names the file locked:
    a holder removes it before releasing it, so a waiter may wake on a file that is gone."""
    while True:
        fd = open_lock(lock)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            held, named = os.fstat(fd), os.lstat(lock)
        except FileNotFoundError:
            os.close(fd)
            continue
        except BaseException:  # a Ctrl-C while waiting, too
            os.close(fd)
            raise
        if (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino):
            return fd
        os.close(fd)
