"""`topkgen map`: a picture of which kernel serves each (k, n) region, per arch, dtype and
mode. On the terminal a character grid sampled at powers of two; with -o an SVG or PNG of the
exact regions (the policy's dispatch table, the rectangles a loader looks up), drawn with
matplotlib, the optional `topkgen[plot]` extra."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from topkgen import policy as pol
from topkgen.cli.group import InputError, main
from topkgen.cli.options import ARCH_OPTION, POLICY_OPTION, Count, DtypeType, PathArg, _archs
from topkgen.common.reader import printable
from topkgen.policy.split import ROWS_MAX

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
K_MARKS = [1 << i for i in range(11)]   # 1 .. 1024
N_MARKS = [1 << i for i in range(32)]   # 1 .. 2^31: the last stands for 2^31-1
FORMATS = (".svg", ".png")


def regions(policy: pol.Policy, arch: str, dtype: str, mode: str, rows: int | None) -> list[dict[str, Any]]:
    """The dispatch table's boxes that hold the batch size `rows` (None: unknown, served
    unsplit, the rows = 2^31-1 boxes), as {k: [lo, hi], n: [lo, hi], kernel, source, chunks}."""
    from topkgen.policy.dispatch_table import build_list

    wanted = ROWS_MAX if rows is None else rows
    return [{"k": r["k"], "n": r["n"], "kernel": r["kernel"], "source": r["source"],
             "chunks": r["chunks"] if rows is not None else 1}
            for r in build_list(policy, arch, dtype, mode) if r["rows"][0] <= wanted <= r["rows"][1]]


def _serving(boxes: list[dict[str, Any]], k: int, n: int) -> dict[str, Any] | None:
    return next((b for b in boxes if b["k"][0] <= k <= b["k"][1] and b["n"][0] <= n <= b["n"][1]), None)


def _legend_key(box: dict[str, Any]) -> str:
    chunks = f", {box['chunks']} chunks" if box["chunks"] > 1 else ""
    return f"{box['kernel']} ({box['source']}{chunks})"


def text_map(title: str, boxes: list[dict[str, Any]]) -> list[str]:
    """A character per (k, n) at powers of two (n = 2^31 stands for 2^31-1); `.` where
    n < k, outside the domain; then the legend."""
    legend: dict[str, str] = {}
    lines = [title, "  k \\ n   " + _n_labels()]
    for k in reversed(K_MARKS):
        row = []
        for n in N_MARKS:
            n = min(n, pol.N_MAX)
            box = _serving(boxes, k, n) if n >= k else None
            if box is None:
                row.append(".")
                continue
            key = _legend_key(box)
            if key not in legend:
                legend[key] = LETTERS[len(legend)] if len(legend) < len(LETTERS) else "?"
            row.append(legend[key])
        lines.append(f"  {k:>6}  " + "".join(row))
    lines.append("          n = 2^0 .. 2^31-1, one column per power of two; '.' is n < k")
    lines += [f"  {letter}  {key}" for key, letter in legend.items()]
    return lines


def _n_labels() -> str:
    """2^0, 2^10, 2^20 and 2^30 over their columns."""
    labels = [" "] * (len(N_MARKS) + 3)
    for exponent in (0, 10, 20, 30):
        for i, char in enumerate(f"2^{exponent}"):
            labels[exponent + i] = char
    return "".join(labels).rstrip()


def labelled(boxes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A map's boxes as `draw` takes them: labelled by their kernel, hatched where JIT serves."""
    return [{**box, "label": _legend_key(box), "hatched": box["source"] == "jit"} for box in boxes]


def check_picture(output: str, option: str = "-o") -> Path:
    """An .svg or .png file to draw into (the suffix says which)."""
    path = Path(output)
    if path.suffix.lower() not in FORMATS:
        raise InputError(f"{option} {printable(output)}: name an .svg or .png file")
    return path


def draw(panels: list[tuple[str, list[dict[str, Any]]]], path: Path, title: str, option: str = "-o") -> None:
    """Every panel's boxes ({k, n, label, hatched}) as rectangles on log2 axes (n across, k up),
    one colour per label, written as SVG or PNG by the file's suffix."""
    try:
        import matplotlib
    except ImportError:
        raise InputError(f"{option}: drawing needs matplotlib: pip install 'topkgen[plot]'"
                         + (" (or leave -o out for the text map)" if option == "-o" else "")) from None
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"  # names stay text: searchable, and the file smaller
    matplotlib.rcParams["svg.hashsalt"] = "topkgen"  # the same SVG for the same policy
    from matplotlib import pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    columns = min(2, len(panels))
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(9 * columns, 5 * rows), squeeze=False)
    palette = plt.get_cmap("tab20").colors
    for ax, (panel, boxes) in zip(axes.flat, panels):
        colours: dict[str, Any] = {}
        hatched = {box["label"] for box in boxes if box["hatched"]}
        for box in boxes:
            colour = colours.setdefault(box["label"], palette[len(colours) % len(palette)])
            n_lo, n_hi = max(box["n"][0], box["k"][0]), box["n"][1] + 1
            ax.add_patch(Rectangle((n_lo, box["k"][0]), n_hi - n_lo, box["k"][1] + 1 - box["k"][0],
                                   facecolor=colour, edgecolor="white", linewidth=0.4,
                                   hatch="//" if box["hatched"] else None))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlim(1, 2.0 ** 31)
        ax.set_ylim(1, 1025)
        ax.set_xlabel("n (row length)")
        ax.set_ylabel("k")
        ax.set_title(panel, fontsize=10)
        ax.legend(handles=[Patch(facecolor=c, label=k, hatch="//" if k in hatched else None)
                           for k, c in colours.items()], fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1))
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    figure.suptitle(title)
    figure.tight_layout()
    try:
        figure.savefig(path, format=path.suffix[1:], metadata={"Date": None} if path.suffix == ".svg" else None)
    except OSError as err:
        raise InputError(f"{option} {printable(str(path))}: cannot write: {err.strerror}") from None
    finally:
        plt.close(figure)


@main.command("map", short_help="Draw which kernel serves each (k, n) region.", epilog="""\b
Examples:
  topkgen map --arch sm_90 --dtype bf16                 a text map per mode
  topkgen map --arch sm_90 --rows 8 -o sm90.svg         the exact regions, split plans of 8 rows
  topkgen map -o all.png                                every arch, dtype and mode

-o needs matplotlib: pip install 'topkgen[plot]'.""")
@POLICY_OPTION
@ARCH_OPTION
@click.option("--dtype", "dtypes", type=DtypeType(), multiple=True, help="Element type(s); default: all the policy's.")
@click.option("--mode", "modes", type=click.Choice(list(pol.MODES)), multiple=True,
              help="fast or deterministic; default: both.")
@click.option("--rows", type=Count(1, ROWS_MAX), default=None,
              help="Batch size, for the split plans of small batches (default: unknown, unsplit).")
@click.option("-o", "--output", "output", type=PathArg(dir_okay=False), default=None, metavar="OUT.svg|OUT.png",
              help="Draw the exact regions into an SVG or PNG file (needs matplotlib); default: a text map.")
def map_command(policy_path: str | None, archs: tuple[str, ...], dtypes: tuple[str, ...], modes: tuple[str, ...],
                rows: int | None, output: str | None) -> None:
    """Draw, per arch, dtype and mode, which kernel serves each (k, n) region of the policy."""
    policy = pol.load(policy_path)
    chosen = _archs(policy, archs)
    for dtype in dtypes:
        if dtype not in policy.dtypes:
            raise InputError(f"--dtype {dtype}: not in the policy (known: {', '.join(policy.dtypes)})")
    path = check_picture(output) if output is not None else None
    panels = [(f"{arch} {dtype} {mode}" + ("" if rows is None else f", {rows} rows"),
               regions(policy, arch, dtype, mode, rows))
              for arch in chosen for dtype in (dtypes or policy.dtypes) for mode in (modes or pol.MODES)]
    if path is None:
        for i, (title, boxes) in enumerate(panels):
            click.echo(("\n" if i else "") + "\n".join(text_map(title, boxes)))
        return
    draw([(title, labelled(boxes)) for title, boxes in panels], path,
         "topkgen map: the kernel that serves each (k, n); hatched: JIT, compiled on first use")
    click.echo(f"{printable(output)}: {len(panels)} map(s) of {sum(len(b) for _, b in panels)} regions")
