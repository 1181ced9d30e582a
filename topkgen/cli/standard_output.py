"""The process's standard output as topkgen's commands need it, so that the CLI can tell
what became of their output: all of it written, its reader gone (BrokenPipeError), or no
stdout at all (`Closed`). cli._interruptions turns each into its exit status.

Why not Python's own: CPython's buffered stdout drops, without an error, the rest of a
write a pipe took only part of because its reader left (`topkgen show --format json |
head -c 10` exited 0 after the first 64 KiB), and with file descriptor 1 closed it leaves
sys.stdout None, and click then drops every line.
"""

from __future__ import annotations

import errno
import io
import os
import sys
from typing import Any


class Closed(OSError):
    """A write to the closed standard output (not any EBADF: another descriptor's is a bug)."""


def take_over() -> None:
    """Replace sys.stdout: when fd 1 is closed, with a stream whose writes fail; else with
    one that writes to the last byte. Nothing changes for a stream already replaced, ours
    or a test runner's."""
    if sys.stdout is None:
        sys.stdout = _ClosedStdout()
        return
    if sys.stdout is not sys.__stdout__:
        return
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    sys.stdout.flush()
    unbuffered = sys.__stdout__.write_through  # python -u: nothing held back, as before
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(_WholeWrites(fd), buffer_size=1 if unbuffered else 8192),
                                  encoding=sys.__stdout__.encoding, errors=sys.__stdout__.errors,
                                  line_buffering=sys.__stdout__.line_buffering, write_through=unbuffered)


def report_only() -> None:
    """Called by the commands whose product is files (build, merge, cache import, run -o):
    what they print is a report, and with stdout closed it goes nowhere rather than failing
    a command whose work is done, or stopping one before it."""
    if isinstance(sys.stdout, _ClosedStdout):
        sys.stdout.report_only = True


def silence() -> None:
    """stdout to /dev/null: the interpreter's last flush of what could not be written then
    fails no more (a closed one has nothing to flush)."""
    if isinstance(sys.stdout, _ClosedStdout):
        return
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


class _WholeWrites(io.RawIOBase):
    """A file descriptor written to the last byte, or an OSError (BrokenPipeError when the
    reader left): what the caller of write() assumes, and a pipe does not always give."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data: Any) -> int:
        view = whole = memoryview(data).cast("B")
        while view:
            view = view[os.write(self._fd, view):]
        return len(whole)


class _ClosedStdout(io.TextIOBase):
    """sys.stdout when file descriptor 1 is closed: for a command whose product is its
    output (plan, show, diff...), writing fails, so that it says the product was lost; a
    command that prints nothing (diff -q) is fine, and one whose product is files only
    reports on stdout (`report_only`)."""

    def __init__(self) -> None:
        super().__init__()
        self.report_only = False

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if text and not self.report_only:
            raise Closed(errno.EBADF, "standard output is closed")
        return len(text)
