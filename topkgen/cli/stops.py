"""How a command that was stopped says so: a Ctrl-C (exit 130) or a SIGTERM (exit 143), in one
line on stderr. Both the entry point (launch.py, before the CLI is imported) and the CLI's own
handler (group.py) use it, so this module imports nothing but the standard library."""

from __future__ import annotations

import sys

EXIT_INTERRUPTED = 130  # 128 + SIGINT: what a shell reports for a command Ctrl-C ended
INTERRUPTED = "topkgen: interrupted"
EXIT_TERMINATED = 143  # 128 + SIGTERM
TERMINATED = "topkgen: terminated"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, so that every clean-up a Ctrl-C runs runs."""


def terminate(signum: int, frame: object) -> None:
    raise Terminated


def report_stop(err: KeyboardInterrupt) -> int:
    """Say on stderr, in one line, that a Ctrl-C or a SIGTERM ended the command, and return
    its exit status: the one place that does, for the CLI's handler (group._interruptions) and
    for a Ctrl-C that lands before it exists. stderr may be closed (2>&-: None) or a pipe
    nobody reads: the status still says it (the CLI's own line once became a BrokenPipeError
    there, and the exit 1 of a failed build)."""
    line, status = (TERMINATED, EXIT_TERMINATED) if isinstance(err, Terminated) else (INTERRUPTED, EXIT_INTERRUPTED)
    try:
        sys.stderr.write(("\n" if sys.stderr.isatty() else "") + line + "\n")
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        pass
    return status
