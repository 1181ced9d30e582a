"""Policy -> kernel set: the kernels each rule yields per arch and dtype, AOT and JIT alike."""

from __future__ import annotations

from typing import Iterable

from topkgen.policy.model import (
    DTYPE_SIZES, DTYPE_TAGS, K_COVERED, LARGE_K_PATH, MAX_THREADS_PER_BLOCK, MODES, MODE_TAGS, N_MAX, VECTOR_BYTES,
    ArchTuning, DispatchError, Family, KernelSpec, Policy, Rule)
CANDIDATE_BYTES = 8  # a packed candidate (key and index) in the radix kernels' buffer


def arch_capability(arch: str) -> tuple[int, int]:
    """The compute capability an arch name stands for: sm_90 -> (9, 0), sm_121 -> (12, 1)."""
    digits = arch[3:]
    return int(digits[:-1]), int(digits[-1])


def block_shape(family: str, tuning: ArchTuning, k: int) -> tuple[int, int]:
    """(threads per block, rows per block) of a family's kernels with K rung k: a warp per
    row for register kernels; for radix kernels, one row on threads_by_k[k] threads where the
    policy names k, else on max(K, threads) (each thread sorts K / threads candidates)."""
    if family == "register":
        return 32 * tuning.warps_per_block, tuning.warps_per_block
    if k in tuning.threads_by_k:
        return tuning.threads_by_k[k], 1
    return min(max(k, tuning.threads), MAX_THREADS_PER_BLOCK), 1  # K=2048, 4096: 1024 threads


# ----------------------------------------------------------------------------- planning

def kernels_of_rule(policy: Policy, rule: Rule, arch: str, dtype: str) -> list[KernelSpec]:
    """Every kernel a rule declares for one arch and dtype, in a stable order."""
    key = (rule.name, arch, dtype)
    cached = policy._kernel_cache.get(key)
    if cached is not None:
        return cached
    out: list[KernelSpec] = []
    if arch in rule.archs and dtype in rule.dtypes:
        tuning = policy.archs[arch]
        family = policy.families[rule.family]
        vec = VECTOR_BYTES // DTYPE_SIZES[dtype]
        exacts: Iterable[int | None] = rule.n_exact if rule.work == "exact" else (None,)
        lower = rule.k_min
        for k in rule.k_rungs:
            for exact in exacts:
                for mode in rule.modes:
                    out.append(_kernel(policy, rule, tuning, family, dtype, k, lower, exact, mode, vec))
            lower = k + 1
    policy._kernel_cache[key] = out
    return out


def _kernel(policy: Policy, rule: Rule, tuning: ArchTuning, family: Family, dtype: str, k: int,
            k_min: int, exact: int | None, mode: str, vec: int) -> KernelSpec:
    threads, rows_per_block = block_shape(rule.family, tuning, k)
    loads = 1
    if rule.family == "radix":
        loads = tuning.loads_in_flight_by_k.get(k, tuning.loads_in_flight)
        if rule.work == "fixed_vec":  # no more loads per step than vectors per thread
            loads = min(loads, rule.vector_iterations)
    if rule.work == "ladder":
        n_min, n_max, work_tag = 1, rule.ladder[-1], "ladder"
    elif rule.work == "exact":
        n_min = n_max = exact
        work_tag = f"n{exact}"
    elif rule.work == "fixed_vec":
        n_min, n_max, work_tag = 1, rule.vector_iterations * threads * vec, f"fv{rule.vector_iterations}"
    else:
        n_min, n_max, work_tag = rule.n_min, rule.n_max, "dyn"
    name = f"topk_{rule.family}_{work_tag}_k{k}_{MODE_TAGS[mode]}_{DTYPE_TAGS[dtype]}_{tuning.name}"
    shared = _dynamic_shared_bytes(rule, tuning, n_max, vec, DTYPE_SIZES[dtype])
    return KernelSpec(
        name=name, arch=tuning.name, family=rule.family, template=family.template, rule=rule.name,
        work=rule.work, dtype=dtype, k=k, k_min=k_min, n_min=n_min, n_max=n_max, exact_n=exact,
        mode=mode, serves=tuple(m for m in rule.serves if _built_mode(rule, m) == mode),
        threads=threads, rows_per_block=rows_per_block,
        min_ctas_per_sm=tuning.min_ctas_per_sm.get(k, 1), vector_width=vec,
        vector_iterations=rule.vector_iterations, ladder=rule.ladder,
        tail_policy=tuning.tail_policy, tail_max_iterations=tuning.tail_max_iterations,
        aot=rule.aot and dtype in policy.aot_dtypes,
        max_registers=family.max_registers, spills_allowed=family.spills_allowed,
        target=tuning.target if tuning.arch_specific else "", ship_ptx=tuning.ship_ptx,
        dynamic_shared_bytes=shared, shared_buffer_bytes=_shared_buffer_bytes(tuning, shared, k),
        loads_in_flight=loads,
        # the merge is compiled where the policy asks for one launch and a split can happen: rows of its min_n
        merges=rule.family == "radix" and tuning.split is not None and tuning.split.one_launch
        and n_max >= tuning.split.min_n,
    )


def _shared_buffer_bytes(tuning: ArchTuning, dynamic: int, k: int) -> int:
    """A radix kernel's candidate buffer past a resident row's copy (split.SharedMemory): the
    arch's shared_buffer_per_k candidates (8 bytes each) per K (shared_buffer_per_k_by_k[K] where it
    names the rung), in whole 16-byte units, or all of its dynamic shared memory when the policy
    has none; at most all of it."""
    per_k = tuning.shared_buffer_per_k_by_k.get(k, tuning.shared_buffer_per_k)
    if per_k is None:
        return dynamic
    return min(dynamic, -(-per_k * k * CANDIDATE_BYTES // VECTOR_BYTES) * VECTOR_BYTES)


def _dynamic_shared_bytes(rule: Rule, tuning: ArchTuning, n_max: int, vec: int, size: int) -> int:
    """A radix kernel's dynamic shared memory: the arch's shared_row_bytes, or less when
    every row the kernel serves fits (its copy needs up to vec - 1 keys of alignment room)."""
    if rule.family != "radix":
        return 0
    whole_row = -(-(n_max + vec - 1) * size // VECTOR_BYTES) * VECTOR_BYTES
    return min(tuning.shared_row_bytes, whole_row)


# ----------------------------------------------------------------------------- large k

def largest_rung(policy: Policy, arch: str, dtype: str) -> int:
    """The largest K rung of the rules that serve (arch, dtype), at least K_COVERED: k above
    it is served by the large-k path."""
    return max([K_COVERED] + [r.k_rungs[-1] for r in policy.rules if arch in r.archs and dtype in r.dtypes])


def large_kernel(policy: Policy, arch: str, dtype: str, mode: str) -> KernelSpec:
    """The large-k path's kernel of (arch, dtype, mode): the radix kernel with its K
    candidates in global memory (the row's slots of the indices output) instead of static
    shared memory, one CTA of 1024 threads per row, for every k above the largest rung and
    every n. JIT-only: compiled on first use, never in the bundle (plan() leaves it out)."""
    key = (LARGE_K_PATH, arch, dtype, mode)
    cached = policy._kernel_cache.get(key)
    if cached is not None:
        return cached
    tuning, family = policy.archs[arch], policy.families["radix"]
    vec = VECTOR_BYTES // DTYPE_SIZES[dtype]
    spec = KernelSpec(
        name=f"topk_radix_large_{MODE_TAGS[mode]}_{DTYPE_TAGS[dtype]}_{arch}", arch=arch, family="radix",
        template=family.template, rule=LARGE_K_PATH, work="large", dtype=dtype, k=N_MAX,
        k_min=largest_rung(policy, arch, dtype) + 1, n_min=1, n_max=N_MAX, exact_n=None, mode=mode, serves=(mode,),
        threads=MAX_THREADS_PER_BLOCK, rows_per_block=1, min_ctas_per_sm=1, vector_width=vec,
        vector_iterations=None, ladder=(), tail_policy=tuning.tail_policy,
        tail_max_iterations=tuning.tail_max_iterations, aot=False, max_registers=family.max_registers,
        spills_allowed=family.spills_allowed, target=tuning.target if tuning.arch_specific else "",
        ship_ptx=tuning.ship_ptx, dynamic_shared_bytes=tuning.shared_row_bytes,
        shared_buffer_bytes=_shared_buffer_bytes(tuning, tuning.shared_row_bytes, N_MAX), loads_in_flight=tuning.loads_in_flight)
    policy._kernel_cache[key] = spec
    return spec


def large_kernels(policy: Policy, arch: str) -> list[KernelSpec]:
    """The large-k path's kernels of one arch, every dtype and mode (none without radix)."""
    if "radix" not in policy.families:
        return []
    return [large_kernel(policy, arch, dtype, mode) for dtype in policy.dtypes for mode in MODES]


def plan(policy: Policy, arch: str) -> list[KernelSpec]:
    """The AOT kernel set of one arch, in a stable order (dispatch order, dtype, K, mode)."""
    _check_arch(policy, arch)
    return [spec for rule in policy.rules if rule.aot
            for dtype in policy.aot_dtypes
            for spec in kernels_of_rule(policy, rule, arch, dtype)]


def jit_kernels(policy: Policy, arch: str) -> list[KernelSpec]:
    """The kernels of the JIT-only rules for one arch, for every dtype they serve."""
    _check_arch(policy, arch)
    return [spec for rule in policy.jit_only_rules([arch]) for dtype in policy.dtypes
            for spec in kernels_of_rule(policy, rule, arch, dtype)]


def all_kernels(policy: Policy, arch: str) -> list[KernelSpec]:
    """Every kernel of one arch that some rule declares, AOT or JIT, in every dtype, in a
    stable order (dispatch order, dtype, K, mode): all that a runtime may be asked for."""
    return [spec for rule in policy.rules for dtype in policy.dtypes
            for spec in kernels_of_rule(policy, rule, arch, dtype)] + large_kernels(policy, arch)


def jit_plan(policy: Policy, arch: str) -> list[KernelSpec]:
    """Every kernel of one arch that the AOT plan leaves to JIT (the JIT-only tiers in
    every dtype, and every rule's kernels in the JIT dtypes), in a stable order."""
    _check_arch(policy, arch)
    return [spec for spec in all_kernels(policy, arch) if not spec.aot]


# ----------------------------------------------------------------------------- dispatch

def in_policy_order(policy: Policy, archs: Iterable[str]) -> list[str]:
    """`archs`, each once, in the policy's order: a bundle of sm_100 and sm_90 is the same,
    byte for byte, however its archs were named."""
    named = list(archs)
    for arch in named:
        _check_arch(policy, arch)
    return [arch for arch in policy.archs if arch in named]


def _check_arch(policy: Policy, arch: str) -> None:
    if arch not in policy.archs:
        raise DispatchError(f"arch: '{arch}' is not in the policy (known: {', '.join(policy.archs)})")


def _built_mode(rule: Rule, mode: str) -> str:
    """The mode of the kernel that serves `mode` requests (a rule may serve both modes with
    its deterministic kernels alone)."""
    return mode if mode in rule.modes else rule.modes[0]
