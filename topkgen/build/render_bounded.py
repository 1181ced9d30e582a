"""Rendering templates that are not the installed ones (another revision's, a working tree's:
`topkgen diff` of a branch under review) in a child process with limits, so that no template
can hang, crash or exhaust the reviewer's machine.

The sandbox (render.environment) already keeps a template from Python it could reach through
attributes, bounds range() and refuses `**`, `*` of a string or list and lipsum beyond small
results. What it cannot see (nested loops of allowed sizes, a recursive macro, an include
cycle, a format width of a GiB) this process bounds: its address space (MEMORY_LIMIT), its CPU
time (CPU_SECONDS), each kernel's render time (KERNEL_SECONDS, a timer that interrupts the
render), each kernel's output (MAX_RENDERED_BYTES), no files written, and a wall-clock limit
on the whole. Each breach is one line naming the templates and the kernel (RenderRefused).

The parent hands over the template files and the kernels (pickled: its own data) on stdin;
the child answers in JSON, one line per kernel, so the parent never unpickles what a
template influenced.
"""

from __future__ import annotations

import json
import pickle
import resource
import signal
import subprocess
import sys
from typing import Any, Sequence

import jinja2

from topkgen.policy import KernelSpec

MEMORY_LIMIT = 1 << 30          # the child's address space; rendering every fleet kernel needs well under 200 MiB
CPU_SECONDS = 20                # the child's CPU time, all kernels together (the fleet's 554 take 0.1 s)
WALL_SECONDS = 30.0
KERNEL_SECONDS = 0.5            # one kernel's render (the shipped ones take well under 10 ms)
MAX_RENDERED_BYTES = 4 << 20    # one kernel's source (the shipped ones are about 35 KB)


class RenderRefused(ValueError):
    """Templates whose render breached a bound, or failed; the message is one line."""


class FilesLoader(jinja2.BaseLoader):
    """A Jinja loader over file contents held in memory (read from git or a directory)."""

    def __init__(self, files: dict[str, bytes], where: str) -> None:
        self.files, self.where = files, where

    def get_source(self, environment: jinja2.Environment, template: str) -> tuple[str, str, Any]:
        data = self.files.get(template)
        if data is None:
            raise jinja2.TemplateNotFound(template)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise RenderRefused(f"{self.where}{template}: not UTF-8 text (byte {err.start})") from None
        return text, f"{self.where}{template}", lambda: True

    def list_templates(self) -> list[str]:
        return sorted(self.files)


def render_all(files: dict[str, bytes], where: str,
               specs: Sequence[KernelSpec]) -> dict[KernelSpec, tuple[str, tuple[str, ...]]]:
    """Every kernel of `specs` rendered from `files` (named as `where` + name in messages) in a
    bounded child: spec -> (source, the template files it read)."""
    if not specs:
        return {}
    request = pickle.dumps((files, where, list(specs)))
    try:
        proc = subprocess.run([sys.executable, "-m", "topkgen.build.render_bounded"], input=request,
                              capture_output=True, timeout=WALL_SECONDS, preexec_fn=_limits)
    except subprocess.TimeoutExpired:
        raise RenderRefused(f"{where}: rendering took longer than {WALL_SECONDS:.0f} s; refused") from None
    except OSError as err:
        raise RenderRefused(f"{where}: cannot start the renderer: {err.strerror}") from None
    results: dict[KernelSpec, tuple[str, tuple[str, ...]]] = {}
    lines = proc.stdout.splitlines()
    for spec, line in zip(specs, lines):
        answer = json.loads(line)
        if "error" in answer:
            raise RenderRefused(answer["error"])
        results[spec] = (answer["source"], tuple(answer["loads"]))
    if len(results) < len(specs):  # the child was killed: by its CPU limit, or by its memory limit
        kernel = specs[len(results)].name
        cause = {-signal.SIGXCPU: f"took more than {CPU_SECONDS} s of CPU",
                 -signal.SIGKILL: "was killed (out of memory?)"}.get(proc.returncode,
                                                                      f"ended with status {proc.returncode}")
        raise RenderRefused(f"{where}: cannot render kernel {kernel}: the bounded renderer {cause}; refused")
    return results


def _limits() -> None:
    """The child's bounds (preexec_fn)."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))  # it writes no file
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


# ----------------------------------------------------------------------------- the child

class _KernelTimeout(Exception):
    pass


def _on_timer(signum: int, frame: Any) -> None:
    raise _KernelTimeout


def _render_one(env: Any, spec: KernelSpec, where: str) -> dict[str, Any]:
    from topkgen.build import render

    signal.setitimer(signal.ITIMER_REAL, KERNEL_SECONDS)
    try:
        name = render.template_name(spec)
        loads = render.loaded_templates(env, name)
        source = render.render(spec, env)
    except _KernelTimeout:
        return {"error": f"{where}: cannot render kernel {spec.name}: it took longer than {KERNEL_SECONDS:g} s; "
                         f"refused (a loop without end?)"}
    except RecursionError:
        return {"error": f"{where}: cannot render kernel {spec.name}: recursion too deep (a recursive macro, "
                         f"or an include that includes itself); refused"}
    except MemoryError:
        return {"error": f"{where}: cannot render kernel {spec.name}: it needs more than "
                         f"{MEMORY_LIMIT >> 20} MiB; refused"}
    except RenderRefused as err:  # a template that is not UTF-8
        return {"error": str(err)}
    except (jinja2.TemplateError, ValueError, UnicodeDecodeError) as err:
        return {"error": render.template_problem(err, where, spec.name)}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if len(source) > MAX_RENDERED_BYTES:
        return {"error": f"{where}: cannot render kernel {spec.name}: its source is over {MAX_RENDERED_BYTES} "
                         f"characters ({len(source)}); refused"}
    return {"source": source, "loads": list(loads)}


def _child() -> None:
    """Render what stdin asks for, one JSON line per kernel; stop at the first refusal.

    Kept whole: the one loop of the child process."""
    from topkgen.build import render

    files, where, specs = pickle.loads(sys.stdin.buffer.read())
    signal.signal(signal.SIGALRM, _on_timer)
    env = render.environment(FilesLoader(files, where))
    out = sys.stdout
    for spec in specs:
        try:
            answer = _render_one(env, spec, where)
        except Exception as err:  # noqa: BLE001 - a SourceError of the loader, and anything a template raised
            answer = {"error": f"{where}: cannot render kernel {spec.name}: {type(err).__name__}: {err}"[:500]}
        out.write(json.dumps(answer) + "\n")
        if "error" in answer:
            break
    out.flush()


if __name__ == "__main__":
    _child()
