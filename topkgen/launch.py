"""The `topkgen` command's entry point (and `python -m topkgen`'s).

It exists for the first tenth of a second: a Ctrl-C that lands while the CLI and its
libraries are still being imported comes before the CLI's own handler (`cli._interruptions`),
and Python would print its traceback. So this module imports nothing heavy itself, and turns
such a Ctrl-C into the CLI's one line and exit 130.
"""

from __future__ import annotations

import sys

EXIT_INTERRUPTED = 130  # 128 + SIGINT: what a shell reports for a command Ctrl-C ended
INTERRUPTED = "topkgen: interrupted"


def main() -> None:
    try:
        from topkgen.cli import main as cli

        cli(prog_name="topkgen")
    except KeyboardInterrupt:
        try:  # stderr may be closed (2>&-: None) or a pipe nobody reads: the status still says it
            sys.stderr.write(("\n" if sys.stderr.isatty() else "") + INTERRUPTED + "\n")
        except (AttributeError, OSError, ValueError):
            pass
        raise SystemExit(EXIT_INTERRUPTED) from None
