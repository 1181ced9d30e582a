"""Command-line interface: argument parsing, formatting and exit codes only.

Modules: launch (the entry point), stops (Ctrl-C and SIGTERM), group (the command group and
its one error handler), options (shared argument types), one module per command or group of
commands (plan_commands, build_commands, show_command, diff_command, run_command), app (all of
them registered), console and standard_output (terminal output), npyfile (.npy input).

Exit status: 0 success, 1 a failed build or "the sides differ" (diff), 2 usage or input
errors (for diff, any trouble), 70 an internal error (a bug: one line, and the traceback with
TOPKGEN_DEBUG=1), 130 interrupted (Ctrl-C), 141 the reader of stdout left (`| head`), 143
terminated (SIGTERM).
Heavy modules (NVRTC, numpy, the emulator) are imported inside the commands that need them,
so `topkgen plan` stays fast.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """`from topkgen.cli import main` (the click group with every command) stays as it was,
    while importing topkgen.cli.launch, the entry point, imports nothing heavy: a Ctrl-C during
    the CLI's imports must find launch's handler in place."""
    if name == "main":
        from topkgen.cli.app import main

        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
