"""What the CLI writes to a person: colour (decided in one place), error and warning lines,
sizes, and build progress that suits a terminal (a bar) and a CI log (one line per kernel).

Why one module: colour and progress each depend on where the text goes (a terminal or a
pipe) and on the user's --color / NO_COLOR choice; deciding that in one place keeps every
command consistent. It imports click only, so `topkgen plan` stays fast.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import IO, Any

import click

COLOR_CHOICES = ("auto", "always", "never")
_color_mode = "auto"


def set_color(mode: str) -> None:
    """The global --color choice: `always` and `never` win over NO_COLOR and the terminal."""
    global _color_mode
    if mode not in COLOR_CHOICES:
        raise ValueError(f"color: {mode!r} is not one of {', '.join(COLOR_CHOICES)}")
    _color_mode = mode


def color_enabled(stream: Any) -> bool:
    """Colour on `stream`? --color always/never decide; with auto, colour only on a terminal
    and never when NO_COLOR is set to anything (no-color.org)."""
    if _color_mode != "auto":
        return _color_mode == "always"
    return not os.environ.get("NO_COLOR") and isatty(stream)


def isatty(stream: Any) -> bool:
    """Whether `stream` is a terminal; False, not an error, for a stream that is closed or
    is no file (a test runner's), since the answer only picks colour and layout."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def echo(text: str, *, err: bool = False, nl: bool = True) -> None:
    """click.echo with this module's colour decision for the stream it writes to."""
    stream = sys.stderr if err else sys.stdout
    click.echo(text, err=err, nl=nl, color=color_enabled(stream))


def table_width(wide: bool) -> int | None:
    """How wide a table may be: the terminal's width (COLUMNS when set) when stdout is a
    terminal, else unbounded, as with --wide (a pipe or a file gets every column)."""
    if wide or not isatty(sys.stdout):
        return None
    import shutil

    return shutil.get_terminal_size().columns


def error(message: str) -> None:
    """`topkgen: error: ...` on stderr, the prefix in red on a terminal."""
    echo(f"{click.style('topkgen: error:', fg='red', bold=True)} {message}", err=True)


def warning(message: str) -> None:
    """`topkgen: warning: ...` on stderr, the prefix in yellow on a terminal."""
    echo(f"{click.style('topkgen: warning:', fg='yellow', bold=True)} {message}", err=True)


def count(number: int, noun: str) -> str:
    """'1 kernel', '2 kernels': summary lines read as sentences."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


def size(nbytes: int) -> str:
    """Bytes as people read them: `1.9 MiB`, `36.0 KiB`, `512 B`."""
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def seconds(value: float) -> str:
    """`0.41 s`, `12.3 s`, `2 min 05 s`."""
    if value < 10:
        return f"{value:.2f} s"
    if value < 60:
        return f"{value:.1f} s"
    return f"{int(value // 60)} min {int(value % 60):02d} s"


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, which containers and taskset
    narrow), not the machine's count: the default for -j."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no sched_getaffinity on this platform
        return os.cpu_count() or 1


class BuildProgress:
    """Progress of compiling `total` kernels, written to `stream`: on a terminal a bar with
    the kernels compiled and those taken from the cache counted apart; elsewhere (a pipe, a
    CI log), with `lines`, one line per kernel as it finishes (`[12/58] NAME compiled
    0.41 s`, or `cached`), flushed at once. Called from the compile threads."""

    def __init__(self, total: int, *, label: str, stream: IO[str], lines: bool) -> None:
        self.total, self.stream = total, stream
        self.done = self.compiled = self.cached = 0
        self._lock = threading.Lock()
        self._lines = lines and not isatty(stream)
        self._bar = None
        if isatty(stream) and total:
            self._bar = click.progressbar(length=total, label=label, file=stream, show_pos=True,
                                          show_percent=False, bar_template="%(label)s  [%(bar)s]  %(info)s",
                                          item_show_func=lambda _item: self._counts(), width=30)

    def _counts(self) -> str:
        return f"{self.compiled} compiled, {self.cached} cached"

    def __enter__(self) -> "BuildProgress":
        self.start = time.perf_counter()
        if self._bar is not None:
            self._bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def __call__(self, name: str, origin: str, seconds_taken: float) -> None:
        """One kernel finished: `origin` is "compiled", "local" or "remote" (a cache hit)."""
        with self._lock:
            self.done += 1
            if origin == "compiled":
                self.compiled += 1
                outcome = f"compiled {seconds(seconds_taken)}"
            else:
                self.cached += 1
                outcome = "cached" if origin == "local" else "cached (remote)"
            if self._bar is not None:
                self._bar.update(1)
            elif self._lines:
                width = len(str(self.total))
                click.echo(f"[{self.done:>{width}}/{self.total}] {name} {outcome}", file=self.stream)
