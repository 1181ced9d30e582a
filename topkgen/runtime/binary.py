"""Which binary serves a GPU: the load order every loader follows, for a GPU the bundle may not
have been built for. Its data is the manifest's `load_order` (schema 5; the schema words the
rule, loaders/cpp's Bundle::binary follows it word for word):

  1. the cubins of the GPU's own arch (compiled for it, or for its arch-specific target sm_XYa);
  2. the cubins of an arch of the same major and a lower minor (binary compatible: NVIDIA's
     CUDA C++ Programming Guide, "Binary Compatibility"), highest minor first, when their
     kernels' shared memory per block fits the GPU's documented limit and they are not
     arch-specific (an sm_90a cubin runs on sm_90 only);
  3. PTX shipped beside the cubins (the policy's `ship_ptx`), compiled by the driver's JIT: the
     arch of the highest capability at most the GPU's (any major) whose kernels fit it;
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
    arch: str  # the arch whose kernels (cubins, PTX, or tuning for JIT) serve it
    words: str  # what explain prints

    def __str__(self) -> str:
        return self.words


def capability(order: dict, arch: str) -> tuple[int, int]:
    gpu = order["gpus"].get(arch)
    return tuple(gpu["capability"]) if gpu is not None else arch_capability(arch)


def resolve_manifest(gpu: str, manifest: dict, *, jit: bool) -> Binary:
    """The binary of a bundle (its manifest) that serves a GPU of arch `gpu`."""
    return resolve(gpu, list(manifest["archs"]), manifest["load_order"], jit=jit)


def resolve(gpu: str, bundle_archs: list[str], order: dict, *, jit: bool) -> Binary:
    """The binary that serves a GPU of arch `gpu` (load order in the module's docstring), from
    the manifest's `load_order` record `order`; `jit`: whether NVRTC may compile here.

    Kept whole: why: the five steps read in order as the schema words them, each adding what it
    passed to the words of the next; cut up, the order would be spread over functions."""
    cap = capability(order, gpu)
    known = order["gpus"].get(gpu)
    limit = None if known is None else known["shared_bytes_per_block"]
    need = order["shared_needed"]
    targets = order["targets"]

    def fits(arch: str) -> bool:
        return limit is None or need.get(arch, 0) <= limit

    def fit_words(arch: str) -> str:
        return "" if limit is None else f"; their {need.get(arch, 0)} bytes of shared memory per block fit its {limit}"

    def also(passed: list[str]) -> str:
        return f" ({'; '.join(passed)})" if passed else ""

    if gpu in bundle_archs:
        own = targets.get(gpu, gpu)
        return Binary(gpu, "cubin", gpu, f"{gpu} GPU: the bundle's {gpu} cubins"
                                         + ("" if own == gpu else f" (arch-specific {own}: this arch only)"))
    passed = []
    lower = sorted((a for a in bundle_archs if capability(order, a)[0] == cap[0] and capability(order, a)[1] < cap[1]),
                   key=lambda a: capability(order, a), reverse=True)
    for arch in lower:
        if targets.get(arch, arch) != arch:
            passed.append(f"{arch} cubins are arch-specific ({targets[arch]}): they run on {arch} only")
        elif fits(arch):
            return Binary(gpu, "lower-minor cubin", arch,
                          f"{gpu} GPU: no {gpu} cubin; the {arch} cubins run on it (same major {cap[0]}, lower minor"
                          f"{fit_words(arch)}){also(passed)}")
        else:
            passed.append(f"{arch} cubins need {need[arch]} bytes of shared memory per block, above its {limit}")
    ptx = sorted((a for a in order["ptx_archs"] if capability(order, a) <= cap), key=lambda a: capability(order, a),
                 reverse=True)
    for arch in ptx:
        if fits(arch):
            major, minor = capability(order, arch)
            return Binary(gpu, "ptx", arch,
                          f"{gpu} GPU: no cubin runs on it{also(passed)}; the {arch} kernels' PTX (compute_{major}"
                          f"{minor}), compiled for {gpu} by the driver's JIT{fit_words(arch)}")
        passed.append(f"{arch} PTX needs {need[arch]} bytes of shared memory per block, above its {limit}")
    if not order["ptx_archs"]:
        passed.append("no PTX in the bundle")
    elif not ptx:
        passed.append(f"no PTX in the bundle for an arch at or below {gpu}")
    policy_archs = order["policy_archs"]
    tuned = [a for a in policy_archs if capability(order, a) <= cap and fits(a)]
    if jit and (gpu in policy_archs or tuned):
        arch = gpu if gpu in policy_archs else max(tuned, key=lambda a: capability(order, a))
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
    return dict(manifest["load_order"]["shared_needed"])


__all__ = ["Binary", "NoBinaryError", "WAYS", "resolve", "resolve_manifest", "shared_from_manifest",
           "SHARED_BYTES_PER_BLOCK"]
