"""The `topkgen` command group: the one handler every command runs in, its exit statuses,
--version and --color. The commands register on `main` from their own modules (app.py
imports them all)."""

from __future__ import annotations

import contextlib
import os
import traceback
from typing import Any, Iterator

import click

from topkgen.cli import console, standard_output
from topkgen.common import errors, settings, suggest
from topkgen.cli.stops import report_stop  # also says it of a Ctrl-C during the imports
from topkgen.common.reader import printable

EXIT_INPUT = 2
EXIT_INTERNAL = 70  # EX_SOFTWARE
_FULL = errors.DISK_FULL
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for `cat file | head -1`'s cat
# `topkgen --help` lists the commands in the order of a first session, then the rest.
WORKFLOW = ("plan", "explain", "map", "build", "show", "diff", "run", "merge", "cache")

MAIN_EPILOG = """\b
Examples:
  topkgen plan                     the kernels the packaged policy builds
  topkgen explain --arch sm_90 --dtype bf16 --k 64 --n 4096
  topkgen map --arch sm_90         which kernel serves each (k, n)
  topkgen build --out out          compile them into the bundle out/
  topkgen show out --dispatch      what the bundle holds
  topkgen diff HEAD~1              what the last commit changed
  topkgen run --bundle out --backend emulator --arch sm_90 --k 8 x.npy

\b
Exit status:
  0   success
  1   a build failed; for diff: the two sides differ
  2   bad usage or input (one line naming the file, key or argument)
  70  an internal error: a bug in topkgen (TOPKGEN_DEBUG=1 shows where)
  130 interrupted (Ctrl-C)
  141 the output's reader left early (topkgen plan | head -1)
  143 terminated (SIGTERM: a cancelled CI job); nothing half-written is left

\b
Environment:
  TOPKGEN_CACHE_DIR       compile caches (default ~/.cache/topkgen)
  TOPKGEN_CACHE_URL       a shared compile cache: s3://, gs://, file://...
  TOPKGEN_CACHE_READONLY  1: read TOPKGEN_CACHE_URL, never write it
  TOPKGEN_CACHE_PINS      a build --provenance FILE: the remote serves its cubins only
  TOPKGEN_DISABLE_JIT     1: run serves AOT kernels only
  TOPKGEN_CUDA_INCLUDE    CUDA headers, if not from the nvidia-cuda-* wheels
  TOPKGEN_DEBUG           1: print the traceback of an internal error
  NO_COLOR                no colour (--color always still colours)
  On/off ones (the 1: above) take 1, true, yes, on or 0, false, no, off, in
  any case, or empty; any other value is refused (exit 2).

\b
Shell completion (bash; for zsh or fish: zsh_source, fish_source):
  eval "$(_TOPKGEN_COMPLETE=bash_source topkgen)"
"""


class InputError(click.ClickException):
    """Bad input: printed as one line, exit status 2."""

    exit_code = EXIT_INPUT

    def show(self, file: Any = None) -> None:
        console.error(printable(self.format_message()))


def usage_line(err: click.UsageError) -> InputError:
    """click's usage error (a bad range, a missing option, an unknown command) as topkgen's
    one line, naming the command and the argument: click printed four lines ("Usage: ...",
    "Try ...", a blank, "Error: ..."), unlike every other input error."""
    words = err.ctx.command_path.split(" ")[1:] if err.ctx is not None else []  # the subcommand(s)
    command = " ".join(words) + ": " if words else ""
    return InputError(command + " ".join(err.format_message().split()).rstrip("."))


class _Group(click.Group):
    """A command group that suggests the command a mistyped name meant."""

    def resolve_command(self, ctx: click.Context, args: list[str]) -> Any:
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as err:
            typed = args[0] if args else ""
            hint = suggest.closest(typed, self.list_commands(ctx))
            if hint and "No such command" in err.message:
                err.message = f"No such command '{typed}'. Did you mean '{hint}'?"
            raise


class _Main(_Group):
    """Every command runs inside one handler, so no traceback reaches a user: input errors
    (topkgen.common.errors.InputError) exit 2 with one line; anything else is a bug in topkgen and
    exits 70 with one line (and the traceback when TOPKGEN_DEBUG=1). Ctrl-C and a reader
    that left are neither (see `_interruptions`)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [n for n in WORKFLOW if n in self.commands] + sorted(set(self.commands) - set(WORKFLOW))

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            with _interruptions():  # --version and --color run here, before invoke
                return super().make_context(*args, **kwargs)
        except click.UsageError as err:
            raise usage_line(err) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with _interruptions():
                settings.check_flags()
                return super().invoke(ctx)
        except click.UsageError as err:  # the command's own arguments: parsed here
            raise usage_line(err) from None
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort, SystemExit):
            raise
        except errors.InputError as err:
            raise InputError(str(err)) from None
        except MemoryError as err:  # the machine's memory, not a bug: numpy's words say how much
            raise InputError(f"out of memory: {err}" if str(err) else "out of memory") from None
        except Exception as err:  # noqa: BLE001 - the one place that catches everything
            return self._internal_error(ctx, err)

    @staticmethod
    def _internal_error(ctx: click.Context, err: Exception) -> Any:
        """A bug: one line, and the traceback with TOPKGEN_DEBUG=1 (called while handling `err`)."""
        if settings.flag("TOPKGEN_DEBUG"):  # check_flags accepted it in invoke
            traceback.print_exc()
        detail = printable(f"{type(err).__name__}: {err}")
        console.echo(f"{click.style('topkgen: internal error:', fg='red', bold=True)} {detail[:500]}; "
                     f"set TOPKGEN_DEBUG=1 for the traceback", err=True)
        ctx.exit(EXIT_INTERNAL)


@contextlib.contextmanager
def _interruptions() -> Iterator[None]:
    """Ctrl-C and a closed stdout end a command with statuses of their own, never 1 (click's
    "Aborted!" and its broken-pipe exit were 1, which for diff reads as "the sides differ").
    Ctrl-C: one line on stderr, exit 130 (SIGTERM: 143). A reader of stdout that left (`topkgen plan |
    head -1`): nothing printed, exit 141, the status a shell reports for any program SIGPIPE
    ends (cat, diff(1)); not 0, since the output was not all delivered and for diff 0 means
    "the same". stdout is pointed at /dev/null so that the interpreter's last flush cannot
    complain either. A full disk (--help and --version included) is one line, exit 2, as is
    output to a closed stdout (`>&-`), which Python would drop without a word."""
    standard_output.take_over()
    try:
        yield
    except KeyboardInterrupt as err:  # a SIGTERM too (stops.Terminated)
        raise click.exceptions.Exit(report_stop(err)) from None
    except BrokenPipeError:
        standard_output.silence()
        raise click.exceptions.Exit(EXIT_BROKEN_PIPE) from None
    except OSError as err:
        if isinstance(err, standard_output.Closed):
            raise InputError("cannot write the output: standard output is closed") from None
        if err.errno not in _FULL:
            raise
        # A full disk: the environment, not a bug. When it is stdout's, stdout goes to
        # /dev/null so that the interpreter's last flush does not fail again.
        if err.filename is None:
            standard_output.silence()
        where = printable(os.fsdecode(err.filename)) if err.filename is not None else "the output"
        raise InputError(f"cannot write {where}: {err.strerror}") from None


def version_text() -> str:
    """topkgen's version and those of the CUDA parts it compiles and launches with."""
    import platform
    from importlib import metadata

    from topkgen import __version__

    def dist(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    try:
        from topkgen.build.compile import nvrtc_version

        nvrtc = f"NVRTC {nvrtc_version()} (nvidia-cuda-nvrtc {dist('nvidia-cuda-nvrtc')})"
    except Exception as err:  # noqa: BLE001 - no libnvrtc: say so, --version still answers
        nvrtc = f"NVRTC not usable here: {printable(str(err))[:200]}"
    return "\n".join((f"topkgen {__version__}", nvrtc,
                      f"cuda-core {dist('cuda-core')}, cuda-bindings {dist('cuda-bindings')}",
                      f"Python {platform.python_version()}"))


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(version_text())
        ctx.exit()


def _set_color(ctx: click.Context, _param: click.Parameter, value: str) -> None:
    console.set_color(value)
    ctx.color = {"always": True, "never": False}.get(value)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]}, epilog=MAIN_EPILOG)
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Print the versions of topkgen, NVRTC and cuda-core, and exit.")
@click.option("--color", type=click.Choice(console.COLOR_CHOICES), default="auto", show_default=True,
              expose_value=False, is_eager=True, callback=_set_color,
              help="Colour errors, warnings and diff markers: auto = on a terminal, unless NO_COLOR is set.")
def main() -> None:
    """Plan, explain, map, build, show, diff and run GPU top-k kernels, all decided by one YAML
    policy (the packaged default, or --policy FILE).

    Run a command with -h for its options. Also `python -m topkgen`."""
