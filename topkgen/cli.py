"""Command-line interface: argument parsing, formatting and exit codes only.

Exit status: 0 success, 1 a failed build or "the sides differ" (diff), 2 usage or input
errors (for diff, any trouble), 70 an internal error (a bug: one line, and the traceback with
TOPKGEN_DEBUG=1). Heavy modules (NVRTC, numpy, the emulator) are imported inside the
commands that need them, so `topkgen plan` stays fast.
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
@click.option("--shard", "shard_text", metavar="I/N",
              help="Build only shard I of N (1-based) of the plan; `topkgen merge` joins the shards.")
@click.option("--force", is_flag=True, help="Replace --out even when it is a directory that is not a bundle.")
def build(policy_path: str | None, archs: tuple[str, ...], out_dir: str, jobs: int, allow_over_budget: bool,
          shard_text: str | None, force: bool) -> None:
    """Render and compile every planned kernel with NVRTC into a cubin bundle and manifest.
    --out must be new, empty or a bundle (else --force); it is checked before compiling.

    The compile cache is TOPKGEN_CACHE_DIR (local), then TOPKGEN_CACHE_URL (any fsspec URL,
    shared by CI jobs; TOPKGEN_CACHE_READONLY=1 reads it without writing)."""
    from pathlib import Path

    from topkgen import bundle, cache, compile as nvrtc_compile, shards

    policy = _load_policy(policy_path)
    chosen = _archs(policy, archs)
    try:
        shard = shards.parse(shard_text) if shard_text is not None else None
    except shards.ShardError as err:
        raise InputError(str(err)) from None
    specs = [s for a in chosen for s in pol.plan(policy, a)]
    total = len(shards.share(specs, *shard)) if shard else len(specs)
    bar = click.progressbar(length=total, label="compiling", file=sys.stderr) if sys.stderr.isatty() else None
    try:
        with bar if bar is not None else contextlib.nullcontext():
            result = bundle.build(policy, chosen, Path(out_dir), jobs=jobs, allow_over_budget=allow_over_budget,
                                  force=force, progress=(lambda _spec: bar.update(1)) if bar is not None else None,
                                  warn=lambda msg: click.echo(f"topkgen: warning: {msg}", err=True), shard=shard)
    except cache.CacheConfigError as err:
        raise InputError(str(err)) from None
    except (bundle.BuildError, nvrtc_compile.CompileError, cache.CacheError) as err:
        click.echo(f"topkgen: build failed, {out_dir} left as it was:\n{err}", err=True)
        sys.exit(1)
    manifest = result.manifest
    counts = {a: sum(1 for k in manifest["kernels"] if k["arch"] == a) for a in chosen}
    size = sum(k["size_bytes"] for k in manifest["kernels"])
    of_plan = f"shard {shard[0]}/{shard[1]} of {len(specs)}: " if shard else ""
    click.echo(f"wrote {out_dir}/manifest.json: {of_plan}{len(manifest['kernels'])} kernels "
               f"({', '.join(f'{a} {n}' for a, n in counts.items())}), {size} bytes of cubin, "
               f"NVRTC {manifest['nvrtc_version']}")
    _print_cache_stats(result.cache)


def _print_cache_stats(stats: Any) -> None:
    """The statistics line every build prints, and the remote tier's warnings."""
    line = (f"cache: {stats.kernels} kernels: {stats.local_hits} local hits, {stats.remote_hits} remote hits, "
            f"{stats.compiled} compiled")
    if stats.remote is None:
        line += "; no remote (TOPKGEN_CACHE_URL unset)"
    else:
        line += (f"; {_size(stats.remote_read)} read from, {_size(stats.remote_written)} written to "
                 f"{stats.remote}{' (read-only)' if stats.readonly else ''}")
    click.echo(line)
    if stats.rejected:
        click.echo(f"topkgen: warning: {stats.rejected} remote entries failed sha256 verification and were "
                   f"compiled here instead", err=True)
    for error in stats.errors[:3]:
        click.echo(f"topkgen: warning: remote cache unavailable, compiled instead: {error}", err=True)


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


@main.command()
@click.argument("parts", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="The full bundle to write.")
def merge(parts: tuple[str, ...], out_dir: str) -> None:
    """Join the bundles of `build --shard I/N` into the full bundle. Refuses (exit 2) unless
    the parts share policy, generator, toolchain and plan, cover it exactly once, and every
    cubin verifies."""
    from pathlib import Path

    from topkgen import shards

    try:
        manifest = shards.merge([Path(p) for p in parts], Path(out_dir))
    except shards.ShardError as err:
        raise InputError(str(err)) from None
    counts = {a: sum(1 for k in manifest["kernels"] if k["arch"] == a) for a in manifest["archs"]}
    click.echo(f"merged {len(parts)} shards into {out_dir}/manifest.json: {len(manifest['kernels'])} kernels "
               f"({', '.join(f'{a} {n}' for a, n in counts.items())})")


@main.group("cache")
def cache_group() -> None:
    """The compile cache: seed it from a bundle, verify its entries."""


@cache_group.command("import")
@click.argument("bundle_dir", metavar="BUNDLE", type=click.Path(file_okay=False))
def cache_import(bundle_dir: str) -> None:
    """Fill the compile cache from a bundle (a release, a base revision's build), so that
    builds of the same kernels compile nothing."""
    from pathlib import Path

    from topkgen import cache, cache_admin

    try:
        result = cache_admin.import_bundle(Path(bundle_dir))
    except (cache_admin.CacheInputError, cache.CacheConfigError) as err:
        raise InputError(str(err)) from None
    except cache.CacheError as err:
        click.echo(f"topkgen: error: {err}", err=True)
        sys.exit(1)
    where = f" and {result.remote} ({_size(result.remote_written)} written)" if result.remote else ""
    click.echo(f"imported {bundle_dir}: {result.added} entries added, {result.present} already present, "
               f"{len(result.skipped)} skipped, of {result.kernels} kernels, into the local cache{where}")
    if result.skipped:
        click.echo(f"  skipped (this checkout renders a different source): {', '.join(result.skipped)}")
    if not result.toolchain_matches:
        click.echo("  note: the bundle's toolchain differs from this machine's; its entries serve only builds "
                   "with that toolchain")


@cache_group.command("verify")
@click.option("--sample", "percent", type=click.FloatRange(0, 100, min_open=True), required=True, metavar="P",
              help="Percentage of entries to recompile and compare.")
@click.option("--remote", is_flag=True, help="Verify TOPKGEN_CACHE_URL's entries instead of the local cache.")
@click.option("--seed", type=int, default=None, help="Choose the sample with this seed (default: random, printed).")
@click.option("-j", "--jobs", type=click.IntRange(1, 256), default=os.cpu_count() or 1, show_default=True)
def cache_verify(percent: float, remote: bool, seed: int | None, jobs: int) -> None:
    """Recompile a sample of cache entries with this machine's toolchain and compare bytes.
    Exit 1 when an entry differs."""
    from topkgen import cache, cache_admin

    try:
        result = cache_admin.verify(percent, remote=remote, seed=seed, jobs=jobs)
    except (cache_admin.CacheInputError, cache.CacheConfigError) as err:
        raise InputError(str(err)) from None
    click.echo(f"verified {result.sampled} of {result.entries} entries in {result.store} "
               f"({percent:g}%, seed {result.seed}): {result.identical} identical, {len(result.problems)} wrong, "
               f"{result.skipped} skipped (another toolchain)")
    for problem in result.problems:
        click.echo(f"  {problem}")
    sys.exit(1 if result.problems else 0)


def color_enabled(stream: Any) -> bool:
    """Colour on a terminal only, never when NO_COLOR is set (no-color.org). The one place
    that decides it, so a global --color option can take the decision over."""
    return not os.environ.get("NO_COLOR") and bool(getattr(stream, "isatty", lambda: False)())


@main.command()
@click.argument("old")
@click.argument("new", required=False)
@click.option("--policy", "policy_in_repo", default="policies/topk.yaml", show_default=True,
              help="The policy file inside a git revision or the working tree, from the repository's top.")
@click.option("--shapes", "shapes_file", type=click.Path(dir_okay=False),
              help="Workload file (YAML or JSON): a list of {arch, dtype, k, n, deterministic?}.")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown"]), default="text", show_default=True)
@click.option("--build", "build", is_flag=True,
              help="Compile both sides (through the compile cache) and compare registers, spills, stack, "
                   "shared memory, cubin size and budgets.")
@click.option("-j", "--jobs", type=click.IntRange(1, 256), default=os.cpu_count() or 1, show_default=True,
              help="Kernels compiled in parallel with --build.")
@click.option("--stat", is_flag=True, help="Print the summary only (text or markdown).")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing; the exit status says whether the sides differ.")
def diff(old: str, new: str | None, policy_in_repo: str, shapes_file: str | None, fmt: str, build: bool,
         jobs: int, stat: bool, quiet: bool) -> None:
    """Compare kernel sets, their rendered sources and dispatch. OLD and NEW: a policy file, a
    manifest, a bundle directory or a git revision (policy and templates read from git); OLD
    alone is a revision compared with the working tree. Exit 0 when the same, 1 when they
    differ, 2 on error."""
    from topkgen import diff as differ, diff_report

    if stat and fmt == "json":
        raise InputError("--stat: prints the text or markdown summary; the json always holds it under 'summary'")
    try:
        shapes = differ.load_shapes(shapes_file) if shapes_file else None
        sides = [differ.load_side(old, policy_in_repo=policy_in_repo)]
        if new is None and sides[0].kind != "revision":
            raise InputError(f"NEW is missing: only a git revision may stand alone (it is compared with the "
                             f"working tree), and {old} is a {sides[0].kind}")
        sides.append(differ.load_side(new, policy_in_repo=policy_in_repo) if new is not None
                     else differ.load_worktree_side(policy_in_repo=policy_in_repo))
        if build:
            _build_diff_sides(differ, sides, jobs, show_progress=not quiet)
        report = differ.compare(*sides, shapes, workload=shapes_file)
    except differ.DiffInputError as err:
        raise InputError(str(err)) from None
    if not quiet:
        if fmt == "json":
            text = json.dumps(diff_report.to_json(report), indent=2) + "\n"
        elif fmt == "markdown":
            text = diff_report.to_markdown(report, summary_only=stat)
        else:
            text = diff_report.to_text(report, style=click.style, summary_only=stat) + "\n"
        _write_stdout(text, color=fmt == "text" and color_enabled(sys.stdout))
    sys.exit(1 if report.differs else 0)


def _build_diff_sides(differ: Any, sides: list[Any], jobs: int, show_progress: bool) -> None:
    """Compile both sides with a progress bar on a terminal; any failure is trouble (exit 2)."""
    from topkgen import compile as nvrtc_compile

    total = differ.kernels_to_build(sides)
    bar = click.progressbar(length=total, label="compiling both sides", file=sys.stderr) \
        if show_progress and total and sys.stderr.isatty() else None
    try:
        with bar if bar is not None else contextlib.nullcontext():
            differ.build_sides(sides, jobs, (lambda _spec: bar.update(1)) if bar is not None else None)
    except nvrtc_compile.CompileError as err:
        raise InputError(f"--build: {err}") from None
    except (OSError, RuntimeError) as err:  # the compile cache, the CUDA headers, NVRTC itself
        raise InputError(f"--build: cannot compile: {err}") from None


def _write_stdout(text: str, *, color: bool) -> None:
    """A reader that closes the pipe early (`| head`) is not an error of ours."""
    try:
        click.echo(text, nl=False, color=color)
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


@main.command()
@click.argument("bundle_dir", metavar="BUNDLE", type=click.Path(file_okay=False))
@click.option("--arch", "archs", multiple=True, metavar="ARCH", help="Architecture(s) to show (default: all in the bundle).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--dispatch", "with_dispatch", is_flag=True, help="Also show the dispatch table.")
def show(bundle_dir: str, archs: tuple[str, ...], fmt: str, with_dispatch: bool) -> None:
    """What a bundle holds: kernels and their resources, JIT sources, dispatch. Checks every file as a loader does."""
    from topkgen import bundle

    try:
        manifest, root = bundle.load_manifest(bundle_dir)
        bundle.read_files(root, manifest)
    except bundle.ManifestError as err:
        raise InputError(str(err)) from None
    for arch in archs:
        if arch not in manifest["archs"]:
            raise InputError(f"--arch {arch}: not in the bundle {bundle_dir} (holds: {', '.join(manifest['archs'])})")
    chosen = list(dict.fromkeys(archs)) or manifest["archs"]
    doc = {"format": "topkgen-show", "format_version": 1, "schema_version": manifest["schema_version"],
           "nvrtc_version": manifest["nvrtc_version"], "policy": {k: manifest["policy"][k] for k in ("path", "name", "sha256")},
           "archs": chosen,
           "kernels": [e for e in manifest["kernels"] if e["arch"] in chosen],
           "jit_kernels": [e for e in manifest["jit_kernels"] if e["arch"] in chosen]}
    if with_dispatch:
        doc["dispatch"] = {arch: manifest["dispatch"][arch] for arch in chosen}
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(f"bundle {bundle_dir}: manifest schema {doc['schema_version']}, NVRTC {doc['nvrtc_version']}, "
               f"policy {doc['policy']['path']} ({doc['policy']['name']}, sha256 {doc['policy']['sha256'][:12]})")
    for arch in chosen:
        kernels = [e for e in doc["kernels"] if e["arch"] == arch]
        click.echo(f"\n{arch}: {len(kernels)} AOT kernels, {sum(e['size_bytes'] for e in kernels)} bytes of cubin")
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
                    click.echo(_table(("k", "n", "kernel", "source", "without JIT"),
                                      [(_span(r["k"]), _span(r["n"]), r["kernel"], r["source"].upper(),
                                        "same" if r["aot_fallback"] == r["kernel"] else r["aot_fallback"] or "none")
                                       for r in by_mode[mode]]))


def _kernel_row(e: dict[str, Any]) -> tuple[str, ...]:
    r, b = e["resources"], e["budget"]
    return (e["name"], e["dtype"], str(e["k"]), _window(e["n_window"]), "/".join(e["serves"]),
            str(e["launch"]["threads_per_block"]), str(r["registers"]), f"{r['spill_stores']}/{r['spill_loads']}",
            str(r["stack_bytes"]), str(r["static_shared_bytes"]), str(e["launch"]["dynamic_shared_bytes"]),
            str(e["size_bytes"]), f"{b['max_registers']} regs, {'spills ok' if b['spills_allowed'] else 'no spills'}")


def _span(bounds: list[int]) -> str:
    lo, hi = bounds
    return _window({"min": lo, "max": hi})


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
