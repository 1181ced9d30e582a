"""`topkgen diff`: the command line of topkgen.diff, and its output to a terminal or a file."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from topkgen.cli import console
from topkgen.common.reader import printable
from topkgen.cli.group import EXIT_INPUT, InputError, main
from topkgen.cli.map_command import check_picture, draw
from topkgen.cli.options import Count, JOBS_HELP, PathArg, TextArg


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
@click.option("--map", "map_path", type=PathArg(dir_okay=False), default=None, metavar="OUT.svg|OUT.png",
              help="Also draw the (k, n) regions whose dispatch moves, per arch, dtype and mode (needs "
                   "matplotlib: pip install 'topkgen[plot]'); not with --shapes.")
def diff(old: str, new: str | None, policy_in_repo: str, shapes_file: str | None, fmt: str, build: bool,
         jobs: int, stat: bool, quiet: bool, map_path: str | None) -> None:
    """Compare kernel sets, their rendered sources and dispatch. OLD and NEW: a policy file (or
    a pipe: <(...)), a manifest (compared alone), a bundle directory (its files checked as a loader checks them)
    or a git revision (policy and templates read from git); OLD alone is a revision compared
    with the working tree, or a range as git diff takes one (A..B, A...B). Exit 0 when the
    same, 1 when they differ, 2 on error."""
    from topkgen import diff as differ
    from topkgen.diff import report as diff_report

    if stat and fmt == "json":
        raise InputError("--stat: prints the text or markdown summary; the json always holds it under 'summary'")
    if map_path is not None and shapes_file:
        raise InputError("--map: draws the regions of the whole domain; --shapes lists a workload's shapes instead")
    picture = check_picture(map_path, "--map") if map_path is not None else None
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
    if picture is not None:
        _draw_moves(report, picture)
    if not quiet:
        if fmt == "json":
            text = json.dumps(diff_report.to_json(report), indent=2) + "\n"
        elif fmt == "markdown":
            text = diff_report.to_markdown(report, summary_only=stat)
        else:
            text = diff_report.to_text(report, style=click.style, summary_only=stat) + "\n"
        _write_stdout(text, color=fmt == "text" and console.color_enabled(sys.stdout))
    sys.exit(1 if report.differs else 0)


def _draw_moves(report: Any, path: Any) -> None:
    """The regions that move, a panel per arch, dtype and mode that has any, coloured by how
    they move (old -> new); nothing moves: one empty panel that says so."""
    from topkgen.diff.report import _choice_text
    from topkgen.policy.split import ROWS_MAX

    panels: dict[str, list[dict[str, Any]]] = {}
    for r in report.regions:
        rows = "" if r["rows"] == [1, ROWS_MAX] else f", rows {r['rows'][0]}..{r['rows'][1]}"
        label = f"{_choice_text(r['old'])} -> {_choice_text(r['new'])} [{r['moves']}{rows}]"
        panels.setdefault(f"{r['arch']} {r['dtype']} {r['mode']}", []).append(
            {"k": r["k"], "n": r["n"], "label": label, "hatched": r["moves"] != "split"})
    draw(list(panels.items()) or [("no (k, n) region moves", [])], path,
         f"topkgen diff {printable(report.old.label)} -> {printable(report.new.label)}: the regions whose "
         f"dispatch moves (hatched: another kernel or source; plain: other chunks per row)", "--map")


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
