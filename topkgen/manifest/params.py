"""The kernels' parameters: every argument a launch may pass, by name and C type. The templates
render signatures from it, the manifest lists each kernel's `params` from it, and every loader
passes arguments by these names in the manifest's order: it is part of the manifest format."""

from __future__ import annotations


from topkgen.policy import KernelSpec
from topkgen.policy.split import UNSORTED_FLAG

# C types of the kernel parameters, per dtype; the same names go into the manifest.
C_TYPES = {"float32": "float", "bfloat16": "__nv_bfloat16", "float16": "__half"}

# Every kernel parameter a launch may pass, as a C type ({t}: the element type), and what
# it holds. The kernels' signatures are rendered from it, the manifest lists each kernel's
# (`params`), and every loader passes arguments by these names in the manifest's order.
PARAM_TYPES = {
    "x": "const {t}*",                # the input rows
    "x_indices": "const long long*",  # null, or each element's index in the output (a split's stage 2)
    "values": "{t}*",                 # the output: rows x k values
    "indices": "long long*",          # and their indices
    "rows": "int",
    "n": "int",                       # elements per row
    "k": "int",
    "largest": "int",                 # 1: the k largest, 0: the k smallest
    "chunk": "int",                   # elements per chunk (topkgen.policy.split); n: one chunk per row
    "row_stride": "long long",        # elements from one row of x (and x_indices) to the next
    "flags": "int",                   # output flags (schema 5): OUTPUT_FLAGS, or'ed
    # A ragged batch (topkgen.runtime's lengths=, starts=), read on the device; null: dense rows.
    "lengths": "const void*",         # null, or rows valid lengths (int32 or int64, window_bytes each)
    "starts": "const void*",          # null, or rows window starts (of the lengths' type); null: 0
    "window_bytes": "int",            # bytes of a lengths (and starts) element: 4 or 8; 0 when null
    "split_n": "int",                 # 0; in a split's stage 2, stage 1's n (it finds the windows' candidates)
    "shared_bytes": "int",            # radix (schema 6): the launch's dynamic shared memory (split.SharedMemory)
    "scratch": "void*",               # the large-k path: null, or rows x k x 8 bytes for its candidates
    # A split in one launch (schema 7, topkgen.policy.split): stage 1 with these, its last CTA of
    # each row merging the row's candidates into the output; null tickets: no merge here.
    "tickets": "unsigned int*",       # null, or rows zeroed words (the kernel leaves them zero)
    "merged_values": "{t}*",          # the output of the merge: rows x k values
    "merged_indices": "long long*",   # and their indices
    "merged_flags": "int",            # the output's flags (`flags` is stage 1's)
}
# The `flags` bits: sorted=False (the final sort is skipped; deterministic kernels sort anyway,
# the order they return is the sorted one) and index_dtype="int32" (the kernel writes int32
# indices into `indices`). templates/topk_common.cuh has the same numbers (kUnsorted,
# kInt32Indices); the manifest's `options` states them for every loader.
OUTPUT_FLAGS = {"unsorted": UNSORTED_FLAG, "int32_indices": 2}
# A ragged batch's parameters, after `flags` in every kernel's list (schema 5).
RAGGED_PARAMS = ("lengths", "starts", "window_bytes", "split_n")
# The parameters of each family's kernels, in order. Radix kernels also run split rows, and take
# the dynamic shared memory their launch was given (`shared_bytes`, schema 6) after split_n, then
# what a split in one launch needs where the kernel can split (KernelSpec.merges, schema 7).
# The large-k path's radix kernels (work "large") also take `scratch`: with int32 indices its
# candidates (8 bytes each) no longer fit in the indices output it gathers them into.
PARAMS = {
    "register": ("x", "values", "indices", "rows", "n", "k", "largest", "flags", *RAGGED_PARAMS),
    "radix": ("x", "x_indices", "values", "indices", "rows", "n", "k", "largest", "chunk", "row_stride", "flags",
              *RAGGED_PARAMS, "shared_bytes"),
    "large": ("x", "x_indices", "values", "indices", "rows", "n", "k", "largest", "chunk", "row_stride", "flags",
              *RAGGED_PARAMS, "shared_bytes", "scratch"),
}
MERGE_PARAMS = ("tickets", "merged_values", "merged_indices", "merged_flags")


def param_names(spec: KernelSpec) -> tuple[str, ...]:
    """The names of the kernel's parameters, in order."""
    return PARAMS["large" if spec.work == "large" else spec.family] + (MERGE_PARAMS if spec.merges else ())


def output_flags(sorted_: bool, index_dtype: str) -> int:
    """The `flags` argument of a request's output launch."""
    return (0 if sorted_ else OUTPUT_FLAGS["unsorted"]) | (OUTPUT_FLAGS["int32_indices"] if index_dtype == "int32" else 0)


def params(spec: KernelSpec) -> list[dict[str, str]]:
    """The kernel's parameters in order, with their C types: the manifest's `params`."""
    return [{"name": name, "ctype": PARAM_TYPES[name].format(t=C_TYPES[spec.dtype])} for name in param_names(spec)]
