"""The tiny policy (two kernels) that the user-file, interrupt and build tests share, and one
small invocation of every command that loads a policy."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# Two kernels (sm_90, float32, K 64 and 1024), tuned as the default policy's sm_90 kernels
# but with no shared row (every pass reads the row), so that they also fit a GPU of 99 KiB of
# shared memory per block (sm_120: the forward-compatibility tests); the K=1024 kernel, at 2
# CTAs of 1024 threads per SM (32 registers), builds with no spill
# (tests/build/test_register_caps.py).
TINY_POLICY = """\
version: 1
name: tiny
archs:
  sm_90:
    capability: [9, 0]
    threads: 256
    warps_per_block: 4
    vector_tail: {policy: fixed, max_iterations: 4}
    min_ctas_per_sm: {1024: 2}
    loads_in_flight: 4
    loads_in_flight_by_k: {1024: 1}
dtypes:
  aot: [float32]
families:
  radix:
    template: radix_select.cu.j2
    budget: {max_registers: 96, spills: false}
rules:
  - name: radix_all
    family: radix
    work: dynamic
    k: [64, 1024]
    n: {min: 1, max: 2147483647}
    modes: [deterministic]
    serves: [fast, deterministic]
aot_covers_all: true
dispatch_order: [radix_all]
"""


def each_command(tiny_policy: Path, tiny_bundle: Path, tmp_path: Path) -> dict[str, list]:
    """One small invocation of every command that loads a policy (so that a failure planted
    in policy._build reaches each), writing only under tmp_path (out/, o.npz)."""
    np.save(tmp_path / "x.npy", np.zeros((1, 100), np.float32))
    return {
        "plan": ["plan"],
        "explain": ["explain", "--arch", "sm_90", "--dtype", "float32", "--k", "1", "--n", "8"],
        "build": ["build", "--policy", tiny_policy, "--out", tmp_path / "out"],
        "diff": ["diff", tiny_policy, tiny_policy],
        "run": ["run", "--bundle", tiny_bundle, "--arch", "sm_90", "--backend", "emulator", "--k", "1",
                tmp_path / "x.npy", "-o", tmp_path / "o.npz"],
    }


# One AOT kernel (sm_90, float32, K=16) that merges a split in one launch (the split section's
# one_launch, manifest schema 7), the rest JIT: what the cuda backend's and the C++ loader's
# tests of a one-launch bundle need, at one kernel's compile.
ONE_LAUNCH_POLICY = """
version: 1
name: one_launch
archs:
  sm_90:
    capability: [9, 0]
    threads: 128
    warps_per_block: 4
    vector_tail: {policy: runtime}
    shared_row_bytes: 98304
    split: {sm_count: 132, ctas_per_sm: 2, rows_below: 80, min_n: 131072, max_chunks: 32, min_chunk: 4096,
            chunk_per_k: 16, one_launch: true}
dtypes: {aot: [float32]}
families:
  radix: {template: radix_select.cu.j2, budget: {max_registers: 96, spills: false}}
rules:
  - {name: radix_dynamic, family: radix, work: dynamic, k: [16], n: {min: 1, max: 2147483647}, modes: [fast]}
  - {name: jit_rest, family: radix, work: dynamic, k: [1024], n: {min: 1, max: 2147483647}, modes: [fast, deterministic],
     aot: false, reason: "one AOT kernel is all this test needs"}
dispatch_order: [radix_dynamic, jit_rest]
"""
