"""What the manifest tells a loader about serving a GPU the policy did not describe exactly
(schema 5): the split rule's data per arch (`split_rules`: plan a split batch for the GPU's
own SM count) and the load order's data (`load_order`: which binary serves a GPU of an arch,
topkgen.runtime.binary's rule). Both are written by build and merge, read by the runtime and
by loaders/cpp, so every loader decides from the same data by the same rule."""

from __future__ import annotations

from dataclasses import asdict

from topkgen.policy import SHARED_BYTES_PER_BLOCK, Policy, arch_capability


def split_rules(policy: Policy, archs: list[str]) -> dict[str, dict | None]:
    """Per arch, its split section as plain data (None: the arch splits nothing), but
    one_launch: a loader learns it from each kernel's params (tickets), and may launch twice."""
    rules = {arch: policy.archs[arch].split for arch in archs}
    return {arch: None if rule is None else {key: value for key, value in asdict(rule).items() if key != "one_launch"}
            for arch, rule in rules.items()}


def shared_needed(kernels: list[dict]) -> dict[str, int]:
    """Per arch, the most shared memory per block (static + dynamic) an AOT kernel asks for."""
    need: dict[str, int] = {}
    for e in kernels:
        total = e["resources"]["static_shared_bytes"] + e["launch"]["dynamic_shared_bytes"]
        need[e["arch"]] = max(need.get(e["arch"], 0), total)
    return need


def load_order(policy: Policy, archs: list[str], kernels: list[dict]) -> dict:
    """The load order's data for a bundle of `archs` built from `policy` with `kernels`."""
    need = shared_needed(kernels)
    return order_record(list(policy.archs), {arch: need.get(arch, 0) for arch in archs},
                        {arch: policy.archs[arch].target for arch in archs},
                        [arch for arch in archs if policy.archs[arch].ship_ptx])


def order_record(policy_archs: list[str], need: dict[str, int], targets: dict[str, str], ptx_archs: list[str]) -> dict:
    """The load order's data: every known GPU's capability and shared memory per block, the
    policy's archs (JIT may tune for them), each bundle arch's kernels' shared memory, its
    cubins' NVRTC target and whether it ships PTX."""
    return {"gpus": {gpu: {"capability": list(arch_capability(gpu)), "shared_bytes_per_block": limit}
                     for gpu, limit in SHARED_BYTES_PER_BLOCK.items()},
            "policy_archs": list(policy_archs), "shared_needed": dict(need), "targets": dict(targets),
            "ptx_archs": list(ptx_archs)}
