"""The top-k kernel policy: load and validate it, plan the kernel set, and dispatch.

This package is the single source of truth shared by the AOT build, the runtime, the JIT
path, `explain` and `diff`. `select` (selection.py) is the only place where dispatch is
decided. It imports the standard library and PyYAML only, so other build systems can use it.

Its modules, in the order they build on each other: model (the types and limits), loading
(YAML -> a validated Policy), planning (the kernel set), selection (dispatch), coverage (the
load-time check that every shape is served), split (chunk plans), dispatch_table (the
lookup tables a manifest ships) and explain. This facade keeps `topkgen.policy.load`,
`loads`, `select`, `plan` and the other names earlier releases exported."""

from __future__ import annotations

from topkgen.policy.model import (
    DTYPE_SIZES, DTYPE_TAGS, MODE_TAGS, MODES, K_RUNG_MAX, K_COVERED, LARGE_K_PATH, N_MAX, VECTOR_BYTES, THREADS_PER_SM,
    THREADS_PER_SM_BY_ARCH, SHARED_BYTES_PER_BLOCK, RADIX_STATIC_SHARED_BYTES, radix_static_shared_bytes, REGISTER_MAX_N,
    REGISTER_MAX_K, WORK_BY_FAMILY,
    FAMILY_TEMPLATES, FAMILY_ARCH_KEYS, MAX_POLICY_BYTES, MAX_KERNELS, MAX_DISPATCH_CELLS, PolicyError,
    DispatchError, SplitTuning, ArchTuning, Family, Rule, KernelSpec, Selection, Policy, rule_record,
    default_policy_path, _data_dir)
from topkgen.policy.loading import load, loads, read_file
from topkgen.policy.planning import (
    arch_capability, block_shape, kernels_of_rule, plan, jit_kernels, all_kernels, jit_plan,
    in_policy_order, largest_rung, large_kernel)
from topkgen.policy.selection import (
    select, unknown_dtype, check_rows, resident_elements, split_capable, check_shape, as_integer,
    as_flag)
from topkgen.policy.coverage import COVERAGE_RULE, GAP_FIX_AOT, GAP_FIX_JIT
from topkgen.policy.split import ROWS_MAX, ChunkPlan

__all__ = [
    "ROWS_MAX", "ChunkPlan",
    "DTYPE_SIZES", "DTYPE_TAGS", "MODE_TAGS", "MODES", "K_RUNG_MAX", "K_COVERED", "LARGE_K_PATH", "N_MAX", "VECTOR_BYTES",
    "THREADS_PER_SM", "THREADS_PER_SM_BY_ARCH", "SHARED_BYTES_PER_BLOCK", "RADIX_STATIC_SHARED_BYTES",
    "radix_static_shared_bytes", "REGISTER_MAX_N",
    "REGISTER_MAX_K", "WORK_BY_FAMILY", "FAMILY_TEMPLATES", "FAMILY_ARCH_KEYS", "MAX_POLICY_BYTES",
    "MAX_KERNELS", "MAX_DISPATCH_CELLS", "PolicyError", "DispatchError", "SplitTuning", "ArchTuning",
    "Family", "Rule", "KernelSpec", "Selection", "Policy", "rule_record", "default_policy_path",
    "_data_dir", "load", "read_file", "loads", "arch_capability", "block_shape", "kernels_of_rule",
    "plan", "jit_kernels", "all_kernels", "jit_plan", "in_policy_order", "largest_rung", "large_kernel", "select", "unknown_dtype",
    "check_rows", "resident_elements", "split_capable", "check_shape", "as_integer", "as_flag",
    "COVERAGE_RULE", "GAP_FIX_JIT", "GAP_FIX_AOT", "ROWS_MAX"
]
