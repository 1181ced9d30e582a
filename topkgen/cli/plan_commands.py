"""`topkgen plan` and `topkgen explain`: the kernel set a policy builds, and which kernel
serves a shape and why. Neither compiles nor imports NVRTC, so both stay fast."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import click

from topkgen.cli import console
from topkgen import policy as pol
from topkgen.common.reader import printable
from topkgen.policy.split import ROWS_MAX
from topkgen.cli.group import InputError, main
from topkgen.cli.options import (
    ARCH_OPTION, DTYPE_HELP, K_OPTION, POLICY_OPTION, ArchType, Count, DtypeType, _ArchHelpOption, _arch_counts,
    WIDE_OPTION, _archs, _check_arch, _kernels_per_arch, _policy_label, _table)
PLAN_SCHEMA_VERSION = 2  # schemas/plan.schema.json
# Left out, in this order, until a table fits the terminal (the kernel's name tells its family,
# dtype and K; --wide shows them all).
PLAN_DROPS = ("CTAs/SM", "threads", "family", "work rung", "dtype")


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
@WIDE_OPTION
def plan(policy_path: str | None, archs: tuple[str, ...], fmt: str, wide: bool) -> None:
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
        click.echo(_table(header, rows, width=console.table_width(wide), drop=PLAN_DROPS))
    click.echo(f"\ntotal: {_kernels_per_arch(doc['kernels'], doc['archs'])}")
    click.echo("\nJIT-only tiers (never in the bundle):")
    if not doc["jit_only"]:
        click.echo("  none")
    width = console.table_width(wide)
    for tier in doc["jit_only"]:
        click.echo(f"  {tier['rule']}: {tier['family']} K={'/'.join(map(str, tier['k']))} "
                   f"N{_tier_n(tier['n'])} on {', '.join(tier['archs'])}")
        reason = f"reason: {tier['reason']}"
        click.echo(textwrap.fill(reason, width, initial_indent="    ", subsequent_indent="      ") if width
                   else f"    {reason}")
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


# ----------------------------------------------------------------------------- explain

@main.command("explain", short_help="Say which kernel serves a shape, and why.", epilog="""\b
Examples:
  topkgen explain --arch sm_90 --dtype float32 --k 16 --n 2048
  topkgen explain --arch sm_90 --dtype float32 --k 256 --n 131072 --rows 1
  topkgen explain --arch sm_100 --dtype bf16 --k 300 --n 100000 --deterministic --format json
  topkgen explain --gpu-arch sm_86 --dtype float32 --k 40 --n 3000 --bundle out""")
@POLICY_OPTION
@click.option("--arch", cls=_ArchHelpOption, type=ArchType(), default=None, metavar="ARCH",
              help="Architecture: one of the policy's ({archs} in the packaged default policy). Or --gpu-arch.")
@click.option("--gpu-arch", "gpu_arch", default=None, metavar="GPU",
              help="Instead of --arch: a GPU's arch (sm_86, sm_103, sm_110); says which binary serves it (its own "
                   "cubins, a lower minor's, shipped PTX, JIT, or a refusal) and explains the shape on it.")
@click.option("--bundle", "bundle", type=click.Path(), default=None, metavar="DIR",
              help="With --gpu-arch: the bundle whose binaries serve it (default: a full build of the policy, "
                   "shared memory estimated from the policy).")
@click.option("--dtype", type=DtypeType(), required=True, help=DTYPE_HELP)
@K_OPTION
@click.option("--n", "n", type=Count(1, pol.N_MAX), required=True, help="Row length (at least k).")
@click.option("--rows", "rows", type=Count(0, ROWS_MAX), default=None,
              help="Batch size: small batches of long rows may be split across CTAs, and this shows the chunk "
                   "plan (0, an empty batch, launches nothing). Without it: one CTA per row.")
@click.option("--deterministic", is_flag=True, help="Ask for the deterministic mode (ties by lower index).")
@click.option("--no-jit", is_flag=True, help="Only AOT kernels may serve the shape.")
@click.option("--sm-count", "sm_count", type=Count(1, 1024), default=None, metavar="N",
              help="Plan the split for a GPU of N SMs (H100 PCIe 114, H20 78) instead of the part the policy's "
                   "split section names (H200's 132 for sm_90); the runtime takes the GPU's own.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: schemas/explain.schema.json, the request echoed.")
def explain_command(policy_path: str | None, arch: str | None, gpu_arch: str | None, bundle: str | None, dtype: str,
                    k: int, n: int, rows: int | None, deterministic: bool, no_jit: bool, sm_count: int | None,
                    fmt: str) -> None:
    """Say which kernel serves a shape, aot or jit, and the rule that chose it."""
    from topkgen.policy.explain import explain

    binary = None
    if (arch is None) == (gpu_arch is None):
        raise InputError("--arch: give --arch ARCH or --gpu-arch GPU" + (", not both" if arch else ""))
    if bundle is not None and gpu_arch is None:
        raise InputError("--bundle: only with --gpu-arch (the bundle whose binaries serve the GPU)")
    if gpu_arch is not None:
        policy, binary = _gpu_binary(policy_path, bundle, gpu_arch, jit=not no_jit)
        arch = binary.arch
    else:
        policy = pol.load(policy_path)
    _check_arch(policy, arch)
    if sm_count is not None:
        if policy.archs[arch].split is None:
            raise InputError(f"--sm-count: {arch} has no split section in {_policy_label(policy)}: its batches are "
                             f"never split, whatever the GPU's SM count")
        policy = policy.with_sm_count(arch, sm_count)
    try:
        answer = explain(policy, arch, dtype, k, n, deterministic=deterministic, jit=not no_jit, rows=rows)
    except pol.DispatchError as err:
        message = str(err)  # "k: ..." names its option; "no kernel serves ..." is what --no-jit left
        named = message.split(":", 1)[0] in ("arch", "dtype", "k", "n", "rows")
        raise InputError(f"--{message}" if named else f"--no-jit: {message}") from None
    if binary is not None:
        answer = _on_gpu(answer, binary)
    click.echo(json.dumps(answer.record(), indent=2) if fmt == "json" else str(answer))


def _gpu_binary(policy_path: str | None, bundle: str | None, gpu: str, *, jit: bool):
    """The policy that decides and the binary serving `gpu`: a bundle's (its embedded policy),
    or a full build's of the policy."""
    from topkgen.cli.gpu_arch import served

    if bundle is None:
        policy = pol.load(policy_path)
        return policy, served(gpu, policy, None, jit)
    if policy_path is not None:
        raise InputError("--policy: not with --bundle (the bundle's own policy decides)")
    from topkgen.manifest import reading as manifests

    try:
        manifest, _ = manifests.load_manifest(bundle)
        policy = manifests.manifest_policy(manifest, str(bundle))
    except manifests.ManifestError as err:
        raise InputError(f"--bundle: {err}") from None
    return policy, served(gpu, policy, manifest, jit)


def _on_gpu(answer, binary):
    """The explanation as served on the GPU: JIT when the load order compiles the sources, and
    the binary's words (text: `gpu:` and `binary:` lines; JSON: a `binary` record)."""
    from dataclasses import replace

    sel = answer.selection
    reason = f"{sel.reason}; binary: {binary.words}"  # as TopK(gpu_arch=...).explain words it
    # JIT: compiled for the GPU from the bundle's sources, with that arch's tuning
    sel = replace(sel, source="jit" if binary.way == "jit" else sel.source, why=lambda: reason)
    return replace(answer, selection=sel, binary=binary)
