"""The dispatch rule, in one place: `select` says which kernel (and which split) serves a shape,
and why. The build, the runtime, explain, diff and the dispatch table all ask it."""

from __future__ import annotations

import operator
import sys
from typing import Iterable

from topkgen.common import suggest
from topkgen.policy.split import ROWS_MAX, ChunkPlan
from topkgen.policy.model import (
    DTYPE_SIZES, LARGE_K_PATH, DispatchError, KernelSpec, N_MAX, SHARED_BYTES_PER_BLOCK, Policy, Rule, Selection,
    SplitTuning, VECTOR_BYTES)
from topkgen.policy.planning import _built_mode, _check_arch, kernels_of_rule, large_kernel, largest_rung


def _rule_matches(policy: Policy, rule: Rule, arch: str, dtype: str, k: int, n: int,
                  mode: str) -> KernelSpec | None:
    if arch not in rule.archs or dtype not in rule.dtypes or mode not in rule.serves:
        return None
    if not (rule.k_min <= k <= rule.k_rungs[-1]):
        return None
    built_mode = _built_mode(rule, mode)
    for spec in kernels_of_rule(policy, rule, arch, dtype):
        if spec.k_min <= k <= spec.k and spec.mode == built_mode and spec.serves_n(n):
            return spec
    return None


def select(policy: Policy, arch: str, dtype: str, k: int, n: int, deterministic: bool = False,
           jit: bool = True, rows: int | None = None) -> Selection:
    """The kernel that serves (arch, dtype, k, n, mode): the first rule in dispatch order
    that serves the shape. With jit=False, JIT-only rules are skipped and the shape must be
    of an AOT dtype. With `rows`, the batch size, the answer says whether the rows are split
    and how (`Selection.split`); rows=None, a caller that does not know the batch, never
    splits: it gets the one-CTA-per-row answer, which serves any batch. This is the only
    dispatch rule in topkgen."""
    deterministic, jit = as_flag("deterministic", deterministic), as_flag("jit", jit)
    _check_arch(policy, arch)
    if dtype not in policy.dtypes:
        raise unknown_dtype(dtype, policy.dtypes)
    check_shape(k, n)
    if rows is not None:
        check_rows(rows)
    if not jit and dtype not in policy.aot_dtypes:
        raise DispatchError(f"dtype: '{dtype}' has no AOT kernels and JIT is disabled")
    mode = "deterministic" if deterministic else "fast"
    largest = largest_rung(policy, arch, dtype)
    if k > largest:
        return _large(policy, arch, dtype, k, n, mode, largest, jit, rows)
    skipped: list[str] = []
    for rule in policy.rules:
        spec = _rule_matches(policy, rule, arch, dtype, k, n, mode)
        if spec is None:
            continue
        if not jit and not rule.aot:
            skipped.append(rule.name)
            continue
        split = _split(policy, arch, spec, rows, n, k)

        def why(rule: Rule = rule, spec: KernelSpec = spec) -> str:
            reason = _reason(policy, rule, spec, dtype, k, n, mode, skipped)
            if split is None:
                reason += _shared_words(policy, spec, n, k)
            if rows is None:
                return reason
            return f"{reason}; {_split_reason(policy.archs[arch].split, spec, rows, n, split)}"

        return Selection(spec, "aot" if spec.aot else "jit", rule.name, why, tuple(skipped), split)
    raise DispatchError(f"no kernel serves arch={arch} dtype={dtype} k={k} n={n} mode={mode}"
                        f"{' without JIT' if not jit else ''}")


def _large(policy: Policy, arch: str, dtype: str, k: int, n: int, mode: str, largest: int, jit: bool,
           rows: int | None) -> Selection:
    """The large-k path's answer: k above every K rung of (arch, dtype)."""
    if not jit:
        # worded as every loader's table lookup words it: the large-k path is JIT-only
        raise DispatchError(f"no kernel serves arch={arch} dtype={dtype} k={k} n={n} mode={mode} without JIT")
    spec = large_kernel(policy, arch, dtype, mode)

    def why() -> str:
        reason = (f"k={k} is above the largest K rung {largest} of the rules for {arch} {dtype}: the large-k path "
                  f"(built in, after every rule) serves k {spec.k_min}..n, any n: one CTA of {spec.threads} threads "
                  f"per row finds the k-th key by radix select over the whole row, gathers the k survivors (the "
                  f"keys above it, then its ties{', the lowest indices first' if mode == 'deterministic' else ''}) "
                  f"into the row's slots of the indices output and sorts them there, in global memory (sorted=False "
                  f"skips the sort{' in fast mode' if mode == 'deterministic' else ''}; int32 indices gather them "
                  f"into rows x k x 8 bytes of workspace instead): no workspace with int64 indices, no host "
                  f"synchronisation; mode {mode}; JIT: compiled on first use, never in the bundle")
        if rows is None:
            return reason
        return f"{reason}; not split: the large-k path runs one CTA per row"

    return Selection(spec, "jit", LARGE_K_PATH, why, (), None)


def unknown_dtype(dtype: str, known: Iterable[str]) -> DispatchError:
    """The refusal of a dtype that `known` (a policy's, a bundle's) lacks, in the words the
    command line (cli.DtypeType) and the runtime's dtype= use, suggestion included: `choose`
    said "'flaot32' is not in the bundle (known: ...)" and suggested nothing."""
    known = set(known)
    return DispatchError(f"dtype: {suggest.unknown_dtype(dtype, [d for d in DTYPE_SIZES if d in known])}")


def check_rows(rows: int) -> None:
    """Refuse a batch size outside 0 <= rows <= ROWS_MAX, with the message every loader gives.
    0 is a request too: an empty batch launches nothing, so it is served unsplit, as an
    unknown batch is, and needs no workspace."""
    rows = as_integer("rows", rows)
    if rows < 0:
        raise DispatchError(f"rows: must be >= 0, got {rows}")
    if rows > ROWS_MAX:
        raise DispatchError(f"rows: must be <= {ROWS_MAX}, got {rows}")


def resident_elements(spec: KernelSpec) -> int:
    """The longest row (or chunk) a radix kernel reads once into its dynamic shared memory
    (the kernel's own test: n <= bytes / size - (16 / size - 1)); 0 when it has none."""
    size = DTYPE_SIZES[spec.dtype]
    return max(0, spec.dynamic_shared_bytes // size - (VECTOR_BYTES // size - 1))


STREAM_THREADS_BELOW = 1024  # the kernel's kStreams: blocks of 1024 threads re-read instead
CANDIDATE_BYTES = 8          # a packed candidate: key and index


def streams(spec: KernelSpec, k: int) -> bool:
    """Whether a radix kernel reads a row longer than its shared memory once, keeping the keys
    above a rising floor in per-thread lists there (templates/topk_common.cuh, `stream`: each
    list must hold its share of k and one step's keys); otherwise it reads such a row in each
    pass. The same test as the kernel's, on the launch's whole dynamic shared memory."""
    if spec.family != "radix" or spec.work == "large" or spec.dynamic_shared_bytes == 0 or spec.threads >= STREAM_THREADS_BELOW:
        return False
    lists = spec.dynamic_shared_bytes // CANDIDATE_BYTES // spec.threads
    step_keys = spec.loads_in_flight * (VECTOR_BYTES // DTYPE_SIZES[spec.dtype])
    return lists - step_keys >= -(-min(k, spec.k) // spec.threads)


def split_capable(spec: KernelSpec) -> bool:
    """Whether a kernel can run on chunks and merge candidates (it takes chunk, row_stride
    and x_indices: the radix family)."""
    return spec.family == "radix" and spec.work != "large"


def _split(policy: Policy, arch: str, spec: KernelSpec, rows: int | None, n: int, k: int) -> ChunkPlan | None:
    """The chunk plan of a request, or None: the arch's split rule, then the kernel's own
    limits (it must take chunks, and its n window must hold every chunk and the merge)."""
    tuning = policy.archs[arch].split
    if not rows or tuning is None or not split_capable(spec):  # unknown or empty batch: unsplit
        return None
    chunks = tuning.chunks(rows, n, spec.k, resident_elements(spec))
    if chunks < 2:
        return None
    plan = ChunkPlan(rows, n, k, chunks, DTYPE_SIZES[spec.dtype], one_launch=spec.merges)
    if not spec.n_min <= min(plan.chunk, plan.candidates) or plan.candidates > spec.n_max:
        return None
    return plan


def _shared_words(policy: Policy, spec: KernelSpec, n: int, k: int) -> str:
    """What a radix kernel's shared memory does with a row of n, when the row does not fit:
    the arch's shared_row_bytes, bounded by its documented shared memory per block, decides
    how long a row is read once (a 99 KB part holds less than a 227 KB one)."""
    resident = resident_elements(spec)
    if spec.family != "radix" or resident == 0 or n <= resident:
        return ""
    arch = policy.archs[spec.arch]
    how = ("the row is read once, the keys above a floor that rises as it is read kept there"
           if streams(spec, k) else "the row is read more than once (twice on random rows), its candidates kept there")
    return (f"; n={n} is longer than the {resident} elements its {spec.dynamic_shared_bytes} bytes of dynamic "
            f"shared memory hold ({spec.arch}'s shared_row_bytes {arch.shared_row_bytes}, within the "
            f"{SHARED_BYTES_PER_BLOCK[spec.arch]} bytes a block may have there): {how}")


def _split_reason(tuning: SplitTuning | None, spec: KernelSpec, rows: int, n: int, split: ChunkPlan | None) -> str:
    if rows == 0:
        return "not split: rows=0, an empty batch launches nothing"
    if tuning is None:
        return "not split: the arch has no split section"
    if not split_capable(spec):
        return f"not split: {spec.family} kernels do not take chunks"
    if rows >= tuning.rows_below_for(spec.k):
        which = f"rows_below_by_k[{spec.k}]" if spec.k in tuning.rows_below_by_k else "rows_below"
        return f"not split: rows={rows} >= {which} {tuning.rows_below_for(spec.k)}"
    if n < tuning.min_n:
        return f"not split: n={n} < min_n {tuning.min_n}"
    resident = resident_elements(spec)
    fill = f"{tuning.sm_count} SMs x {tuning.ctas_per_sm} / {rows} rows = {tuning.sm_count * tuning.ctas_per_sm // rows}"
    if resident:
        fill = f"max({fill}, {tuning.fitting(n, resident)} chunks fit the kernel's shared memory)"
    bounds = (f"max_chunks {tuning.max_chunks}, n / max(min_chunk {tuning.min_chunk}, {tuning.chunk_per_k} x K "
              f"{spec.k}) = {n // tuning.min_chunk_for(spec.k)} and {fill}")
    if split is None:
        chunks = tuning.chunks(rows, n, spec.k, resident)
        if chunks < 2:
            return f"not split: fewer than 2 chunks within {bounds}"
        return (f"not split: the kernel's n window [{spec.n_min}, {spec.n_max}] does not hold {chunks} chunks of "
                f"{n // chunks} and their merge")
    return f"split into {split.chunks} chunks per row: the largest power of two within {bounds}"


def check_shape(k: int, n: int) -> None:
    """Refuse a (k, n) outside the dispatch domain, 1 <= k <= n <= N_MAX, with the message
    every loader gives (the manifest's table lookups call this too)."""
    _check_counts(("k", k, N_MAX), ("n", n, N_MAX))
    if k > n:
        raise DispatchError(f"k: must be <= n, got k={k} > n={n}")


def as_integer(label: str, value: object) -> int:
    """`value` as a Python int: any integral type (numpy's integers too, through
    operator.index), so that every entry point takes what `x.shape` or arithmetic on arrays
    gives; a bool is refused, though Python counts it an int: True is never a k or an n."""
    numpy = sys.modules.get("numpy")  # numpy's bool has __index__ too; checked without importing numpy
    if isinstance(value, bool) or (numpy is not None and isinstance(value, numpy.bool_)):
        raise DispatchError(f"{label}: must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise DispatchError(f"{label}: must be an integer, got {value!r}") from None


def as_flag(label: str, value: object) -> bool:
    """A yes/no argument as a bool: a bool (numpy's too), never a value Python merely finds
    truthy: `deterministic="no"` or `jit=None` would quietly have served the other request."""
    numpy = sys.modules.get("numpy")
    if isinstance(value, bool) or (numpy is not None and isinstance(value, numpy.bool_)):
        return bool(value)
    raise DispatchError(f"{label}: expected True or False, got {value!r}")


def _check_counts(*counts: tuple[str, object, int]) -> None:
    """Each (label, value, most) an integer in 1..most: every type first, then every range."""
    values = [as_integer(label, value) for label, value, _ in counts]
    for (label, _, most), value in zip(counts, values):
        if value <= 0:
            raise DispatchError(f"{label}: must be >= 1, got {value}")
        if value > most:
            raise DispatchError(f"{label}: must be <= {most}, got {value}")


def _reason(policy: Policy, rule: Rule, spec: KernelSpec, dtype: str, k: int, n: int, mode: str,
            skipped: list[str]) -> str:
    window = f"n == {spec.exact_n}" if spec.work == "exact" else f"n in [{spec.n_min}, {spec.n_max}]"
    parts = [f"rule '{rule.name}' (#{rule.position + 1} in dispatch_order) is the first that serves "
             f"k={k} (K rung {spec.k} serves k {spec.k_min}..{spec.k}), n={n} ({window}), mode {mode}"]
    if mode != spec.mode:
        parts.append(f"its {spec.mode} kernel serves {mode} requests too")
    if skipped:
        parts.append(f"JIT disabled: skipped JIT-only rule(s) {', '.join(skipped)}")
    if not rule.aot:
        parts.append(f"JIT-only tier: {rule.reason}")
    elif dtype not in policy.aot_dtypes:
        parts.append(f"JIT: {dtype} has no AOT kernels")
    else:
        parts.append("AOT: in the bundle")
    return "; ".join(parts)
