"""Issue 33, point 6: refusals of files near their caps are quick in both loaders: a manifest
of 64 MiB of `[0,0,...]` took 30 s (Python) and 4.6 s and 1.1 GiB (C++) to refuse, a 15 MiB
`--shapes` file 15 s. The JSON value count is bounded before anything is parsed, and YAML
workloads are capped nearer what they need (benchmarks/bench_hostile.py times them)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from topkgen.common import reader

from ..support.cpp import CPP
from ..conftest import ROOT
from ..support.hostile import bounded

NEAR_CAP = (64 << 20) - 64


@pytest.mark.parametrize("body", ["0,", "[],"])
def test_a_manifest_of_millions_of_values_is_refused_by_both_loaders_before_parsing(tmp_path, body):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    count = (NEAR_CAP - 2) // len(body)
    (bundle / "manifest.json").write_text("[" + body * count + "0]")
    commas = count * body.count(",") + body.count("[") * count + 1
    why = (f"{bundle / 'manifest.json'}: holds {commas} commas, colons and brackets: more JSON values than the "
           f"{reader.MAX_JSON_VALUES} a file topkgen reads may hold\n")
    python = subprocess.run([sys.executable, "-m", "topkgen", "show", str(bundle)], capture_output=True, text=True,
                            timeout=30, preexec_fn=bounded)
    assert (python.returncode, python.stderr) == (2, f"topkgen: error: {why}")
    cpp = subprocess.run([str(CPP), "verify", str(bundle)], capture_output=True, text=True, timeout=30,
                         preexec_fn=bounded)
    assert (cpp.returncode, cpp.stderr) == (2, f"topkgen-cpp: error: {why}")


def test_a_json_file_of_many_plain_values_skips_the_token_scan_and_reads_the_same(tmp_path):
    """Below the bound, a file whose numbers, escapes and depth need no token scan is read
    at C speed, to the same value; one that does is still refused at its place."""
    text = "[" + ",".join(str(i) for i in range(200_000)) + ', {"a": [1.5, -2, "x\\"]"]}]'
    assert reader.parse_json(text, "t.json") == [*range(200_000), {"a": [1.5, -2, 'x"]']}]
    with pytest.raises(reader.ReadError, match=r"t.json:1:\d+: the number 1e999 is beyond the range of a double"):
        reader.parse_json(text[:-1] + ", 1e999]", "t.json")
    with pytest.raises(reader.ReadError, match=r"t.json:1:\d+: the integer 18446744073709551616 does not fit"):
        reader.parse_json(text[:-1] + ", 18446744073709551616]", "t.json")
    deep = "[" * 33 + "]" * 33
    with pytest.raises(reader.ReadError, match="t.json:1:33: nested deeper than 32 levels"):
        reader.parse_json(deep, "t.json")
    assert reader.parse_json("[" * 32 + "]" * 32, "t.json") is not None


def test_a_yaml_workload_over_a_mib_is_refused_by_its_size(tmp_path):
    shapes = tmp_path / "shapes.yaml"
    line = "- {arch: sm_90, dtype: float32, k: 8, n: 4096}\n"
    shapes.write_text(line * ((15 << 20) // len(line)))
    proc = subprocess.run([sys.executable, "-m", "topkgen", "diff", str(ROOT / "policies" / "topk.yaml"),
                           str(ROOT / "policies" / "topk.yaml"), "--shapes", str(shapes)], capture_output=True,
                          text=True, timeout=30, preexec_fn=bounded)
    assert (proc.returncode, proc.stderr) == (2, f"topkgen: error: {shapes}: the YAML workload file (JSON may be "
                                                 f"larger) is larger than 1048576 bytes\n")
