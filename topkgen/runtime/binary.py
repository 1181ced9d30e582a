"""Which binary serves a GPU: the load order every loader follows, for a GPU the bundle may not
have been built for.

  1. the cubins of the GPU's own arch;
  2. the cubins of an arch of the same major and a lower minor (binary compatible: NVIDIA's
     CUDA C++ Programming Guide, "Binary Compatibility"), highest minor first, when their
     kernels' shared memory per block fits the GPU's documented limit;
  3. PTX shipped beside the cubins, through the driver's JIT (this topkgen ships none yet:
     the step is named so that the words say it was passed);
  4. JIT from the bundle's sources with NVRTC, compiled for the GPU's own arch: the GPU's arch
     when the policy tunes it, else the policy arch of the highest capability at most the
     GPU's whose kernels fit it;
  5. else a refusal naming the GPU, the bundle's archs and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass

from topkgen.policy import SHARED_BYTES_PER_BLOCK, arch_capability

WAYS = ("cubin", "lower-minor cubin", "ptx", "jit")


class NoBinaryError(ValueError):
    """No binary of the bundle serves this GPU; the message names the GPU, the archs, the fix."""


@dataclass(frozen=True)
class Binary:
    gpu: str   # the GPU's arch, sm_86
    way: str   # one of WAYS
    arch: str  # the arch whose kernels (cubins, or tuning for JIT) serve it
    words: str  # what explain prints

    def __str__(self) -> str:
        return self.words


def resolve(gpu: str, bundle_archs: list[str], policy_archs: list[str], shared_needed: dict[str, int], *,
            jit: bool) -> Binary:
    """The binary that serves a GPU of arch `gpu` (load order in the module's docstring).
    `shared_needed[arch]`: the most shared memory per block (static + dynamic) a kernel of
    that arch asks for; `jit`: whether NVRTC may compile here."""
    major, minor = arch_capability(gpu)
    limit = SHARED_BYTES_PER_BLOCK.get(gpu)

    def fits(arch: str) -> bool:
        return limit is None or shared_needed.get(arch, 0) <= limit

    if gpu in bundle_archs:
        return Binary(gpu, "cubin", gpu, f"{gpu} GPU: the bundle's {gpu} cubins")
    passed = []
    lower = sorted((a for a in bundle_archs if arch_capability(a)[0] == major and arch_capability(a)[1] < minor),
                   key=arch_capability, reverse=True)
    for arch in lower:
        if fits(arch):
            return Binary(gpu, "lower-minor cubin", arch,
                          f"{gpu} GPU: no {gpu} cubin; the {arch} cubins run on it (same major {major}, lower minor"
                          f"{'' if limit is None else f'; their {shared_needed.get(arch, 0)} bytes of shared memory per block fit its {limit}'})"
                          + (f" ({'; '.join(passed)})" if passed else ""))
        passed.append(f"{arch} cubins need {shared_needed[arch]} bytes of shared memory per block, above its {limit}")
    passed.append("no PTX in the bundle")
    tuned = [a for a in policy_archs if arch_capability(a) <= (major, minor) and fits(a)]
    if jit and (gpu in policy_archs or tuned):
        arch = gpu if gpu in policy_archs else max(tuned, key=arch_capability)
        tuning = "its own tuning" if arch == gpu else f"{arch}'s tuning, the nearest below it that fits"
        return Binary(gpu, "jit", arch, f"{gpu} GPU: no cubin for it ({'; '.join(passed)}); JIT from the bundle's "
                                        f"sources with NVRTC for {gpu}, with {tuning}")
    if not jit:
        passed.append("JIT is off (TOPKGEN_DISABLE_JIT, or no NVRTC)")
    else:
        passed.append(f"the policy tunes no arch at or below {gpu} that fits it")
    raise NoBinaryError(f"no binary of the bundle serves this GPU ({gpu}): the bundle holds "
                        f"{', '.join(bundle_archs) or 'no arch'} ({'; '.join(passed)}); fix: add {gpu} to the policy's "
                        f"archs and `topkgen build --arch {gpu}`, or allow JIT")


def shared_from_manifest(manifest: dict) -> dict[str, int]:
    """Per arch, the most shared memory per block a kernel of the bundle asks for."""
    need: dict[str, int] = {}
    for e in manifest["kernels"]:
        total = e["resources"]["static_shared_bytes"] + e["launch"]["dynamic_shared_bytes"]
        need[e["arch"]] = max(need.get(e["arch"], 0), total)
    return need
