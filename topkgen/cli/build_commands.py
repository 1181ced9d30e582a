"""`topkgen build`, `merge` and `cache`: compiling the plan into a bundle, joining shards,
and seeding or verifying the compile cache."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from topkgen.cli import console, standard_output
from topkgen import policy as pol
from topkgen.common.reader import printable
from topkgen.cli.group import InputError, _Group, main
from topkgen.cli.options import (
    ARCH_OPTION, JOBS_HELP, POLICY_OPTION, BundleArg, BundleOutputArg, Count, _archs, _kernels_per_arch)


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
@click.option("--verify-cache", "verify_percent", type=click.FloatRange(0, 100), default=0, metavar="P",
              help="Recompile about P% of the kernels the compile cache serves (chosen by key) and fail, naming "
                   "the entry, if one differs.")
@click.option("--provenance", "provenance_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Write where each kernel came from (local cache, remote, NVRTC) to FILE, outside the bundle; "
                   "TOPKGEN_CACHE_PINS=FILE then pins a cache to that build's cubins.")
def build(policy_path: str | None, archs: tuple[str, ...], out_dir: str, jobs: int, allow_over_budget: bool,
          shard_text: str | None, force: bool, verify_percent: float, provenance_path: str | None) -> None:
    """Render and compile every planned kernel with NVRTC into a cubin bundle and its
    manifest, through the compile cache. A failed build leaves --out as it was."""
    standard_output.report_only()

    from topkgen.build import bundle, cache, compile as nvrtc_compile, shards

    policy = pol.load(policy_path)
    chosen = pol.in_policy_order(policy, _archs(policy, archs))
    specs = [s for a in chosen for s in pol.plan(policy, a)]
    shard = shards.parse(shard_text, len(specs)) if shard_text is not None else None
    total = len(shards.share(specs, *shard)) if shard else len(specs)
    if provenance_path is not None:
        _check_provenance_path(Path(provenance_path), Path(out_dir))
    try:
        with console.BuildProgress(total, label="building", stream=sys.stdout, lines=True) as progress:
            result = bundle.build(policy, chosen, Path(out_dir), jobs=jobs, allow_over_budget=allow_over_budget,
                                  force=force, warn=console.warning, shard=shard, verify_percent=verify_percent,
                                  progress=lambda spec, compiled, s: progress(spec.name, compiled.outcome.origin, s))
    except cache.CacheConfigError as err:
        raise InputError(str(err)) from None
    except bundle.BundleDiskFull as err:  # the disk, not the kernels: one line, exit 2
        raise InputError(f"build: {out_dir} left as it was: {err}") from None
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
    if verify_percent:
        click.echo(f"  verified: {result.cache.verified} of {result.cache.local_hits + result.cache.remote_hits} "
                   f"cached kernels recompiled to the same cubin (--verify-cache {verify_percent:g})")
    if provenance_path is not None:
        from topkgen.build import cache_trust

        try:
            cache_trust.write_provenance(Path(provenance_path), result.provenance)
        except OSError as err:
            raise InputError(f"--provenance: cannot write {printable(provenance_path)}: {err.strerror}") from None


def _check_provenance_path(path: Path, out: Path) -> None:
    """--provenance names a file outside the bundle (which holds its own files only), before
    any compile."""
    resolved, bundle = path.resolve(), out.resolve()
    if resolved == bundle or bundle in resolved.parents:
        raise InputError(f"--provenance: {printable(str(path))} is inside the bundle {printable(str(out))}; "
                         f"a bundle holds its own files only")
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise InputError(f"--provenance: {printable(str(path))} is not a regular file")


def _cache_stats(stats: Any) -> str:
    """Where the build's kernels came from: the compile cache's tiers, or NVRTC."""
    line = f"cache: {stats.local_hits} local hits, {stats.remote_hits} remote hits, {stats.compiled} compiled"
    if stats.remote is None:
        return line + "; no remote (TOPKGEN_CACHE_URL unset)"
    return (line + f"; {console.size(stats.remote_read)} read from, {console.size(stats.remote_written)} written to "
            f"{stats.remote}{' (read-only)' if stats.readonly else ''}")


def _cache_warnings(stats: Any) -> None:
    if stats.unpinned:
        console.warning(f"{stats.unpinned} of the remote's entries are not pinned by TOPKGEN_CACHE_PINS and were "
                        f"compiled here instead (and not copied into the local cache)")
    if stats.rejected:
        console.warning(f"{stats.rejected} of the remote's entries failed verification (sha256, the loaders' "
                        f"checks of the cubin, or TOPKGEN_CACHE_PINS) and were compiled here instead")
    for error in stats.errors[:3]:
        console.warning(f"remote cache unavailable, compiled instead: {error}")
    if stats.local_errors:  # disk full, say: the bundle is complete, the next build compiles these again
        console.warning(f"the compile cache could not be written, so kernels compiled now are not cached: "
                        f"{stats.local_errors[0]}")


# ----------------------------------------------------------------------------- merge, cache

@main.command(short_help="Join the bundles of build --shard, or of build --arch, into one.")
@click.argument("parts", nargs=-1, required=True, type=BundleArg())
@click.option("--out", "out_dir", required=True, type=BundleOutputArg("merge"), metavar="DIR",
              help="The full bundle to write. Must be new, empty or a bundle (else --force), and not a part.")
@click.option("--force", is_flag=True, help="Replace --out even when it is a directory that is not a bundle.")
def merge(parts: tuple[str, ...], out_dir: str, force: bool) -> None:
    """Join the bundles of `build --shard I/N` into the full bundle, or bundles of other archs
    (`build --arch A`) into the bundle of all their archs; either is byte-identical to a single
    build. Refuses (exit 2) unless the parts share policy, generator and toolchain, shards
    cover their plan exactly once, archs come once, and every cubin verifies."""
    standard_output.report_only()

    from topkgen.build import bundle, merge as merging

    try:
        manifest = merging.merge([Path(p) for p in parts], Path(out_dir), force=force)
    except bundle.BuildError as err:  # the bundle could not be written
        raise InputError(str(err)) from None
    from topkgen.manifest import reading as manifests

    kind = "shards" if "shard" in manifests.load_manifest(parts[0])[0] else "bundles"  # checked by merge
    click.echo(f"merged {len(parts)} {kind} into {printable(str(Path(out_dir) / 'manifest.json'))}: "
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
