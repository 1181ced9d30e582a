"""The one base class of errors caused by what a user gave topkgen (a file, an argument).

The CLI's top-level handler prints such an error as one line and exits 2; any other
exception is a bug in topkgen and exits 70. Each module keeps its own error class (with
its own base, so callers that catch it keep working) and adds this one.
"""

from __future__ import annotations

import errno

# A write the file system refused for want of room: the environment, never a bug in topkgen.
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class InputError(Exception):
    """Bad input: the message names the file, line, key or argument and says what is wrong."""


class DiskFull(InputError):
    """A write refused for want of room (DISK_FULL): one line naming the path, exit 2."""


class OutOfMemory(InputError):
    """An allocation the machine refused (the emulator's arrays live in host memory): one
    line saying how much, exit 2; not a bug in topkgen."""
