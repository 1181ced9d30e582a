"""Command-line interface: argument parsing, formatting and exit codes only.

Exit status: 0 success, 1 a failed build or "the sides differ" (diff), 2 usage or input
errors, 70 an internal error (a bug: one line, and the traceback with TOPKGEN_DEBUG=1).
Heavy modules (NVRTC, numpy, the emulator) are imported inside the commands that need them,
so `topkgen plan` stays fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from typing import Any

import click

from topkgen import errors
from topkgen import policy as pol
from topkgen.reader import printable

EXIT_INPUT = 2
EXIT_INTERNAL = 70  # EX_SOFTWARE


class InputError(click.ClickException):
    """Bad input: printed as one line, exit status 2."""

    exit_code = EXIT_INPUT

    def show(self, file: Any = None) -> None:
        click.echo(f"topkgen: error: {printable(self.format_message())}", err=True)


class _Main(click.Group):
    """Every command runs inside one handler, so no traceback reaches a user: input errors
    (topkgen.errors.InputError) exit 2 with one line; anything else is a bug in topkgen and
    exits 70 with one line (and the traceback when TOPKGEN_DEBUG=1)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort,
                SystemExit, KeyboardInterrupt):
            raise
        except errors.InputError as err:
            raise InputError(str(err)) from None
        except BrokenPipeError:  # `topkgen plan | head`: the reader left, nothing to report
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            ctx.exit(1)
        except Exception as err:  # noqa: BLE001 - the one place that catches everything
            if os.environ.get("TOPKGEN_DEBUG", "") not in ("", "0"):
                traceback.print_exc()
            detail = printable(f"{type(err).__name__}: {err}")
            click.echo(f"topkgen: internal error: {detail[:500]}; set TOPKGEN_DEBUG=1 for the traceback", err=True)
            ctx.exit(EXIT_INTERNAL)


def _load_policy(path: str | None) -> pol.Policy:
    try:
        return pol.load(path)
    except pol.PolicyError as err:
        raise InputError(str(err)) from None


def _archs(policy: pol.Policy, requested: tuple[str, ...]) -> list[str]:
    for arch in requested:
        if arch not in policy.archs:
            raise InputError(f"--arch {arch}: not in the policy {policy.display_path} "
                             f"(known: {', '.join(policy.archs)})")
    return list(dict.fromkeys(requested)) or list(policy.archs)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="topkgen")
def main() -> None:
    """Plan, build, explain and diff GPU top-k kernel sets from one YAML policy."""


POLICY_OPTION = click.option("--policy", "policy_path", type=click.Path(dir_okay=False),
                             help="Policy YAML (default: the packaged policies/topk.yaml).")
ARCH_OPTION = click.option("--arch", "archs", multiple=True, metavar="ARCH",
                           help="Architecture(s) to include (default: all in the policy).")


def plan_document(policy: pol.Policy, archs: list[str]) -> dict[str, Any]:
    """The machine-readable plan (schemas/plan.schema.json)."""
    kernels = [spec.record() for arch in archs for spec in pol.plan(policy, arch)]
    totals = {arch: sum(1 for k in kernels if k["arch"] == arch) for arch in archs}
    return {
        "format": "topkgen-plan", "format_version": 1,
        "policy": {"path": policy.display_path, "name": policy.name, "sha256": policy.sha256},
        "archs": archs,
        "kernels": kernels,
        "jit_only": [pol.rule_record(r) for r in policy.jit_only_rules(archs)],
        "totals": {"per_arch": totals, "all": len(kernels)},
    }


@main.command()
@POLICY_OPTION
@ARCH_OPTION
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def plan(policy_path: str | None, archs: tuple[str, ...], fmt: str) -> None:
    """List the AOT kernel set per architecture, and the JIT-only tiers with their reasons."""
    policy = _load_policy(policy_path)
    doc = plan_document(policy, _archs(policy, archs))
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(f"policy {doc['policy']['path']} ({policy.name}, sha256 {policy.sha256[:12]})")
    header = ("kernel", "family", "dtype", "K", "N window", "mode", "work rung", "threads", "CTAs/SM")
    for arch in doc["archs"]:
        rows = [(k["name"], k["family"], k["dtype"], str(k["k"]), _window(k["n_window"]), k["mode"],
                 k["work_rung"], str(k["launch"]["threads_per_block"]), str(k["launch"]["min_ctas_per_sm"]))
                for k in doc["kernels"] if k["arch"] == arch]
        click.echo(f"\n{arch}: {len(rows)} kernels")
        click.echo(_table(header, rows))
    per_arch = ", ".join(f"{a} {n}" for a, n in doc["totals"]["per_arch"].items())
    click.echo(f"\ntotal: {doc['totals']['all']} kernels ({per_arch})")
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


def selection_record(sel: pol.Selection) -> dict[str, Any]:
    return {"kernel": sel.kernel.name, "source": sel.source, "rule": sel.rule, "reason": sel.reason,
            "skipped_jit_rules": list(sel.skipped), "spec": sel.kernel.record()}


@main.command()
@POLICY_OPTION
@click.option("--arch", required=True)
@click.option("--dtype", required=True)
@click.option("--k", "k", type=int, required=True)
@click.option("--n", "n", type=int, required=True)
@click.option("--deterministic", is_flag=True, help="Ask for the deterministic mode.")
@click.option("--no-jit", is_flag=True, help="Only AOT kernels may serve the shape.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def explain(policy_path: str | None, arch: str, dtype: str, k: int, n: int, deterministic: bool,
            no_jit: bool, fmt: str) -> None:
    """Say which kernel serves a shape, AOT or JIT, and the rule that chose it."""
    policy = _load_policy(policy_path)
    try:
        sel = pol.select(policy, arch, dtype, k, n, deterministic=deterministic, jit=not no_jit)
    except pol.DispatchError as err:
        raise InputError(f"--{str(err)}") from None
    if fmt == "json":
        click.echo(json.dumps(selection_record(sel), indent=2))
        return
    mode = "deterministic" if deterministic else "fast"
    click.echo(f"shape:  {arch} {dtype} k={k} n={n} mode={mode}{' (JIT disabled)' if no_jit else ''}")
    click.echo(f"kernel: {sel.kernel.name}")
    click.echo(f"source: {sel.source.upper()}")
    click.echo(f"rule:   {sel.rule}")
    click.echo(f"why:    {sel.reason}")


@main.command()
@POLICY_OPTION
@ARCH_OPTION
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="out", show_default=True,
              help="Bundle directory: <arch>/<kernel>.cubin and manifest.json.")
@click.option("-j", "--jobs", type=click.IntRange(1, 256), default=os.cpu_count() or 1, show_default=True,
              help="Kernels compiled in parallel.")
@click.option("--allow-over-budget", is_flag=True, help="Report kernels over their resource budget without failing.")
@click.option("--force", is_flag=True, help="Replace --out even when it is a directory that is not a bundle.")
def build(policy_path: str | None, archs: tuple[str, ...], out_dir: str, jobs: int, allow_over_budget: bool,
          force: bool) -> None:
    """Render and compile every planned kernel with NVRTC into a cubin bundle and manifest.
    --out must be new, empty or a bundle (else --force); it is checked before compiling."""
    from pathlib import Path

    from topkgen import bundle, compile as nvrtc_compile

    policy = _load_policy(policy_path)
    chosen = _archs(policy, archs)
    total = sum(len(pol.plan(policy, a)) for a in chosen)
    bar = click.progressbar(length=total, label="compiling", file=sys.stderr) if sys.stderr.isatty() else None
    try:
        with bar if bar is not None else contextlib.nullcontext():
            result = bundle.build(policy, chosen, Path(out_dir), jobs=jobs, allow_over_budget=allow_over_budget,
                                  force=force, progress=(lambda _spec: bar.update(1)) if bar is not None else None,
                                  warn=lambda msg: click.echo(f"topkgen: warning: {msg}", err=True))
    except (bundle.BuildError, nvrtc_compile.CompileError) as err:
        click.echo(f"topkgen: build failed, {out_dir} left as it was:\n{err}", err=True)
        sys.exit(1)
    manifest = result.manifest
    counts = {a: sum(1 for k in manifest["kernels"] if k["arch"] == a) for a in chosen}
    size = sum(k["size_bytes"] for k in manifest["kernels"])
    click.echo(f"wrote {out_dir}/manifest.json: {len(manifest['kernels'])} kernels "
               f"({', '.join(f'{a} {n}' for a, n in counts.items())}), {size} bytes of cubin, "
               f"NVRTC {manifest['nvrtc_version']}; {result.compiled} compiled, {result.from_cache} from cache")


@main.command()
@click.argument("old")
@click.argument("new")
@click.option("--policy", "policy_in_repo", default="policies/topk.yaml", show_default=True,
              help="The policy file inside a git revision.")
@click.option("--shapes", "shapes_file", type=click.Path(dir_okay=False),
              help="Workload file (YAML or JSON): a list of {arch, dtype, k, n, deterministic?}.")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown"]), default="text", show_default=True)
def diff(old: str, new: str, policy_in_repo: str, shapes_file: str | None, fmt: str) -> None:
    """Compare kernel sets and dispatch. OLD and NEW: a policy file, a manifest, a bundle
    directory or a git revision. Exit 0 when the same, 1 when they differ, 2 on error."""
    from topkgen import diff as differ

    try:
        shapes = differ.load_shapes(shapes_file) if shapes_file else None
        sides = [differ.load_side(s, policy_in_repo=policy_in_repo) for s in (old, new)]
        report = differ.compare(*sides, shapes, workload=shapes_file)
    except differ.DiffInputError as err:
        raise InputError(str(err)) from None
    if fmt == "json":
        click.echo(json.dumps(differ.to_json(report), indent=2))
    elif fmt == "markdown":
        click.echo(differ.to_markdown(report), nl=False)
    else:
        click.echo(differ.to_text(report, style=click.style))
    sys.exit(1 if report.differs else 0)


@main.command()
@click.option("--bundle", "bundle_dir", required=True, type=click.Path(file_okay=False),
              help="Bundle directory (from topkgen build).")
@click.option("--arch", default=None, help="Target arch (default: the GPU's; required for the emulator).")
@click.option("--backend", type=click.Choice(["cuda", "emulator"]), default="cuda", show_default=True)
@click.option("--k", "k", type=int, required=True)
@click.option("--smallest", is_flag=True, help="The k smallest instead of the k largest.")
@click.option("--deterministic", is_flag=True, help="Ties by lower index, bit-exact run to run.")
@click.option("--dtype", type=click.Choice(["bfloat16", "float16"]), default=None,
              help="How to read a raw uint16 input (default bfloat16).")
@click.argument("input_path", metavar="IN.npy", type=click.Path(dir_okay=False))
@click.option("-o", "--output", "output_path", required=True, type=click.Path(dir_okay=False),
              help="OUT.npz with arrays 'values' and 'indices'.")
@click.option("--force", is_flag=True, help="Replace -o even when it is not the output of an earlier run.")
def run(bundle_dir: str, arch: str | None, backend: str, k: int, smallest: bool, deterministic: bool,
        dtype: str | None, input_path: str, output_path: str, force: bool) -> None:
    """Top-k over the last dimension of IN.npy with the bundle's kernels (or JIT)."""
    import io
    from pathlib import Path

    import numpy as np

    from topkgen.destinations import check_output_file
    from topkgen.npyfile import read_npy
    from topkgen.paths import atomic_write
    from topkgen.runtime import TopK, TopKError, dtype_name

    check_output_file(Path(output_path), force=force, inputs=(Path(input_path),))
    x = read_npy(input_path)
    try:
        op = TopK(bundle_dir, arch=arch, backend=backend)
        sel = op.explain(dtype_name(str(x.dtype), dtype), k, x.shape[-1], deterministic)
        if backend == "cuda":
            values, indices = _run_on_gpu(op, x, k, smallest, deterministic, dtype)
        else:
            values, indices = op(x, k, largest=not smallest, deterministic=deterministic, dtype=dtype)
    except TopKError as err:
        raise InputError(str(err)) from None
    buffer = io.BytesIO()
    np.savez(buffer, values=values, indices=indices)
    try:
        atomic_write(Path(output_path), buffer.getvalue())
    except OSError as err:
        raise InputError(f"-o {output_path}: cannot write: {err.strerror}") from None
    click.echo(f"{output_path}: values {values.dtype}{list(values.shape)}, indices int64{list(indices.shape)} "
               f"by {sel.kernel.name} ({sel.source.upper()})")


def _run_on_gpu(op: Any, x: Any, k: int, smallest: bool, deterministic: bool, dtype: str | None):
    """Host arrays go through device buffers that cuda.core allocates."""
    import numpy as np

    from topkgen.gpu_arrays import DeviceArray
    from topkgen.runtime import _cuda_core

    device = _cuda_core().Device()
    stream = device.default_stream
    dx = DeviceArray.from_host(np.ascontiguousarray(x), device, stream)
    shape = (*x.shape[:-1], k)
    values = DeviceArray.empty(shape, x.dtype, device, stream)
    indices = DeviceArray.empty(shape, np.dtype(np.int64), device, stream)
    op(dx, k, largest=not smallest, deterministic=deterministic, out=(values, indices), dtype=dtype, stream=stream)
    stream.sync()
    return values.to_host(stream), indices.to_host(stream)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
