"""`topkgen map` (issue 32): which kernel serves each (k, n) region, per arch, dtype and mode;
a text map on the terminal, the exact regions as SVG or PNG with the `plot` extra. Every
cell is checked against `select`."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from topkgen import policy as pol

from ..conftest import ROOT


def _cells(text: str) -> tuple[dict[tuple[int, int], str], dict[str, str]]:
    lines = text.splitlines()
    grid = [line for line in lines if line[:8].strip().isdigit()]
    legend = {line.split()[0]: line.split()[1] for line in lines
              if line.startswith("  ") and len(line.split()[0]) == 1 and line.split()[1].startswith("topk_")}
    cells = {}
    for line in grid:
        k = int(line[:8])
        for j, char in enumerate(line[10:]):
            cells[(k, min(1 << j, pol.N_MAX))] = char
    return cells, legend


@pytest.mark.parametrize("rows", [None, 8])
def test_the_text_map_is_what_select_serves(cli, default_policy, rows):
    args = ["map", "--arch", "sm_90", "--dtype", "bf16", "--mode", "fast", *(["--rows", rows] if rows else [])]
    result = cli(*args)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("sm_90 bfloat16 fast" + ("" if rows is None else ", 8 rows") + "\n")
    cells, legend = _cells(result.stdout)
    assert len(cells) == 11 * 32 and len(legend) >= 10
    for (k, n), char in cells.items():
        if n < k:
            assert char == "."
            continue
        sel = pol.select(default_policy, "sm_90", "bfloat16", k, n, rows=rows)
        assert legend[char] == sel.kernel.name, (k, n)


def test_the_svg_draws_every_panel_with_its_kernels(cli, default_policy, tmp_path):
    out = tmp_path / "map.svg"
    result = cli("map", "--arch", "sm_100", "--dtype", "fp32", "-o", out)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith(f"{out}: 2 map(s) of ")
    svg = out.read_text()
    assert svg.startswith("<?xml") and "<svg" in svg
    for mode in ("fast", "deterministic"):
        assert f"sm_100 float32 {mode}" in svg
    served = {pol.select(default_policy, "sm_100", "float32", k, n).kernel.name
              for k in (1, 16, 64, 256, 1024) for n in (1024, 4096, 1 << 20) if n >= k}
    assert all(name in svg for name in served)
    png = tmp_path / "map.png"
    assert cli("map", "--arch", "sm_90", "--dtype", "fp16", "--mode", "fast", "-o", png).exit_code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_requests_are_one_line(cli, tmp_path):
    bad = cli("map", "-o", tmp_path / "map.pdf")
    assert (bad.exit_code, bad.stderr) == (2, f"topkgen: error: -o {tmp_path / 'map.pdf'}: name an .svg or .png file\n")
    assert not (tmp_path / "map.pdf").exists()
    bad = cli("map", "--mode", "quick")
    assert bad.exit_code == 2 and bad.stderr.count("\n") == 1 and "'--mode'" in bad.stderr


def test_without_matplotlib_it_says_which_extra_to_install(tmp_path):
    """matplotlib made unimportable for real (a package that raises ImportError first on the path)."""
    (tmp_path / "shadow" / "matplotlib").mkdir(parents=True)
    (tmp_path / "shadow" / "matplotlib" / "__init__.py").write_text("raise ImportError('not installed')\n")
    proc = subprocess.run([sys.executable, "-m", "topkgen", "map", "--arch", "sm_90", "-o", str(tmp_path / "m.svg")],
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "shadow"), str(ROOT)])})
    assert (proc.returncode, proc.stderr) == (2, "topkgen: error: -o: drawing needs matplotlib: pip install "
                                                 "'topkgen[plot]' (or leave -o out for the text map)\n")
    text = subprocess.run([sys.executable, "-m", "topkgen", "map", "--arch", "sm_90", "--dtype", "fp32"],
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "shadow"), str(ROOT)])})
    assert text.returncode == 0 and text.stdout.startswith("sm_90 float32 fast\n")


def test_diff_map_draws_the_regions_that_move(tmp_path):
    """`diff --map` draws, per arch, dtype and mode, the (k, n) regions whose dispatch moves."""
    from ..conftest import DEFAULT_POLICY

    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old.write_text(re.sub(r"rows_below: \d+", "rows_below: 96", DEFAULT_POLICY.read_text()))
    new.write_text(old.read_text().replace("rows_below: 96", "rows_below: 32", 1))
    out = tmp_path / "moves.svg"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "topkgen", "diff", str(old), str(new), "-q", "--map",
                           str(out)], capture_output=True, text=True, env=env)
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", "")
    svg = out.read_text()
    assert "sm_90 float32 fast" in svg and "sm_100" not in svg  # only sm_90's split moved
    assert "topk_radix_dyn_k256_fast_f32_sm_90 (aot, 32 chunks per row) -&gt; topk_radix_dyn_k256_fast_f32_sm_90 " \
           "(aot) [split, rows 32..95]" in svg
    same = subprocess.run([sys.executable, "-m", "topkgen", "diff", str(DEFAULT_POLICY), str(DEFAULT_POLICY), "-q",
                           "--map", str(tmp_path / "same.png")], capture_output=True, text=True, env=env)
    assert same.returncode == 0 and (tmp_path / "same.png").read_bytes()[:4] == b"\x89PNG"
    bad = subprocess.run([sys.executable, "-m", "topkgen", "diff", str(DEFAULT_POLICY), str(new), "--map",
                          str(tmp_path / "m.svg"), "--shapes", str(new)], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and bad.stderr.startswith("topkgen: error: --map: ") and bad.stderr.count("\n") == 1
