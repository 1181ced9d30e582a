"""Argument types and options the commands share: archs, dtypes, counts, paths that must
exist or must not be overwritten, and the policy helpers every command's output names."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import click
from click.shell_completion import CompletionItem

from topkgen.cli import console
from topkgen.common import errors, suggest
from topkgen import policy as pol
from topkgen.common.reader import printable
from topkgen.cli.group import InputError


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
K_OPTION = click.option("--k", "k", type=Count(1, pol.N_MAX), required=True,
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


WIDE_OPTION = click.option("--wide", is_flag=True,
                           help="Every column, however wide; on a terminal tables otherwise fit its width "
                                "(a pipe gets every column).")


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]], *, width: int | None = None,
           drop: tuple[str, ...] = ()) -> str:
    """Columns padded to their widest cell. With `width`, the columns named in `drop` are left
    out, in that order, until the table fits (a line after it counts them); None: all."""
    keep = list(range(len(header)))

    def lines() -> list[str]:
        widths = {i: max(len(r[i]) for r in [header, *rows]) for i in keep}
        return ["  " + "  ".join(r[i].ljust(widths[i]) for i in keep).rstrip() for r in [header, *rows]]

    out, left_out = lines(), []
    for name in drop:
        if width is None or max(map(len, out)) <= width:
            break
        keep.remove(header.index(name))
        left_out.append(name)
        out = lines()
    if left_out:
        out.append(f"  ({len(left_out)} column{'s' if len(left_out) > 1 else ''} left out to fit: --wide shows "
                   f"{'them' if len(left_out) > 1 else 'it'})")
    return "\n".join(out)
