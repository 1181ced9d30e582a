"""`topkgen run`: top-k of a .npy file through the runtime, on a GPU or the emulator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from topkgen.cli import standard_output
from topkgen.common.reader import printable
from topkgen.cli.group import InputError, main
from topkgen.cli.options import ArchType, BundleArg, DtypeType, K_OPTION, PathArg, _NPZ_OUT


# ----------------------------------------------------------------------------- run

ROWS_SHOWN = 10    # rows `run` prints without -o
VALUES_SHOWN = 8   # values per row it prints


@main.command(short_help="Top-k of a .npy file with a bundle's kernels.", epilog="""\b
Examples:
  topkgen run --bundle out --k 8 x.npy                on the GPU, rows printed
  topkgen run --bundle out --k 8 x.npy -o top8.npz    saved: values, indices
  topkgen run --bundle out --backend emulator --arch sm_90 --k 8 x.npy
  topkgen run --bundle out --k 8 x.npy --lengths L.npy --starts S.npy   a ragged batch

The emulator backend runs the same kernels on the CPU, without a GPU. bfloat16 input is
read as numpy saves ml_dtypes.bfloat16 (2-byte records), or as raw uint16 bits (--dtype says
which 16-bit type those hold); the values are saved the same way.

A ragged batch: --lengths L.npy (int32 or int64, one entry per row of IN) and optionally
--starts S.npy (of the same type): row r's candidates are IN[r, S[r] : S[r] + L[r]], the
indices positions in IN's row; a row of fewer than k candidates is padded with index -1
and -inf (largest) or +inf (--smallest). A window outside the row is refused, naming the row.

\b
Reading bfloat16 results back (numpy has no bfloat16 type: they are
2-byte records, |V2, or uint16 bits; a view makes them bfloat16):
  import numpy as np, ml_dtypes        # ml_dtypes comes with topkgen
  saved = np.load("top8.npz")
  values = saved["values"].view(ml_dtypes.bfloat16)
  indices = saved["indices"]           # int64
(float16 bits: saved["values"].view(np.float16))""")
@click.option("--bundle", "bundle_dir", required=True, type=BundleArg(), metavar="DIR",
              help="Bundle directory (from topkgen build).")
@click.option("--arch", type=ArchType(), default=None, metavar="ARCH",
              help="Target arch, one of the bundle's policy (default: the GPU's; required for the emulator).")
@click.option("--backend", type=click.Choice(["cuda", "emulator"]), default="cuda", show_default=True,
              help="cuda: the GPU; emulator: the same kernels on the CPU (slow, needs no GPU).")
@K_OPTION
@click.option("--smallest", is_flag=True, help="The k smallest instead of the k largest.")
@click.option("--deterministic", is_flag=True, help="Ties by lower index, bit-exact run to run.")
@click.option("--unsorted", is_flag=True, help="No promised order of each row's k (sorted=False).")
@click.option("--index-dtype", "index_dtype", type=click.Choice(["int64", "int32"]), default="int64",
              show_default=True, help="The indices' type.")
@click.option("--dtype", type=DtypeType(("bfloat16", "float16")), default=None,
              help="What raw uint16 input holds: bfloat16 (default) or float16 (bf16, fp16 too).")
@click.option("--lengths", "lengths_path", default=None, type=PathArg(dir_okay=False), metavar="L.npy",
              help="A ragged batch: each row's valid length (int32 or int64, one per row).")
@click.option("--starts", "starts_path", default=None, type=PathArg(dir_okay=False), metavar="S.npy",
              help="With --lengths: each row's window start (default 0), of the lengths' type.")
@click.argument("input_path", metavar="IN.npy", type=PathArg(dir_okay=False))
@click.option("-o", "--output", "output_path", default=None, type=_NPZ_OUT, metavar="OUT.npz",
              help="Save arrays 'values' and 'indices' here (a file: not '-'). Without it, each row's top-k is "
                   "printed.")
@click.option("--force", is_flag=True, help="Replace -o even when it is not the output of an earlier run.")
def run(bundle_dir: str, arch: str | None, backend: str, k: int, smallest: bool, deterministic: bool,
        unsorted: bool, index_dtype: str, dtype: str | None, lengths_path: str | None, starts_path: str | None,
        input_path: str, output_path: str | None, force: bool) -> None:
    """Top-k over the last dimension of IN.npy with the bundle's kernels (or JIT)."""
    import io

    if output_path is not None:  # the product is -o; without it, the rows printed are
        standard_output.report_only()
    import numpy as np

    from topkgen.common.destinations import check_output_file
    from topkgen.cli.npyfile import read_npy_stored
    from topkgen.common.files import atomic_write
    from topkgen.runtime import NoGpuError, TopK, TopKError, dtype_name

    if backend == "emulator" and arch is None:  # the runtime would name its own argument, arch=
        raise InputError(f"--arch: the emulator backend runs one arch's kernels; name it, e.g. "
                         f"--arch {_first_arch(bundle_dir)}")
    if starts_path is not None and lengths_path is None:
        raise InputError("--starts: a window is [starts, starts + lengths): pass --lengths L.npy too")
    windows = [p for p in (lengths_path, starts_path) if p is not None]
    if output_path is not None:
        check_output_file(Path(output_path), force=force,
                          inputs=(Path(input_path), Path(bundle_dir), *(Path(p) for p in windows)))
    x, stored = read_npy_stored(input_path)
    ragged = {label: read_npy_stored(p, windows=True)[0] for label, p in zip(("lengths", "starts"), windows)}
    found = "bfloat16" if stored.kind == "V" else str(x.dtype)  # 2-byte records: how numpy saves ml_dtypes' bfloat16
    try:
        op = TopK(bundle_dir, arch=arch, backend=backend)
        try:  # what the input's shape and type allow: the message names the file
            name = dtype_name(found, dtype)
            answer = op.explain(name, k, x.shape[-1], deterministic)
        except TopKError as err:
            raise InputError(f"{input_path}: {found}{list(x.shape)}: {err}") from None
        try:
            if backend == "cuda":
                values, indices = _run_on_gpu(op, x, k, smallest, deterministic, name, not unsorted, index_dtype,
                                              ragged)
            else:
                values, indices = op(x, k, largest=not smallest, deterministic=deterministic, sorted=not unsorted,
                                     index_dtype=index_dtype, dtype=name, **ragged)
        except TopKError as err:  # a bad window: named by its file and row
            label = str(err).split(":", 1)[0]
            if label not in ragged:
                raise
            path = lengths_path if label == "lengths" else starts_path
            raise InputError(f"--{label} {printable(path)}: {str(err).split(': ', 1)[1]}") from None
    except NoGpuError as err:
        raise InputError(f"{err}; without a GPU, run the same kernels on the CPU: --backend emulator "
                         f"--arch {arch or _first_arch(bundle_dir)}") from None
    if stored.kind == "V":  # bfloat16 came as 2-byte records (ml_dtypes): saved the same way
        values = values.view(stored)
    by = f"by {answer.kernel.name} ({answer.source})"
    if output_path is None:
        _print_rows(input_path, x.shape, name, values, indices, k, smallest, by)
        return
    buffer = io.BytesIO()
    np.savez(buffer, values=values, indices=indices)
    try:
        atomic_write(Path(output_path), buffer.getvalue())
    except OSError as err:
        raise InputError(f"-o {output_path}: cannot write: {err.strerror}") from None
    click.echo(f"{printable(output_path)}: values {values.dtype}{list(values.shape)}, "
               f"indices {indices.dtype}{list(indices.shape)} {by}")


def _first_arch(bundle_dir: str) -> str:
    from topkgen.manifest import reading as manifests

    try:
        return manifests.load_manifest(bundle_dir)[0]["archs"][0]
    except (manifests.ManifestError, IndexError):
        return "sm_90"


def _print_rows(input_path: str, shape: tuple[int, ...], dtype: str, values: Any, indices: Any, k: int,
                smallest: bool, by: str) -> None:
    """Each row's top-k, value[index], for the first rows: what -o would save, to read."""
    import numpy as np

    if dtype == "bfloat16":  # 16-bit values come as uint16 bits or 2-byte records
        import ml_dtypes

        values = values.view(ml_dtypes.bfloat16)
    elif dtype == "float16":
        values = values.view(np.float16)
    values = values.astype(np.float32).reshape(-1, k)
    indices = indices.reshape(-1, k)
    rows = values.shape[0]
    click.echo(f"{printable(input_path)}: {'smallest' if smallest else 'largest'} {k} of {rows} row(s) of {shape[-1]} "
               f"{dtype} {by}")
    for row in range(min(rows, ROWS_SHOWN)):
        label = row if len(shape) <= 2 else [int(i) for i in np.unravel_index(row, shape[:-1])]
        items = [f"{v:.6g}[{i}]" for v, i in zip(values[row, :VALUES_SHOWN], indices[row, :VALUES_SHOWN])]
        more = f" ... {k - VALUES_SHOWN} more" if k > VALUES_SHOWN else ""
        click.echo(f"  row {label}: {' '.join(items)}{more}")
    if rows > ROWS_SHOWN:
        click.echo(f"  ... {rows - ROWS_SHOWN} more rows; -o OUT.npz saves them all")


def _run_on_gpu(op: Any, x: Any, k: int, smallest: bool, deterministic: bool, dtype: str | None,
                sorted_: bool = True, index_dtype: str = "int64", ragged: dict | None = None):
    """Host arrays go through device buffers that cuda.core allocates; the kernels write the
    indices in `index_dtype` (int32 too: no pass after them); a ragged batch's windows go
    through device buffers too, checked on the host first (check=True: the command has them
    there)."""
    import numpy as np

    from topkgen.runtime.gpu_arrays import DeviceArray
    from topkgen.runtime.cuda_backend import _cuda_core

    device = _cuda_core().Device()
    stream = device.default_stream
    dx = DeviceArray.from_host(np.ascontiguousarray(x), device, stream)
    shape = (*x.shape[:-1], k)
    values = DeviceArray.empty(shape, x.dtype, device, stream)
    indices = DeviceArray.empty(shape, np.dtype(index_dtype), device, stream)
    windows = {label: DeviceArray.from_host(np.ascontiguousarray(a), device, stream) for label, a in (ragged or {}).items()}
    op(dx, k, largest=not smallest, deterministic=deterministic, sorted=sorted_, index_dtype=index_dtype,
       out=(values, indices), dtype=dtype, stream=stream, check=bool(windows), **windows)
    stream.sync()
    return values.to_host(stream), indices.to_host(stream)
