"""Files read from a repository's working tree for `diff`, held to what a revision's are
(topkgen.build.sources.GitRepo.read): regular files only, and no symbolic link on the way from the
repository's top, so that a policy linked to a file outside the repository (a secret) is
refused by name, never read, and a FIFO is refused, never waited on."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from topkgen.common.files import file_kind, read_regular


class WorktreeFileError(OSError):
    """A working-tree file diff does not read: the message names it and says why, never
    what it holds."""


def read_worktree_file(root: Path, rel: str, limit: int, label: str) -> bytes:
    """The bytes of `root`/`rel`, a regular file reached through no symbolic link below
    `root`, of at most `limit` bytes; WorktreeFileError (naming `label`) otherwise."""
    path = root
    parts = Path(rel).parts
    for i, part in enumerate(parts):
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            raise WorktreeFileError(errno.ENOENT, f"{label}: no such file in the working tree") from None
        except OSError as err:
            raise WorktreeFileError(err.errno, f"{label}: cannot read it: {err.strerror}") from None
        if stat.S_ISLNK(mode):
            target = os.readlink(path)
            what = "a symbolic link" if i == len(parts) - 1 else f"under the symbolic link {Path(*parts[:i + 1])}"
            raise WorktreeFileError(errno.ELOOP, f"{label}: {what} in the working tree (to {target}); diff reads "
                                                 f"a working tree's regular files only, as a revision's")
        if i < len(parts) - 1 and not stat.S_ISDIR(mode):
            raise WorktreeFileError(errno.ENOTDIR, f"{label}: {Path(*parts[:i + 1])} is not a directory")
    if not stat.S_ISREG(mode):
        raise WorktreeFileError(errno.EINVAL, f"{label}: not a regular file but {file_kind(mode)}; diff reads "
                                              f"regular files only")
    try:
        return read_regular(path, limit)
    except OSError as err:
        if err.errno == errno.EFBIG:
            raise WorktreeFileError(err.errno, f"{label}: the policy is larger than {limit} bytes") from None
        raise WorktreeFileError(err.errno, f"{label}: cannot read it: {err.strerror}") from None
