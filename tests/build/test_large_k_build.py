"""K rungs 2048 and 4096 shipped ahead of time by a policy of one's own (aot: true) build on
sm_90 and sm_100 within the radix budget, with no spill; the large-k path's kernels (JIT-only)
compile within the same budget. Real NVRTC, through the compile cache."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from topkgen import policy as pol
from topkgen.build.compile import compile_kernel
from topkgen.build.render import render

POLICY = """
version: 1
name: large_rungs
archs:
  sm_90: {threads: 256, threads_by_k: {1024: 256, 2048: 256}, vector_tail: {policy: fixed, max_iterations: 4},
          shared_row_bytes: 98304, loads_in_flight: 4}
  sm_100: {threads: 256, threads_by_k: {1024: 256, 2048: 256}, vector_tail: {policy: runtime},
           shared_row_bytes: 98304, loads_in_flight: 4}
dtypes:
  aot: [float32, bfloat16]
families:
  radix: {budget: {max_registers: 96, spills: false}}
rules:
  - name: radix_upto_1024
    family: radix
    work: dynamic
    k: [1024]
    n: {min: 1, max: 2147483647}
    modes: [deterministic]
    serves: [fast, deterministic]
  - name: radix_large_rungs
    family: radix
    work: dynamic
    k: [2048, 4096]
    k_min: 1025
    n: {min: 1, max: 2147483647}
    modes: [fast, deterministic]
dispatch_order: [radix_upto_1024, radix_large_rungs]
"""


def test_a_policy_ships_k2048_and_k4096_aot_with_no_spill(tmp_path):
    path = tmp_path / "large.yaml"
    path.write_text(POLICY)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "topkgen", "build", "--policy", str(path), "--out", str(out),
                           "-j", "2"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    manifest = json.loads((out / "manifest.json").read_text())
    from topkgen.manifest.reading import SCHEMA_VERSION

    assert manifest["schema_version"] == SCHEMA_VERSION
    rungs = [e for e in manifest["kernels"] if e["k"] in (2048, 4096)]
    assert len(rungs) == 2 * 2 * 2 * 2  # archs x dtypes x rungs x modes
    for entry in rungs:
        res = entry["resources"]
        # K=2048 on 256 threads (threads_by_k, as the default policy's), K=4096 on 1024
        assert entry["launch"]["threads_per_block"] == {2048: 256, 4096: 1024}[entry["k"]]
        assert res["spill_stores"] == 0 and res["spill_loads"] == 0, entry["name"]
        # 1 CTA of 1024 threads per SM: 64 registers; the family's budget of 96 for 256
        assert res["registers"] <= {2048: 96, 4096: 64}[entry["k"]], entry["name"]
        assert res["static_shared_bytes"] + entry["launch"]["dynamic_shared_bytes"] <= pol.SHARED_BYTES_PER_BLOCK[
            entry["arch"]]
    # the large-k path is shipped as JIT source, and k above 4096 is dispatched to it
    large = {e["name"] for e in manifest["jit_kernels"] if e["work"] == "large"}
    assert large == {f"topk_radix_large_{m}_{d}_{a}" for m in ("fast", "det") for d in ("f32", "bf16")
                     for a in ("sm_90", "sm_100")}
    rows = manifest["dispatch"]["sm_90"]["float32"]["fast"]
    top = [r for r in rows if r["k"][1] == pol.N_MAX]
    assert top and all(r["kernel"] == "topk_radix_large_fast_f32_sm_90" and r["aot_fallback"] is None for r in top)
    assert top[0]["k"][0] == 4097


@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
def test_the_large_k_path_compiles_within_the_radix_budget(default_policy, arch):
    for dtype, mode in (("float32", "deterministic"), ("bfloat16", "fast")):
        spec = pol.large_kernel(default_policy, arch, dtype, mode)
        res = compile_kernel(render(spec), spec.name, arch).resources
        assert res.spill_stores == 0 and res.spill_loads == 0, spec.name
        assert res.registers <= 64, spec.name
