"""`topkgen show`: what a bundle holds, every file checked as a loader checks it."""

from __future__ import annotations

import json
from typing import Any

import click

from topkgen.cli import console
from topkgen.common import suggest
from topkgen.common.reader import printable
from topkgen.cli.group import InputError, main
from topkgen.cli.options import WIDE_OPTION, ArchType, BundleArg, _flatten, _table
from topkgen.cli.plan_commands import _window
SHOW_SCHEMA_VERSION = 2  # schemas/show.schema.json
# Left out, in these orders, until a table fits the terminal (--wide shows them all): what the
# kernel's name already says, then what a reviewer reads last.
KERNEL_DROPS = ("budget", "dtype", "K", "smem static", "stack", "threads", "cubin bytes", "serves", "smem dyn",
                "N window")
JIT_DROPS = ("sha256", "source bytes", "threads", "dtype", "K", "rule", "serves")
DISPATCH_DROPS = ("without JIT", "source")


# ----------------------------------------------------------------------------- show

@main.command(short_help="List what a bundle holds.")
@click.argument("bundle_dir", metavar="BUNDLE", type=BundleArg())
@click.option("--arch", "archs", type=ArchType(many=True), multiple=True, callback=_flatten, metavar="ARCH",
              help="Architecture(s) to show; repeat or comma-separate them. Default: all in the bundle.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="json: schemas/show.schema.json.")
@click.option("--dispatch", "with_dispatch", is_flag=True, help="Also show the dispatch table.")
@WIDE_OPTION
def show(bundle_dir: str, archs: tuple[str, ...], fmt: str, with_dispatch: bool, wide: bool) -> None:
    """What a bundle holds: kernels and their resources, JIT sources, dispatch. Checks every file as a loader does."""
    from topkgen.build import shards
    from topkgen.manifest import reading as manifests

    manifest, root = manifests.load_manifest(bundle_dir)
    manifests.read_files(root, manifest)
    for arch in archs:
        if arch not in manifest["archs"]:
            raise InputError(f"--arch {arch}: not in the bundle {bundle_dir} (holds: {', '.join(manifest['archs'])})"
                             f"{suggest.did_you_mean(arch, manifest['archs'])}")
    chosen = list(dict.fromkeys(archs)) or manifest["archs"]
    doc = {"format": "topkgen-show", "schema_version": SHOW_SCHEMA_VERSION,
           "manifest_schema_version": manifest["schema_version"], "nvrtc_version": manifest["nvrtc_version"],
           "policy": {k: manifest["policy"][k] for k in ("path", "name", "sha256")},
           "archs": chosen,
           "kernels": [e for e in manifest["kernels"] if e["arch"] in chosen],
           "jit_kernels": [e for e in manifest["jit_kernels"] if e["arch"] in chosen]}
    doc["sizes"] = _sizes(doc["kernels"], doc["jit_kernels"], chosen)
    if with_dispatch:
        doc["dispatch"] = {arch: manifest["dispatch"][arch] for arch in chosen}
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2))
        return
    width = console.table_width(wide)
    part = shards.part_of(manifest)  # shown for inspection, but called what it is: no bundle
    what = (f"bundle {printable(bundle_dir)}" if part is None  # a name, escaped as in messages
            else f"part {printable(bundle_dir)} ({part} of a plan; merge the parts for a bundle)")
    click.echo(f"{what}: manifest schema {doc['manifest_schema_version']}, NVRTC {doc['nvrtc_version']}, "
               f"policy {doc['policy']['path']} ({doc['policy']['name']}, sha256 {doc['policy']['sha256'][:12]})")
    click.echo("\nbytes per arch (what a machine of one arch needs: build --arch, or merge per-arch bundles):")
    sizes = doc["sizes"]
    click.echo(_table(("arch", "kernels", "cubin bytes", "PTX bytes", "JIT source bytes", "bytes"),
                      [(arch, str(v["kernels"]), str(v["cubin_bytes"]), str(v["ptx_bytes"]), str(v["jit_source_bytes"]),
                        str(v["bytes"]))
                       for arch, v in [*sizes["archs"].items(), ("all", sizes["all"])]]))
    for arch in chosen:
        kernels = [e for e in doc["kernels"] if e["arch"] == arch]
        click.echo(f"\n{arch}: {len(kernels)} AOT kernels, {console.size(sum(e['size_bytes'] for e in kernels))} "
                   f"of cubin")
        for family in dict.fromkeys(e["family"] for e in kernels):
            click.echo(f"\n  family {family}")
            click.echo(_table(("kernel", "dtype", "K", "N window", "serves", "threads", "regs", "spills st/ld",
                               "stack", "smem static", "smem dyn", "cubin bytes", "budget"),
                              [_kernel_row(e) for e in kernels if e["family"] == family], width=width,
                              drop=KERNEL_DROPS))
        jit = [e for e in doc["jit_kernels"] if e["arch"] == arch]
        click.echo(f"\n{arch}: {len(jit)} JIT sources (compiled on first use)")
        if jit:
            click.echo(f"  NVRTC options: {' '.join(jit[0]['nvrtc_options'])} -I<CUDA include>")
        if jit:
            click.echo(_table(("kernel", "rule", "dtype", "K", "N window", "serves", "threads", "source bytes", "sha256"),
                              [(e["name"], e["rule"], e["dtype"], str(e["k"]), _window(e["n_window"]), "/".join(e["serves"]),
                                str(e["launch"]["threads_per_block"]), str(e["size_bytes"]), e["sha256"][:12])
                               for e in jit], width=width, drop=JIT_DROPS))
        if with_dispatch:
            for dtype, by_mode in sorted(doc["dispatch"][arch].items()):
                for mode in ("fast", "deterministic"):
                    click.echo(f"\ndispatch {arch} {dtype} {mode}:")
                    click.echo(_table(("rows", "k", "n", "kernel", "chunks", "source", "without JIT"),
                                      [(_span(r["rows"]), _span(r["k"]), _span(r["n"]), r["kernel"], str(r["chunks"]),
                                        r["source"], _without_jit(r)) for r in by_mode[mode]], width=width,
                                      drop=DISPATCH_DROPS))


def _sizes(kernels: list[dict[str, Any]], jit: list[dict[str, Any]], archs: list[str]) -> dict[str, Any]:
    """The bytes of the files each arch ships (cubins, PTX, JIT sources) and in all, exactly."""
    def count(arch: str | None) -> dict[str, int]:
        cubin = [e["size_bytes"] for e in kernels if arch in (None, e["arch"])]
        ptx = [e["ptx"]["size_bytes"] for e in kernels if arch in (None, e["arch"]) and "ptx" in e]
        source = [e["size_bytes"] for e in jit if arch in (None, e["arch"])]
        return {"kernels": len(cubin), "cubin_bytes": sum(cubin), "ptx_bytes": sum(ptx), "jit_source_bytes": sum(source),
                "bytes": sum(cubin) + sum(ptx) + sum(source)}
    return {"archs": {arch: count(arch) for arch in archs}, "all": count(None)}


def _kernel_row(e: dict[str, Any]) -> tuple[str, ...]:
    r, b = e["resources"], e["budget"]
    return (e["name"], e["dtype"], str(e["k"]), _window(e["n_window"]), "/".join(e["serves"]),
            str(e["launch"]["threads_per_block"]), str(r["registers"]), f"{r['spill_stores']}/{r['spill_loads']}",
            str(r["stack_bytes"]), str(r["static_shared_bytes"]), str(e["launch"]["dynamic_shared_bytes"]),
            str(e["size_bytes"]), f"{b['max_registers']} regs, {'spills ok' if b['spills_allowed'] else 'no spills'}")


def _without_jit(row: dict[str, Any]) -> str:
    """What serves a dispatch row's shapes when JIT is off: 'same', the AOT kernel (and its
    chunks per row when it splits), or 'none'."""
    if row["aot_fallback"] is None:
        return "none"
    if (row["aot_fallback"], row["aot_chunks"]) == (row["kernel"], row["chunks"]):
        return "same"
    return row["aot_fallback"] + (f" in {row['aot_chunks']} chunks" if row["aot_chunks"] > 1 else "")


def _span(bounds: list[int]) -> str:
    lo, hi = bounds
    return _window({"min": lo, "max": hi})
