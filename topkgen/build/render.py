"""KernelSpec -> CUDA source, through the Jinja templates in templates/.

Templates see only validated integers and names that match strict patterns, never text
copied from the policy file; StrictUndefined turns any missing value into an error.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from topkgen.common.errors import InputError
from topkgen.policy import FAMILY_TEMPLATES, K_RUNG_MAX, SHARED_BYTES_PER_BLOCK, KernelSpec, _data_dir
from topkgen.manifest.params import C_TYPES, params


def template_dir() -> Path:
    return _data_dir("templates")


MAX_TEMPLATE_RANGE = 4096  # range() in a template: our templates unroll at most a few dozen


def environment(loader: Any) -> Any:
    """A Jinja environment with the settings every render uses, over any loader: the
    installed templates, or another revision's (topkgen diff reads them from git).

    Sandboxed: `topkgen diff` renders the templates of any revision it is given, and a
    reviewer's machine must not run the Python that a template of a branch under review
    could reach through attributes (`cycler.__init__.__globals__.os`). The sandbox refuses
    such access; range(), lipsum(), `*` and `**` are bounded so that no one call runs for hours
    or takes the machine's memory (render_bounded bounds the rest, in a child process)."""
    import jinja2

    env = _bounded_sandbox()(
        loader=loader,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )

    def bounded_range(*args: int) -> range:
        values = range(*args)
        if len(values) > MAX_TEMPLATE_RANGE:
            raise jinja2.sandbox.SecurityError(f"range() of {len(values)} items: templates may loop over at most "
                                               f"{MAX_TEMPLATE_RANGE}")
        return values

    def bounded_lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002
        if not (0 <= n <= 100 and 0 <= min <= max <= 1000):
            raise jinja2.sandbox.SecurityError(f"lipsum({n}, min={min}, max={max}): templates may ask for at most "
                                               f"100 paragraphs of 1000 words")
        return jinja2.utils.generate_lorem_ipsum(n=n, html=html, min=min, max=max)

    env.globals["range"] = bounded_range
    env.globals["lipsum"] = bounded_lipsum
    return env


MAX_TEMPLATE_REPEAT = 1 << 20  # the most items (characters) a template's `*` of a string or list may make
MAX_TEMPLATE_BITS = 1 << 12    # the largest integer, in bits, a template's `**` may make


@lru_cache(maxsize=1)
def _bounded_sandbox() -> type:
    """SandboxedEnvironment whose `*` and `**` refuse results beyond MAX_TEMPLATE_REPEAT items
    and MAX_TEMPLATE_BITS bits: one C call each (`'x' * 10**10`, `2 ** 10**11`) that no
    timer interrupts and that would take the machine's memory or minutes of CPU."""
    from jinja2.sandbox import SandboxedEnvironment, SecurityError

    def is_int(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    class Bounded(SandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "**" and is_int(left) and is_int(right) and abs(left) > 1 \
                    and right * abs(left).bit_length() > MAX_TEMPLATE_BITS:
                raise SecurityError(f"{left} ** {right}: templates may make integers of at most "
                                    f"{MAX_TEMPLATE_BITS} bits")
            if operator == "*":
                for seq, times in ((left, right), (right, left)):
                    if isinstance(seq, (str, bytes, list, tuple)) and is_int(times) \
                            and len(seq) * times > MAX_TEMPLATE_REPEAT:
                        raise SecurityError(f"a {type(seq).__name__} of {len(seq)} times {times}: templates may "
                                            f"make at most {MAX_TEMPLATE_REPEAT} items so")
                if is_int(left) and is_int(right) and left.bit_length() + right.bit_length() > MAX_TEMPLATE_BITS:
                    raise SecurityError(f"templates may make integers of at most {MAX_TEMPLATE_BITS} bits")
            return super().call_binop(context, operator, left, right)

    return Bounded


@lru_cache(maxsize=1)
def _environment():
    import jinja2

    return environment(jinja2.FileSystemLoader(str(template_dir())))


_NAME = re.compile(r"topk_[a-z0-9_]{1,80}")  # used with fullmatch


def signature(spec: KernelSpec) -> str:
    """The kernel's C parameter list, from `params`; pointers are __restrict__."""
    return ", ".join(f"{p['ctype']} __restrict__ {p['name']}" if p["ctype"].endswith("*") else f"{p['ctype']} {p['name']}"
                     for p in params(spec))


def _int(value: object, lo: int, hi: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{what}: {value!r} is not an integer in [{lo}, {hi}]")
    return value


def context(spec: KernelSpec) -> dict[str, object]:
    """The template context: validated integers and strictly patterned names only."""
    if not _NAME.fullmatch(spec.name):
        raise ValueError(f"kernel name {spec.name!r} does not match {_NAME.pattern}")
    ctx: dict[str, object] = {
        "name": spec.name,
        "arch": spec.arch if re.fullmatch(r"sm_[0-9]{2,3}", spec.arch) else "",
        "ctype": C_TYPES[spec.dtype],
        # The large-k path renders K rung 0: its candidates live in global memory, not shared.
        "k": 0 if spec.work == "large" else _int(spec.k, 1, K_RUNG_MAX, "k"),
        "large_k": spec.work == "large",
        "merges": spec.merges,
        "threads": _int(spec.threads, 32, 1024, "threads"),
        "min_ctas_per_sm": _int(spec.min_ctas_per_sm, 1, 32, "min_ctas_per_sm"),
        "rows_per_block": _int(spec.rows_per_block, 1, 32, "rows_per_block"),
        "mode": {"fast": "fast", "deterministic": "deterministic"}[spec.mode],
        "deterministic": spec.mode == "deterministic",
        "work_rung": {"ladder": "ladder", "dynamic": "dynamic", "exact": f"exact N={int(spec.exact_n or 0)}",
                      "fixed_vec": f"fixed_vec={int(spec.vector_iterations or 0)}", "large": "large k"}[spec.work],
        "body_vectors": _int(spec.vector_iterations, 1, 8, "vector_iterations") if spec.work == "fixed_vec" else 0,
        "dynamic_shared_bytes": _int(spec.dynamic_shared_bytes, 0, max(SHARED_BYTES_PER_BLOCK.values()),
                                     "dynamic_shared_bytes"),
        "loads_in_flight": _int(spec.loads_in_flight, 1, 8, "loads_in_flight"),
        "tail_steps": _int(spec.tail_max_iterations, 1, 16, "tail_max_iterations")
        if spec.tail_policy == "fixed" else 0,
        "exact_n": _int(spec.exact_n, 1, 2**31 - 1, "exact_n") if spec.work == "exact" else 0,
        "signature": signature(spec),
    }
    if spec.family == "register":
        rungs = spec.ladder if spec.work == "ladder" else (spec.exact_n,)
        ctx["branches"] = [_int(r, 32, 2048, "ladder rung") for r in rungs]
        for r in ctx["branches"]:  # type: ignore[union-attr]
            if r % 32:
                raise ValueError(f"ladder rung {r} is not a multiple of 32")
    return ctx


def device_library() -> str:
    """The device code every kernel includes (topk_common.cuh and what it includes), for
    tests and tools that call its functions from kernels of their own."""
    return _environment().get_template("topk_common.cuh").render()


def template_name(spec: KernelSpec) -> str:
    """The template a kernel renders from; its family decides, the policy must agree."""
    template = FAMILY_TEMPLATES[spec.family]
    if spec.template != template:
        raise ValueError(f"{spec.name}: family {spec.family} renders from {template}, not {spec.template}")
    return template


class TemplateError(InputError, ValueError):
    """An installed template that does not render (an edited checkout); the message names
    the file and line, or the kernel."""


def template_problem(err: Exception, where: str, kernel: str, *, other_version: bool = True) -> str:
    """What went wrong rendering `kernel` from the templates in `where` ("templates/",
    "HEAD~1:templates/"), in one line; `other_version`: they may be another revision's."""
    import jinja2

    if isinstance(err, jinja2.TemplateNotFound):
        return f"{where}: no template {err.name!r} (kernel {kernel})"
    if isinstance(err, jinja2.TemplateSyntaxError):
        return f"{where}{err.name}:{err.lineno}: {err.message}"
    if isinstance(err, jinja2.UndefinedError) and other_version:
        # Templates and the render context change together: an older revision's templates
        # may name values this topkgen no longer provides.
        return (f"{where}: cannot render kernel {kernel}: {err}; these templates expect values this topkgen "
                f"does not provide (written for another version?)")
    return f"{where}: cannot render kernel {kernel}: {err}"


def render(spec: KernelSpec, env: Any = None) -> str:
    """The CUDA source of one kernel. The same text goes to NVRTC and to the emulator.
    `env` (from `environment`) renders from other templates than the installed ones; its
    caller words the errors (topkgen.build.sources)."""
    if env is not None:
        return env.get_template(template_name(spec)).render(**context(spec))
    import jinja2

    try:
        return _environment().get_template(template_name(spec)).render(**context(spec))
    except (jinja2.TemplateError, UnicodeDecodeError) as err:  # a ValueError of context(): a bug, exit 70
        raise TemplateError(template_problem(err, "templates/", spec.name, other_version=False)) from None


def loaded_templates(env: Any, name: str) -> tuple[str, ...]:
    """Every template file that rendering `name` reads (itself and its includes, followed
    through), so a change in the kernels' source can be traced to the files that made it.
    An include whose name is computed at render time cannot be followed: then every file
    the loader holds counts."""
    from jinja2 import meta

    seen: list[str] = []
    todo = [name]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.append(current)
        source, filename, _ = env.loader.get_source(env, current)
        for ref in meta.find_referenced_templates(env.parse(source, current, filename)):
            if ref is None:
                return tuple(sorted(set(seen) | set(env.loader.list_templates())))
            todo.append(ref)
    return tuple(sorted(seen))
