"""The kernels' parameters: every argument a launch may pass, by name and C type. The templates
render signatures from it, the manifest lists each kernel's `params` from it, and every loader
passes arguments by these names in the manifest's order: it is part of the manifest format."""

from __future__ import annotations


from topkgen.policy import KernelSpec

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
    # A ragged batch (topkgen.runtime's lengths=, starts=), read on the device; null: dense rows.
    "lengths": "const void*",         # null, or rows valid lengths (int32 or int64, window_bytes each)
    "starts": "const void*",          # null, or rows window starts (of the lengths' type); null: 0
    "window_bytes": "int",            # bytes of a lengths (and starts) element: 4 or 8; 0 when null
    "split_n": "int",            # 0; in a split's stage 2, stage 1's n (it finds the windows' candidates)
}
# A ragged batch's parameters, last in every kernel's list (schema 5).
RAGGED_PARAMS = ("lengths", "starts", "window_bytes", "split_n")
# The parameters of each family's kernels, in order. Radix kernels also run split rows.
PARAMS = {
    "register": ("x", "values", "indices", "rows", "n", "k", "largest", *RAGGED_PARAMS),
    "radix": ("x", "x_indices", "values", "indices", "rows", "n", "k", "largest", "chunk", "row_stride",
              *RAGGED_PARAMS),
}


def params(spec: KernelSpec) -> list[dict[str, str]]:
    """The kernel's parameters in order, with their C types: the manifest's `params`."""
    return [{"name": name, "ctype": PARAM_TYPES[name].format(t=C_TYPES[spec.dtype])} for name in PARAMS[spec.family]]
