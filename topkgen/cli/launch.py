"""The `topkgen` command's entry point (and `python -m topkgen`'s).

It exists for the first tenth of a second: a Ctrl-C that lands while the CLI and its
libraries are still being imported comes before the CLI's own handler (`group._interruptions`),
and Python would print its traceback. So this module imports nothing heavy itself, and turns
such a Ctrl-C into the same one line and exit 130 as that handler does (`report_stop`).

It also makes SIGTERM (a cancelled CI job, `kill`, a container stopping) unwind as a Ctrl-C
does, rather than end the process where it stands: the staging directory of a bundle being
written, `run -o`'s temporary file and the locks are then removed on the way out, and the
command says so in one line, exit 143. And it ends the process at once when a command
stopped while NVRTC compiles were still under way (`_leave_abandoned_work`).
"""

from __future__ import annotations

import os
import signal
import sys

from topkgen.cli.stops import report_stop, terminate


def main() -> None:
    signal.signal(signal.SIGTERM, terminate)
    try:
        from topkgen.cli.app import main as cli

        cli(prog_name="topkgen")
    except KeyboardInterrupt as err:  # during the imports, before the CLI's handler exists
        raise SystemExit(report_stop(err)) from None
    except SystemExit as done:
        if done.code is None or isinstance(done.code, int):
            _leave_abandoned_work(done.code or 0)
        raise


def _leave_abandoned_work(status: int) -> None:
    """End the process now when a command stopped (a Ctrl-C, a failed compile) while NVRTC
    compiles were still under way in topkgen.build.workers' threads: everything of the command's
    own has been cleaned up by then, and the interpreter's exit, freeing what those threads
    still use, could crash the process (a SIGSEGV instead of exit 130)."""
    workers = sys.modules.get("topkgen.build.workers")  # none ran unless it was imported
    if workers is None or not workers.busy():
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(status)
