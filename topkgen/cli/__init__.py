"""Command-line interface: argument parsing, formatting and exit codes only.

Exit status: 0 success, 1 a failed build or "the sides differ" (diff), 2 usage or input
errors (for diff, any trouble), 70 an internal error (a bug: one line, and the traceback with
TOPKGEN_DEBUG=1), 130 interrupted (Ctrl-C), 141 the reader of stdout left (`| head`), 143
terminated (SIGTERM).
Heavy modules (NVRTC, numpy, the emulator) are imported inside the commands that need them,
so `topkgen plan` stays fast.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sys
import traceback
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import click
from click.shell_completion import CompletionItem

from topkgen.cli import console, standard_output
from topkgen.common import errors, settings, suggest
from topkgen import policy as pol
from topkgen.cli.launch import report_stop  # also says it of a Ctrl-C during the imports
from topkgen.common.reader import printable
from topkgen.policy.split import ROWS_MAX

EXIT_INPUT = 2
EXIT_INTERNAL = 70  # EX_SOFTWARE
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # a write the file system refused for want of room
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for `cat file | head -1`'s cat
PLAN_SCHEMA_VERSION = 2  # schemas/plan.schema.json
SHOW_SCHEMA_VERSION = 2  # schemas/show.schema.json
# `topkgen --help` lists the commands in the order of a first session, then the rest.
WORKFLOW = ("plan", "explain", "build", "show", "diff", "run", "merge", "cache")

MAIN_EPILOG = """\b
Examples:
  topkgen plan                     the kernels the packaged policy builds
  topkgen explain --arch sm_90 --dtype bf16 --k 64 --n 4096
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
        with _interruptions():  # --version and --color run here, before invoke
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with _interruptions():
                settings.check_flags()
                return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort, SystemExit):
            raise
        except errors.InputError as err:
            raise InputError(str(err)) from None
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
    except KeyboardInterrupt as err:  # a SIGTERM too (launch.Terminated)
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
    """Plan, explain, build, show, diff and run GPU top-k kernels, all decided by one YAML
    policy (the packaged default, or --policy FILE).

    Run a command with -h for its options. Also `python -m topkgen`."""


# ----------------------------------------------------------------------------- arguments

@lru_cache(maxsize=1)
def _default_archs() -> tuple[str, ...]:
    """The archs of the packaged default policy (help and completion list them)."""
    try:
        return tuple(pol.load(None).archs)
    except errors.InputError:
        return ()


class ArchType(click.ParamType):
    """An arch name; with `many`, comma-separated names too (`sm_90,sm_100`)."""

    name = "arch"

    def __init__(self, many: bool = False) -> None:
        self.many = many

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        if not self.many:
            return str(value).strip()
        names = [part.strip().lower() for part in str(value).split(",") if part.strip()]
        if not names:
            self.fail("an arch name is needed, e.g. sm_90", param, ctx)
        return tuple(names)

    def shell_complete(self, ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
        return [CompletionItem(a) for a in _default_archs() if a.startswith(incomplete)]


class DtypeType(click.ParamType):
    """A dtype name, with the short spellings fp32, bf16, fp16 (f32, f16, half) accepted."""

    name = "dtype"

    def __init__(self, choices: tuple[str, ...] = tuple(pol.DTYPE_SIZES)) -> None:
        self.choices = choices

    def get_metavar(self, param: click.Parameter) -> str:
        return f"[{'|'.join(self.choices)}]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        name = suggest.dtype(str(value))
        if name not in self.choices:
            self.fail(suggest.unknown_dtype(value, self.choices), param, ctx)
        return name

    def shell_complete(self, ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
        return [CompletionItem(d) for d in self.choices if d.startswith(incomplete)]


class _NotEmpty:
    """An argument that may not be empty: the OS reads "" as the current directory, so
    `--out ""` was refused as `--out .` and `--policy ""` as a directory, naming neither."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value == "":
            self.fail("must not be empty", param, ctx)  # type: ignore[attr-defined]
        return super().convert(value, param, ctx)  # type: ignore[misc]


class PathArg(_NotEmpty, click.Path):
    """A path that may not be empty."""


class BundleArg(PathArg):
    """A bundle to read (show, run --bundle, cache import, merge's parts): its directory, or
    its manifest.json, read as the directory holding it, as TopK and the C++ loader take
    either; click said "Directory 'out/manifest.json' is a file." Another file is refused
    naming what to give."""

    def __init__(self) -> None:
        super().__init__(file_okay=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        path = Path(value) if isinstance(value, str) and value else None
        if path is not None and _is_file(path):
            if path.name != "manifest.json":
                self.fail(f"{value} is a file: give the bundle directory (the one holding manifest.json)", param, ctx)
            value = str(path.parent)
        return super().convert(value, param, ctx)


def _is_file(path: Path) -> bool:
    """Whether `path` is a file; False where the OS cannot say (a name too long): the
    command then refuses it by name, as for any path."""
    try:
        return path.is_file()
    except OSError:
        return False


class OutputArg(PathArg):
    """Where a command writes (run's -o, build's and merge's --out). "-" means standard output
    to most tools, and a file or directory named "-" appeared in the current directory; what
    we write is binary or a directory, so "-" is refused with `refusal`, which names the ways
    to say either thing."""

    def __init__(self, refusal: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.refusal = refusal

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value == "-":
            self.fail(self.refusal, param, ctx)
        return super().convert(value, param, ctx)


_NPZ_OUT = OutputArg("run does not write to standard output: name a .npz file (-o top8.npz; a file called '-' "
                     "is -o ./-), or leave -o out to print the rows", dir_okay=False)


class BundleOutputArg(OutputArg):
    """build's and merge's --out: a bundle directory. A bundle's manifest.json given for it
    (as show and run take one) is refused naming the directory meant; click said only
    "Directory 'out/manifest.json' is a file"."""

    def __init__(self, command: str) -> None:
        super().__init__(f"{command} writes a bundle directory, not standard output: name a directory (--out bundle; "
                         "a directory called '-' is --out ./-)", file_okay=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        path = Path(value) if isinstance(value, str) and value else None
        if path is not None and path.name == "manifest.json" and _is_file(path):
            self.fail(f"{printable(value)} is a file: --out names the bundle's directory "
                      f"({printable(str(path.parent))})", param, ctx)
        return super().convert(value, param, ctx)


class Count(click.IntRange):
    """A whole number in range, in ASCII digits: int() also reads '١٠٠' (Arabic digits) as
    100, and click called '1e3' "not a valid integer range"."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            try:
                if not value.isascii():
                    raise ValueError(value)
                value = int(value)
            except ValueError:
                self.fail(f"{printable(repr(value))} is not a whole number (digits 0-9)", param, ctx)
        return super().convert(value, param, ctx)


class TextArg(_NotEmpty, click.types.StringParamType):
    """A word that may not be empty: diff's OLD and NEW (a path or a git revision)."""


class _ArchHelpOption(click.Option):
    """An --arch option whose help lists the packaged default policy's archs, read only
    when the help is shown (so no command pays for it)."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        archs = ", ".join(_default_archs()) or "see topkgen plan"
        self.help = (self.help or "").replace("{archs}", archs)
        return super().get_help_record(ctx)


def _flatten(_ctx: click.Context, _param: click.Parameter, value: tuple[tuple[str, ...], ...]) -> tuple[str, ...]:
    return tuple(arch for group in value for arch in group)


POLICY_OPTION = click.option("--policy", "policy_path", type=PathArg(dir_okay=False), metavar="FILE",
                             help="Policy YAML (default: the packaged default policy). README: 'Writing a policy'.")
ARCH_OPTION = click.option("--arch", "archs", cls=_ArchHelpOption, type=ArchType(many=True), multiple=True,
                           callback=_flatten, metavar="ARCH",
                           help="Architecture(s) of the policy ({archs} in the packaged default policy); repeat "
                                "or comma-separate them. Default: all of the policy's.")
DTYPE_HELP = "Element type: float32, bfloat16 or float16 (fp32, bf16, fp16 too)."
K_OPTION = click.option("--k", "k", type=Count(1, pol.K_MAX), required=True,
                        help="How many values per row.")
JOBS_HELP = (f"Kernels compiled in parallel. Default: the CPUs this process may use "
             f"({console.available_cpus()} here)")


def _policy_label(policy: pol.Policy) -> str:
    # The path as typed (display_path, for shipped output, may be shorter and alike for two files).
    return "the packaged default policy" if policy.is_packaged_default else f"the policy {printable(policy.path)}"


def _check_arch(policy: pol.Policy, arch: str) -> None:
    if "," in arch:
        raise InputError(f"--arch {arch}: takes one arch here (known: {', '.join(policy.archs)})")
    if arch not in policy.archs:
        raise InputError(f"--arch {arch}: not in {_policy_label(policy)} (known: {', '.join(policy.archs)})"
                         f"{suggest.did_you_mean(arch, policy.archs)}")


def _archs(policy: pol.Policy, requested: tuple[str, ...]) -> list[str]:
    for arch in requested:
        _check_arch(policy, arch)
    return list(dict.fromkeys(requested)) or list(policy.archs)


def _arch_counts(kernels: list[dict[str, Any]], archs: list[str]) -> dict[str, int]:
    return {arch: sum(1 for k in kernels if k["arch"] == arch) for arch in archs}


def _kernels_per_arch(kernels: list[dict[str, Any]], archs: list[str]) -> str:
    """`58 kernels (sm_90 29, sm_100 29)`: what plan, build and merge each end with."""
    per_arch = ", ".join(f"{arch} {n}" for arch, n in _arch_counts(kernels, archs).items())
    return f"{console.count(len(kernels), 'kernel')} ({per_arch})"


# ----------------------------------------------------------------------------- plan

def plan_document(policy: pol.Policy, archs: list[str]) -> dict[str, Any]:
    """The machine-readable plan (schemas/plan.schema.json)."""
    kernels = [spec.record() for arch in archs for spec in pol.plan(policy, arch)]
    return {
        "format": "topkgen-plan", "schema_version": PLAN_SCHEMA_VERSION,
        "policy": policy.reference(),
        "archs": archs,
        "kernels": kernels,
        "jit_only": [pol.rule_record(r) for r in policy.jit_only_rules(archs)],
        "totals": {"per_arch": _arch_counts(kernels, archs), "all": len(kernels)},
    }


@main.command(short_help="List the kernels a policy builds, per arch.")
@POLICY_OPTION
@ARCH_OPTION
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="json: schemas/plan.schema.json.")
def plan(policy_path: str | None, archs: tuple[str, ...], fmt: str) -> None:
    """List the AOT kernel set per architecture, and the JIT-only tiers with their reasons."""
    policy = pol.load(policy_path)
    doc = plan_document(policy, _archs(policy, archs))
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2))
        return
    where = "the packaged default policy" if policy.is_packaged_default else printable(policy.path)
    click.echo(f"policy: {where} ({policy.name}, sha256 {policy.sha256[:12]})")
    header = ("kernel", "family", "dtype", "K", "N window", "mode", "work rung", "threads", "CTAs/SM")
    for arch in doc["archs"]:
        rows = [(k["name"], k["family"], k["dtype"], str(k["k"]), _window(k["n_window"]), k["mode"],
                 k["work_rung"], str(k["launch"]["threads_per_block"]), str(k["launch"]["min_ctas_per_sm"]))
                for k in doc["kernels"] if k["arch"] == arch]
        click.echo(f"\n{arch}: {console.count(len(rows), 'kernel')}")
        click.echo(_table(header, rows))
    click.echo(f"\ntotal: {_kernels_per_arch(doc['kernels'], doc['archs'])}")
    click.echo("\nJIT-only tiers (never in the bundle):")
    if not doc["jit_only"]:
        click.echo("  none")
    for tier in doc["jit_only"]:
        click.echo(f"  {tier['rule']}: {tier['family']} K={'/'.join(map(str, tier['k']))} "
                   f"N{_tier_n(tier['n'])} on {', '.join(tier['archs'])}\n    reason: {tier['reason']}")
    if policy.jit_dtypes:
        click.echo(f"\nJIT-only dtypes: {', '.join(policy.jit_dtypes)} (served by JIT from the same rules)")


def _window(window: dict[str, int]) -> str:
    lo, hi = window["min"], window["max"]
    return f"={lo}" if lo == hi else f"{lo}..{'2^31-1' if hi == pol.N_MAX else hi}"


def _tier_n(n: dict[str, Any]) -> str:
    if "exact" in n:
        return "=" + "/".join(map(str, n["exact"]))
    if "ladder" in n:
        return " ladder " + "/".join(map(str, n["ladder"]))
    if "vector_iterations" in n:
        return f" up to {n['vector_iterations']} vectors per thread"
    return " " + _window(n)


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  " + "  ".join(c.ljust(w) for c, w in zip(header, widths)).rstrip()]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- explain

@main.command("explain", short_help="Say which kernel serves a shape, and why.", epilog="""\b
Examples:
  topkgen explain --arch sm_90 --dtype float32 --k 16 --n 2048
  topkgen explain --arch sm_90 --dtype float32 --k 256 --n 131072 --rows 1
  topkgen explain --arch sm_100 --dtype bf16 --k 300 --n 100000 --deterministic --format json""")
@POLICY_OPTION
@click.option("--arch", cls=_ArchHelpOption, type=ArchType(), required=True, metavar="ARCH",
              help="Architecture: one of the policy's ({archs} in the packaged default policy).")
@click.option("--dtype", type=DtypeType(), required=True, help=DTYPE_HELP)
@K_OPTION
@click.option("--n", "n", type=Count(1, pol.N_MAX), required=True, help="Row length (at least k).")
@click.option("--rows", "rows", type=Count(0, ROWS_MAX), default=None,
              help="Batch size: small batches of long rows may be split across CTAs, and this shows the chunk "
                   "plan (0, an empty batch, launches nothing). Without it: one CTA per row.")
@click.option("--deterministic", is_flag=True, help="Ask for the deterministic mode (ties by lower index).")
@click.option("--no-jit", is_flag=True, help="Only AOT kernels may serve the shape.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: schemas/explain.schema.json, the request echoed.")
def explain_command(policy_path: str | None, arch: str, dtype: str, k: int, n: int, rows: int | None,
                    deterministic: bool, no_jit: bool, fmt: str) -> None:
    """Say which kernel serves a shape, aot or jit, and the rule that chose it."""
    from topkgen.policy.explain import explain

    policy = pol.load(policy_path)
    _check_arch(policy, arch)
    try:
        answer = explain(policy, arch, dtype, k, n, deterministic=deterministic, jit=not no_jit, rows=rows)
    except pol.DispatchError as err:
        message = str(err)  # "k: ..." names its option; "no kernel serves ..." is what --no-jit left
        named = message.split(":", 1)[0] in ("arch", "dtype", "k", "n", "rows")
        raise InputError(f"--{message}" if named else f"--no-jit: {message}") from None
    click.echo(json.dumps(answer.record(), indent=2) if fmt == "json" else str(answer))


# ----------------------------------------------------------------------------- build

@main.command(short_help="Compile the planned kernels into a bundle.", epilog="""\b
Examples:
  topkgen build                              the packaged policy, into out/
  topkgen build --arch sm_90 -j 8 --out sm90
  topkgen build --shard 1/3 --out part-1     a CI matrix job (then topkgen merge)

On a terminal a bar counts the kernels compiled and those taken from the compile cache; in a
pipe or CI log every kernel gets a line as it finishes: [12/58] NAME compiled 0.41 s, or cached.
The compile cache is TOPKGEN_CACHE_DIR (local), then TOPKGEN_CACHE_URL (any fsspec URL shared
by CI jobs; TOPKGEN_CACHE_READONLY=1 reads it without writing).""")
@POLICY_OPTION
@ARCH_OPTION
@click.option("--out", "out_dir", type=BundleOutputArg("build"), default="out", show_default=True, metavar="DIR",
              help="Bundle directory: <arch>/<kernel>.cubin, jit/<arch>/<kernel>.cu and manifest.json. Must be "
                   "new, empty or a bundle (else --force); checked before compiling.")
@click.option("-j", "--jobs", type=Count(1, 256), default=console.available_cpus,
              metavar="N", help=JOBS_HELP + ".")
@click.option("--allow-over-budget", is_flag=True, help="Report kernels over their resource budget without failing.")
@click.option("--shard", "shard_text", metavar="I/N",
              help="Build only shard I of N (1-based) of the plan; `topkgen merge` joins the shards.")
@click.option("--force", is_flag=True, help="Replace --out even when it is a directory that is not a bundle.")
def build(policy_path: str | None, archs: tuple[str, ...], out_dir: str, jobs: int, allow_over_budget: bool,
          shard_text: str | None, force: bool) -> None:
    """Render and compile every planned kernel with NVRTC into a cubin bundle and its
    manifest, through the compile cache. A failed build leaves --out as it was."""
    standard_output.report_only()

    from topkgen.build import bundle, cache, compile as nvrtc_compile, shards

    policy = pol.load(policy_path)
    chosen = pol.in_policy_order(policy, _archs(policy, archs))
    specs = [s for a in chosen for s in pol.plan(policy, a)]
    shard = shards.parse(shard_text, len(specs)) if shard_text is not None else None
    total = len(shards.share(specs, *shard)) if shard else len(specs)
    try:
        with console.BuildProgress(total, label="building", stream=sys.stdout, lines=True) as progress:
            result = bundle.build(policy, chosen, Path(out_dir), jobs=jobs, allow_over_budget=allow_over_budget,
                                  force=force, warn=console.warning, shard=shard,
                                  progress=lambda spec, compiled, s: progress(spec.name, compiled.outcome.origin, s))
    except cache.CacheConfigError as err:
        raise InputError(str(err)) from None
    except (bundle.BuildError, nvrtc_compile.CompileError, cache.CacheError) as err:
        console.error(f"build failed, {out_dir} left as it was:\n{err}")
        sys.exit(1)
    manifest = result.manifest
    size = sum(k["size_bytes"] for k in manifest["kernels"])
    of_plan = f"shard {shard[0]}/{shard[1]} of {len(specs)}: " if shard else ""
    written = printable(str(Path(out_dir) / "manifest.json"))
    click.echo(f"wrote {written} in {console.seconds(progress.elapsed)}: {of_plan}"
               f"{_kernels_per_arch(manifest['kernels'], chosen)}, "
               f"{console.size(size)} of cubin, NVRTC {manifest['nvrtc_version']}\n  {_cache_stats(result.cache)}")
    _cache_warnings(result.cache)


def _cache_stats(stats: Any) -> str:
    """Where the build's kernels came from: the compile cache's tiers, or NVRTC."""
    line = f"cache: {stats.local_hits} local hits, {stats.remote_hits} remote hits, {stats.compiled} compiled"
    if stats.remote is None:
        return line + "; no remote (TOPKGEN_CACHE_URL unset)"
    return (line + f"; {console.size(stats.remote_read)} read from, {console.size(stats.remote_written)} written to "
            f"{stats.remote}{' (read-only)' if stats.readonly else ''}")


def _cache_warnings(stats: Any) -> None:
    if stats.rejected:
        console.warning(f"{stats.rejected} of the remote's entries failed verification (sha256, or the loaders' "
                        f"checks of the cubin) and were compiled here instead")
    for error in stats.errors[:3]:
        console.warning(f"remote cache unavailable, compiled instead: {error}")
    if stats.local_errors:  # disk full, say: the bundle is complete, the next build compiles these again
        console.warning(f"the compile cache could not be written, so kernels compiled now are not cached: "
                        f"{stats.local_errors[0]}")


# ----------------------------------------------------------------------------- show

@main.command(short_help="List what a bundle holds.")
@click.argument("bundle_dir", metavar="BUNDLE", type=BundleArg())
@click.option("--arch", "archs", type=ArchType(many=True), multiple=True, callback=_flatten, metavar="ARCH",
              help="Architecture(s) to show; repeat or comma-separate them. Default: all in the bundle.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="json: schemas/show.schema.json.")
@click.option("--dispatch", "with_dispatch", is_flag=True, help="Also show the dispatch table.")
def show(bundle_dir: str, archs: tuple[str, ...], fmt: str, with_dispatch: bool) -> None:
    """What a bundle holds: kernels and their resources, JIT sources, dispatch. Checks every file as a loader does."""
    from topkgen.build import shards
    from topkgen.manifest import reading as manifests

    manifest, root = manifests.load_manifest(bundle_dir)
    manifests.read_files(root, manifest)
    for arch in archs:
        if arch not in manifest["archs"]:
            raise InputError(f"--arch {arch}: not in the bundle {bundle_dir} (holds: {', '.join(manifest['archs'])})"
                             f"{suggest.did_you_mean(arch, manifest['archs'])}")
    chosen = list(dict.fromkeys(archs)) or manifest["archs"]
    doc = {"format": "topkgen-show", "schema_version": SHOW_SCHEMA_VERSION,
           "manifest_schema_version": manifest["schema_version"], "nvrtc_version": manifest["nvrtc_version"],
           "policy": {k: manifest["policy"][k] for k in ("path", "name", "sha256")},
           "archs": chosen,
           "kernels": [e for e in manifest["kernels"] if e["arch"] in chosen],
           "jit_kernels": [e for e in manifest["jit_kernels"] if e["arch"] in chosen]}
    if with_dispatch:
        doc["dispatch"] = {arch: manifest["dispatch"][arch] for arch in chosen}
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2))
        return
    part = shards.part_of(manifest)  # shown for inspection, but called what it is: no bundle
    what = (f"bundle {printable(bundle_dir)}" if part is None  # a name, escaped as in messages
            else f"part {printable(bundle_dir)} ({part} of a plan; merge the parts for a bundle)")
    click.echo(f"{what}: manifest schema {doc['manifest_schema_version']}, NVRTC {doc['nvrtc_version']}, "
               f"policy {doc['policy']['path']} ({doc['policy']['name']}, sha256 {doc['policy']['sha256'][:12]})")
    for arch in chosen:
        kernels = [e for e in doc["kernels"] if e["arch"] == arch]
        click.echo(f"\n{arch}: {len(kernels)} AOT kernels, {console.size(sum(e['size_bytes'] for e in kernels))} "
                   f"of cubin")
        for family in dict.fromkeys(e["family"] for e in kernels):
            click.echo(f"\n  family {family}")
            click.echo(_table(("kernel", "dtype", "K", "N window", "serves", "threads", "regs", "spills st/ld",
                               "stack", "smem static", "smem dyn", "cubin bytes", "budget"),
                              [_kernel_row(e) for e in kernels if e["family"] == family]))
        jit = [e for e in doc["jit_kernels"] if e["arch"] == arch]
        click.echo(f"\n{arch}: {len(jit)} JIT sources (compiled on first use, NVRTC options "
                   f"{' '.join(jit[0]['nvrtc_options']) if jit else '-'} -I<CUDA include>)")
        if jit:
            click.echo(_table(("kernel", "rule", "dtype", "K", "N window", "serves", "threads", "source bytes", "sha256"),
                              [(e["name"], e["rule"], e["dtype"], str(e["k"]), _window(e["n_window"]), "/".join(e["serves"]),
                                str(e["launch"]["threads_per_block"]), str(e["size_bytes"]), e["sha256"][:12])
                               for e in jit]))
        if with_dispatch:
            for dtype, by_mode in sorted(doc["dispatch"][arch].items()):
                for mode in ("fast", "deterministic"):
                    click.echo(f"\ndispatch {arch} {dtype} {mode}:")
                    click.echo(_table(("rows", "k", "n", "kernel", "chunks", "source", "without JIT"),
                                      [(_span(r["rows"]), _span(r["k"]), _span(r["n"]), r["kernel"], str(r["chunks"]),
                                        r["source"], _without_jit(r)) for r in by_mode[mode]]))


def _kernel_row(e: dict[str, Any]) -> tuple[str, ...]:
    r, b = e["resources"], e["budget"]
    return (e["name"], e["dtype"], str(e["k"]), _window(e["n_window"]), "/".join(e["serves"]),
            str(e["launch"]["threads_per_block"]), str(r["registers"]), f"{r['spill_stores']}/{r['spill_loads']}",
            str(r["stack_bytes"]), str(r["static_shared_bytes"]), str(e["launch"]["dynamic_shared_bytes"]),
            str(e["size_bytes"]), f"{b['max_registers']} regs, {'spills ok' if b['spills_allowed'] else 'no spills'}")


def _without_jit(row: dict[str, Any]) -> str:
    """What serves a dispatch row's shapes when JIT is off: 'same', the AOT kernel (and its
    chunks per row when it splits), or 'none'."""
    if row["aot_fallback"] is None:
        return "none"
    if (row["aot_fallback"], row["aot_chunks"]) == (row["kernel"], row["chunks"]):
        return "same"
    return row["aot_fallback"] + (f" in {row['aot_chunks']} chunks" if row["aot_chunks"] > 1 else "")


def _span(bounds: list[int]) -> str:
    lo, hi = bounds
    return _window({"min": lo, "max": hi})


# ----------------------------------------------------------------------------- diff

@main.command(short_help="Compare kernel sets of policies, bundles or commits.", epilog="""\b
Examples:
  topkgen diff HEAD~1                      the last commit against the working tree
  topkgen diff main...HEAD                 what this branch changed since it left main
  topkgen diff main HEAD --build --stat    with registers, spills and cubin sizes
  topkgen diff old/ new/ --format markdown a pull-request comment""")
@click.argument("old", type=TextArg())
@click.argument("new", type=TextArg(), required=False)
@click.option("--policy", "policy_in_repo", type=TextArg(), default="policies/topk.yaml", show_default=True,
              metavar="PATH",
              help="The policy file inside a git revision or the working tree, from the repository's top.")
@click.option("--shapes", "shapes_file", type=PathArg(dir_okay=False), metavar="FILE",
              help="Workload file (YAML or JSON): a list of {arch, dtype, k, n, rows?, deterministic?}.")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown"]), default="text", show_default=True,
              help="json: schemas/diff.schema.json; markdown: under 60,000 characters, for a pull-request comment.")
@click.option("--build", "build", is_flag=True,
              help="Compile both sides (through the compile cache) and compare registers, spills, stack, "
                   "shared memory, cubin size and budgets.")
@click.option("-j", "--jobs", type=Count(1, 256), default=console.available_cpus,
              metavar="N", help=JOBS_HELP + ", with --build.")
@click.option("--stat", is_flag=True, help="Print the summary only (text or markdown).")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing; the exit status says whether the sides differ.")
def diff(old: str, new: str | None, policy_in_repo: str, shapes_file: str | None, fmt: str, build: bool,
         jobs: int, stat: bool, quiet: bool) -> None:
    """Compare kernel sets, their rendered sources and dispatch. OLD and NEW: a policy file (or
    a pipe: <(...)), a manifest (compared alone), a bundle directory (its files checked as a loader checks them)
    or a git revision (policy and templates read from git); OLD alone is a revision compared
    with the working tree, or a range as git diff takes one (A..B, A...B). Exit 0 when the
    same, 1 when they differ, 2 on error."""
    from topkgen import diff as differ
    from topkgen.diff import report as diff_report

    if stat and fmt == "json":
        raise InputError("--stat: prints the text or markdown summary; the json always holds it under 'summary'")
    shapes = differ.load_shapes(shapes_file) if shapes_file else None
    for name, spec in (("OLD", old), ("NEW", new)) if new is not None else ():
        if differ.is_range(spec):  # it was "not a file, directory or git revision", which it is
            raise InputError(f"{name} {spec}: a range names both sides; give it alone (topkgen diff {spec}), "
                             f"or OLD and NEW as two revisions")
    ends = differ.revision_range(old) if new is None else None
    if ends:
        old, new = ends
    sides = [differ.load_side(old, policy_in_repo=policy_in_repo)]
    if new is None and sides[0].kind != "revision":
        kind = {"manifest": "bundle or manifest", "policy": "policy file"}.get(sides[0].kind, sides[0].kind)
        raise InputError(f"NEW is missing: only a git revision may stand alone (it is compared with the "
                         f"working tree), and {old} is a {kind}")
    sides.append(differ.load_side(new, policy_in_repo=policy_in_repo) if new is not None
                 else differ.load_worktree_side(policy_in_repo=policy_in_repo))
    if build:
        _build_diff_sides(differ, sides, jobs, show_progress=not quiet)
    report = differ.compare(*sides, shapes)
    if not quiet:
        if fmt == "json":
            text = json.dumps(diff_report.to_json(report), indent=2) + "\n"
        elif fmt == "markdown":
            text = diff_report.to_markdown(report, summary_only=stat)
        else:
            text = diff_report.to_text(report, style=click.style, summary_only=stat) + "\n"
        _write_stdout(text, color=fmt == "text" and console.color_enabled(sys.stdout))
    sys.exit(1 if report.differs else 0)


def _build_diff_sides(differ: Any, sides: list[Any], jobs: int, show_progress: bool) -> None:
    """Compile both sides with a progress bar on a terminal (stderr: stdout holds the
    report); any failure is trouble (exit 2)."""
    from topkgen.build import compile as nvrtc_compile

    total = differ.kernels_to_build(sides) if show_progress else 0
    try:
        with console.BuildProgress(total, label="compiling both sides", stream=sys.stderr, lines=False) as progress:
            differ.build_sides(sides, jobs, lambda spec, compiled, s: progress(spec.name, compiled.outcome.origin, s))
    except nvrtc_compile.CompileError as err:  # NVRTC's log, line by line as build prints it
        console.error("\n".join(printable(line) for line in f"--build: {err}".splitlines()))
        sys.exit(EXIT_INPUT)
    except (OSError, RuntimeError) as err:  # the compile cache, the CUDA headers, NVRTC itself
        raise InputError(f"--build: cannot compile: {err}") from None


def _write_stdout(text: str, *, color: bool) -> None:
    """The report, flushed here: a reader that left early (`| head`) ends diff with 141, as
    any command (`_interruptions`), not with the sides' 0 or 1, since it was not all read."""
    click.echo(text, nl=False, color=color)
    sys.stdout.flush()


# ----------------------------------------------------------------------------- run

ROWS_SHOWN = 10    # rows `run` prints without -o
VALUES_SHOWN = 8   # values per row it prints


@main.command(short_help="Top-k of a .npy file with a bundle's kernels.", epilog="""\b
Examples:
  topkgen run --bundle out --k 8 x.npy                on the GPU, rows printed
  topkgen run --bundle out --k 8 x.npy -o top8.npz    saved: values, indices
  topkgen run --bundle out --backend emulator --arch sm_90 --k 8 x.npy

The emulator backend runs the same kernels on the CPU, without a GPU. bfloat16 input is
read as numpy saves ml_dtypes.bfloat16 (2-byte records), or as raw uint16 bits (--dtype says
which 16-bit type those hold); the values are saved the same way.""")
@click.option("--bundle", "bundle_dir", required=True, type=BundleArg(), metavar="DIR",
              help="Bundle directory (from topkgen build).")
@click.option("--arch", type=ArchType(), default=None, metavar="ARCH",
              help="Target arch, one of the bundle's policy (default: the GPU's; required for the emulator).")
@click.option("--backend", type=click.Choice(["cuda", "emulator"]), default="cuda", show_default=True,
              help="cuda: the GPU; emulator: the same kernels on the CPU (slow, needs no GPU).")
@K_OPTION
@click.option("--smallest", is_flag=True, help="The k smallest instead of the k largest.")
@click.option("--deterministic", is_flag=True, help="Ties by lower index, bit-exact run to run.")
@click.option("--dtype", type=DtypeType(("bfloat16", "float16")), default=None,
              help="What raw uint16 input holds: bfloat16 (default) or float16 (bf16, fp16 too).")
@click.argument("input_path", metavar="IN.npy", type=PathArg(dir_okay=False))
@click.option("-o", "--output", "output_path", default=None, type=_NPZ_OUT, metavar="OUT.npz",
              help="Save arrays 'values' and 'indices' here (a file: not '-'). Without it, each row's top-k is "
                   "printed.")
@click.option("--force", is_flag=True, help="Replace -o even when it is not the output of an earlier run.")
def run(bundle_dir: str, arch: str | None, backend: str, k: int, smallest: bool, deterministic: bool,
        dtype: str | None, input_path: str, output_path: str | None, force: bool) -> None:
    """Top-k over the last dimension of IN.npy with the bundle's kernels (or JIT)."""
    import io

    if output_path is not None:  # the product is -o; without it, the rows printed are
        standard_output.report_only()
    import numpy as np

    from topkgen.common.destinations import check_output_file
    from topkgen.cli.npyfile import read_npy_stored
    from topkgen.common.files import atomic_write
    from topkgen.runtime import NoGpuError, TopK, TopKError, dtype_name

    if backend == "emulator" and arch is None:  # the runtime would name its own argument, arch=
        raise InputError(f"--arch: the emulator backend runs one arch's kernels; name it, e.g. "
                         f"--arch {_first_arch(bundle_dir)}")
    if output_path is not None:
        check_output_file(Path(output_path), force=force, inputs=(Path(input_path), Path(bundle_dir)))
    x, stored = read_npy_stored(input_path)
    found = "bfloat16" if stored.kind == "V" else str(x.dtype)  # 2-byte records: how numpy saves ml_dtypes' bfloat16
    try:
        op = TopK(bundle_dir, arch=arch, backend=backend)
        try:  # what the input's shape and type allow: the message names the file
            name = dtype_name(found, dtype)
            answer = op.explain(name, k, x.shape[-1], deterministic)
        except TopKError as err:
            raise InputError(f"{input_path}: {found}{list(x.shape)}: {err}") from None
        if backend == "cuda":
            values, indices = _run_on_gpu(op, x, k, smallest, deterministic, name)
        else:
            values, indices = op(x, k, largest=not smallest, deterministic=deterministic, dtype=name)
    except NoGpuError as err:
        raise InputError(f"{err}; without a GPU, run the same kernels on the CPU: --backend emulator "
                         f"--arch {arch or _first_arch(bundle_dir)}") from None
    if stored.kind == "V":  # bfloat16 came as 2-byte records (ml_dtypes): saved the same way
        values = values.view(stored)
    by = f"by {answer.kernel.name} ({answer.source})"
    if output_path is None:
        _print_rows(input_path, x.shape, name, values, indices, k, smallest, by)
        return
    buffer = io.BytesIO()
    np.savez(buffer, values=values, indices=indices)
    try:
        atomic_write(Path(output_path), buffer.getvalue())
    except OSError as err:
        raise InputError(f"-o {output_path}: cannot write: {err.strerror}") from None
    click.echo(f"{printable(output_path)}: values {values.dtype}{list(values.shape)}, "
               f"indices int64{list(indices.shape)} {by}")


def _first_arch(bundle_dir: str) -> str:
    from topkgen.manifest import reading as manifests

    try:
        return manifests.load_manifest(bundle_dir)[0]["archs"][0]
    except (manifests.ManifestError, IndexError):
        return "sm_90"


def _print_rows(input_path: str, shape: tuple[int, ...], dtype: str, values: Any, indices: Any, k: int,
                smallest: bool, by: str) -> None:
    """Each row's top-k, value[index], for the first rows: what -o would save, to read."""
    import numpy as np

    if dtype == "bfloat16":  # 16-bit values come as uint16 bits or 2-byte records
        import ml_dtypes

        values = values.view(ml_dtypes.bfloat16)
    elif dtype == "float16":
        values = values.view(np.float16)
    values = values.astype(np.float32).reshape(-1, k)
    indices = indices.reshape(-1, k)
    rows = values.shape[0]
    click.echo(f"{printable(input_path)}: {'smallest' if smallest else 'largest'} {k} of {rows} row(s) of {shape[-1]} "
               f"{dtype} {by}")
    for row in range(min(rows, ROWS_SHOWN)):
        label = row if len(shape) <= 2 else [int(i) for i in np.unravel_index(row, shape[:-1])]
        items = [f"{v:.6g}[{i}]" for v, i in zip(values[row, :VALUES_SHOWN], indices[row, :VALUES_SHOWN])]
        more = f" ... {k - VALUES_SHOWN} more" if k > VALUES_SHOWN else ""
        click.echo(f"  row {label}: {' '.join(items)}{more}")
    if rows > ROWS_SHOWN:
        click.echo(f"  ... {rows - ROWS_SHOWN} more rows; -o OUT.npz saves them all")


def _run_on_gpu(op: Any, x: Any, k: int, smallest: bool, deterministic: bool, dtype: str | None):
    """Host arrays go through device buffers that cuda.core allocates."""
    import numpy as np

    from topkgen.runtime.gpu_arrays import DeviceArray
    from topkgen.runtime.cuda_backend import _cuda_core

    device = _cuda_core().Device()
    stream = device.default_stream
    dx = DeviceArray.from_host(np.ascontiguousarray(x), device, stream)
    shape = (*x.shape[:-1], k)
    values = DeviceArray.empty(shape, x.dtype, device, stream)
    indices = DeviceArray.empty(shape, np.dtype(np.int64), device, stream)
    op(dx, k, largest=not smallest, deterministic=deterministic, out=(values, indices), dtype=dtype, stream=stream)
    stream.sync()
    return values.to_host(stream), indices.to_host(stream)


# ----------------------------------------------------------------------------- merge, cache

@main.command(short_help="Join the bundles of build --shard into one.")
@click.argument("parts", nargs=-1, required=True, type=BundleArg())
@click.option("--out", "out_dir", required=True, type=BundleOutputArg("merge"), metavar="DIR",
              help="The full bundle to write. Must be new, empty or a bundle (else --force), and not a part.")
@click.option("--force", is_flag=True, help="Replace --out even when it is a directory that is not a bundle.")
def merge(parts: tuple[str, ...], out_dir: str, force: bool) -> None:
    """Join the bundles of `build --shard I/N` into the full bundle. Refuses (exit 2) unless
    the parts share policy, generator, toolchain and plan, cover it exactly once, and every
    cubin verifies."""
    standard_output.report_only()

    from topkgen.build import bundle, merge as merging

    try:
        manifest = merging.merge([Path(p) for p in parts], Path(out_dir), force=force)
    except bundle.BuildError as err:  # the bundle could not be written
        raise InputError(str(err)) from None
    click.echo(f"merged {len(parts)} shards into {printable(str(Path(out_dir) / 'manifest.json'))}: "
               f"{_kernels_per_arch(manifest['kernels'], manifest['archs'])}")


@main.group("cache", cls=_Group, short_help="Seed the compile cache from a bundle, or verify it.")
def cache_group() -> None:
    """The compile cache: seed it from a bundle, verify its entries."""


@cache_group.command("import", short_help="Fill the compile cache from a bundle.")
@click.argument("bundle_dir", metavar="BUNDLE", type=BundleArg())
def cache_import(bundle_dir: str) -> None:
    """Fill the compile cache from a bundle (a release, a base revision's build), so that
    builds of the same kernels compile nothing. Each cubin's sha256, cache key, register
    count and stack frame are checked; its spill counts, static shared memory and barriers
    are not in the cubin, so they are taken from the bundle's manifest as they are."""
    standard_output.report_only()

    from topkgen.build import cache, cache_admin

    try:
        result = cache_admin.import_bundle(Path(bundle_dir))
    except cache.CacheConfigError as err:  # a CacheError, but one the user's setting causes: exit 2
        raise InputError(str(err)) from None
    except cache.CacheError as err:
        console.error(str(err))
        sys.exit(1)
    where = f" and {result.remote} ({console.size(result.remote_written)} written)" if result.remote else ""
    click.echo(f"imported {printable(bundle_dir)}: {result.added} entries added, {result.present} already present, "
               f"{len(result.skipped)} skipped, of {console.count(result.kernels, 'kernel')}, into the local cache{where}")
    if result.skipped:
        click.echo(f"  skipped (this checkout renders a different source): {', '.join(result.skipped)}")
    if not result.toolchain_matches:
        click.echo("  note: the bundle's toolchain differs from this machine's; its entries serve only builds "
                   "with that toolchain")


@cache_group.command("verify", short_help="Recompile a sample of entries and compare.")
@click.option("--sample", "percent", type=click.FloatRange(0, 100, min_open=True), required=True, metavar="P",
              help="Percentage of entries to recompile and compare.")
@click.option("--remote", is_flag=True, help="Verify TOPKGEN_CACHE_URL's entries instead of the local cache.")
@click.option("--seed", type=int, default=None, help="Choose the sample with this seed (default: random, printed).")
@click.option("-j", "--jobs", type=Count(1, 256), default=console.available_cpus,
              metavar="N", help=JOBS_HELP + ".")
def cache_verify(percent: float, remote: bool, seed: int | None, jobs: int) -> None:
    """Recompile a sample of cache entries with this machine's toolchain and compare bytes.
    Exit 1 when an entry differs."""
    from topkgen.build import cache_admin

    result = cache_admin.verify(percent, remote=remote, seed=seed, jobs=jobs)
    click.echo(f"verified {result.sampled} of {result.entries} entries in {printable(str(result.store))} "
               f"({percent:g}%, seed {result.seed}): {result.identical} identical, {len(result.problems)} wrong, "
               f"{result.skipped} skipped (another toolchain)")
    for problem in result.problems:
        click.echo(f"  {problem}")
    sys.exit(1 if result.problems else 0)


if __name__ == "__main__":  # `python -m topkgen.cli`, as scripts once ran it: the one entry point
    from topkgen.cli.launch import main as launch

    launch()
