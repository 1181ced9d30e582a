"""`topkgen explain --gpu-arch G`: which binary of a bundle would serve a GPU of arch G (its own
cubins, a lower minor's, shipped PTX, JIT, or a refusal) and why: the load order of
topkgen.runtime.binary, on a bundle's manifest (`--bundle DIR`) or on the bundle a full build of
the policy would write (its kernels' shared memory estimated from the policy, as loading
checks it; a built bundle's manifest has ptxas's figures)."""

from __future__ import annotations

import re

from topkgen import policy as pol
from topkgen.cli.group import InputError
from topkgen.manifest.serving import order_record
from topkgen.runtime.binary import Binary, NoBinaryError, resolve

GPU_ARCH = re.compile(r"sm_[1-9][0-9]*[0-9]")


def policy_order(policy: pol.Policy) -> dict:
    """The load_order record of a full build of `policy`, shared memory per block estimated:
    a radix kernel's static shared memory by the policy's formula, plus its dynamic."""
    need: dict[str, int] = {}
    for arch in policy.archs:
        for spec in pol.plan(policy, arch):
            static = pol.radix_static_shared_bytes(spec.k) if spec.family == "radix" else 0
            need[arch] = max(need.get(arch, 0), static + spec.dynamic_shared_bytes)
    return order_record(list(policy.archs), need, {a: t.target for a, t in policy.archs.items()},
                        [a for a, t in policy.archs.items() if t.ship_ptx])


def served(gpu: str, policy: pol.Policy, manifest: dict | None, jit: bool) -> Binary:
    """The binary that serves `gpu`; a refusal is an InputError naming --gpu-arch."""
    if not GPU_ARCH.fullmatch(gpu):
        raise InputError(f"--gpu-arch: expected a GPU's arch such as sm_86, got '{gpu}'")
    archs, order = (list(policy.archs), policy_order(policy)) if manifest is None else \
        (list(manifest["archs"]), manifest["load_order"])
    try:
        return resolve(gpu, archs, order, jit=jit)
    except NoBinaryError as err:
        raise InputError(f"--gpu-arch: {err}") from None
