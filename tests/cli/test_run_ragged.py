"""`topkgen run --lengths L.npy [--starts S.npy]` (issue 30): a ragged batch on the emulator,
saved and printed with its padding, and its bad inputs refused in one line naming the file
(and the row), exit 2, nothing written."""

from __future__ import annotations

import numpy as np
import pytest

from ..support.ragged_cases import check_row, pad_bits


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(30)
    x = rng.standard_normal((4, 1000)).astype(np.float32)
    lengths, starts = np.array([0, 3, 1000, 20], np.int32), np.array([0, 10, 0, 500], np.int32)
    for name, array in (("x", x), ("L", lengths), ("S", starts), ("L64", lengths.astype(np.int64)),
                        ("Lbad", np.array([0, 3, 1000, 2000], np.int32)), ("S64", starts.astype(np.int64))):
        np.save(tmp_path / f"{name}.npy", array)
    return tmp_path, x, lengths, starts


def _run(cli, bundle, tmp, *extra):
    return cli("run", "--bundle", bundle, "--backend", "emulator", "--arch", "sm_90", "--k", "8", tmp / "x.npy",
               *extra)


@pytest.mark.parametrize("smallest", [False, True])
def test_run_saves_a_ragged_batch_with_its_padding(cli, built_bundle, files, smallest):
    tmp, x, lengths, starts = files
    out = tmp / "top.npz"
    result = _run(cli, built_bundle, tmp, "--lengths", tmp / "L.npy", "--starts", tmp / "S.npy", "--deterministic",
                  *(["--smallest"] if smallest else []), "-o", out)
    assert result.exit_code == 0, result.stderr
    saved = np.load(out)
    for r in range(4):
        check_row(x[r], saved["values"][r], saved["indices"][r], 8, int(lengths[r]), int(starts[r]), not smallest,
                  True, "float32", f"row {r}")


def test_run_prints_the_padded_slots(cli, built_bundle, files):
    tmp, x, lengths, _ = files
    result = _run(cli, built_bundle, tmp, "--lengths", tmp / "L64.npy")
    assert result.exit_code == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("  row ")]
    pad = f"{float(np.uint32(pad_bits('float32', True)).view(np.float32)):.6g}[-1]"
    assert rows[0] == "  row 0: " + " ".join([pad] * 8)
    assert rows[1].endswith(" ".join([pad] * 5)) and rows[1].count("[-1]") == 5
    assert "[-1]" not in rows[2] and "[-1]" not in rows[3]


@pytest.mark.parametrize("extra, message", [
    (("--lengths", "Lbad.npy"), "--lengths {tmp}/Lbad.npy: row 3 has length 2000, outside [0, n] = [0, 1000]"),
    (("--starts", "S.npy"), "--starts: a window is [starts, starts + lengths): pass --lengths L.npy too"),
    (("--lengths", "x.npy"), "{tmp}/x.npy: dtype float32 is not int32 or int64 (a ragged batch's lengths and starts)"),
    (("--lengths", "L.npy", "--starts", "S64.npy"),
     "--starts {tmp}/S64.npy: expected int32 elements, as lengths holds (the kernels read both with one width), "
     "got int64"),
])
def test_run_refuses_bad_windows_in_one_line(cli, built_bundle, files, extra, message):
    tmp = files[0]
    args = [tmp / a if a.endswith(".npy") else a for a in extra]
    result = _run(cli, built_bundle, tmp, *args, "-o", tmp / "top.npz")
    assert result.exit_code == 2
    assert result.stderr == f"topkgen: error: {message.format(tmp=tmp)}\n"
    assert not (tmp / "top.npz").exists()
