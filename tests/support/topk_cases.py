"""Inputs, launches and checks shared by the kernel and runtime tests: rows with NaN
payloads of both signs, infinities, signed zeros, subnormals, all-equal rows and heavy ties."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from topkgen.runtime import reference
from topkgen.manifest.params import param_names
from topkgen.runtime import launch_arguments, launch_shared_bytes

NUMPY_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
BITS = {"float32": np.uint32, "bfloat16": np.uint16, "float16": np.uint16}
# (quiet NaN, negative NaN with payload, +inf, -inf, smallest subnormal, largest negative subnormal)
SPECIAL_BITS = {
    "float32": (0x7FC00000, 0xFFC00123, 0x7F800000, 0xFF800000, 0x00000001, 0x807FFFFF),
    "bfloat16": (0x7FC0, 0xFFC3, 0x7F80, 0xFF80, 0x0001, 0x807F),
    "float16": (0x7E00, 0xFE03, 0x7C00, 0xFC00, 0x0001, 0x83FF),
}
PATTERNS = ("random", "ties", "all_equal", "specials", "ascending", "neg_inf_and_nan")


def make_rows(dtype: str, rows: int, n: int, seed: int) -> np.ndarray:
    """rows x n values; row r uses PATTERNS[r % len(PATTERNS)]."""
    rng = np.random.default_rng(seed)
    np_t = NUMPY_DTYPES[dtype]
    out = np.empty((rows, n), dtype=np_t)
    for r in range(rows):
        pattern = PATTERNS[r % len(PATTERNS)]
        if pattern == "random":
            row = rng.standard_normal(n).astype(np.float32) * 100
            row[rng.integers(0, n, size=n // 8 + 1)] = row[0]  # some duplicates
            out[r] = row.astype(np_t)
        elif pattern == "ties":
            out[r] = rng.choice(np.array([-1.0, 0.0, 1.0, 2.0], np.float32), size=n).astype(np_t)
        elif pattern == "all_equal":
            out[r] = np_t(3.0)
        elif pattern == "ascending":
            out[r] = (np.arange(n, dtype=np.float32) % 2000 - 1000).astype(np_t)
        else:
            bits = rng.integers(0, 2 ** (8 * np.dtype(BITS[dtype]).itemsize), size=n, dtype=np.uint64)
            bits = bits.astype(BITS[dtype])
            specials = np.array(SPECIAL_BITS[dtype] + (0, 1 << (8 * np.dtype(BITS[dtype]).itemsize - 1)),
                               dtype=BITS[dtype])  # ..., +0, -0
            if pattern == "neg_inf_and_nan":
                bits[:] = specials[3]
                bits[rng.integers(0, n, size=max(1, n // 16))] = specials[1]
                bits[rng.integers(0, n, size=max(1, n // 16))] = specials[0]
            else:
                where = rng.random(n) < 0.5
                bits[where] = rng.choice(specials, size=int(where.sum()))
            out[r] = bits.view(np_t)
    return out


def launch_kernel(module, spec, x: np.ndarray, k: int, largest: bool = True, *, shared_bytes: int | None = None,
                  **options):
    """One unsplit launch of a planned kernel (a KernelSpec) over the rows of x on the
    emulator, with the arguments, grid and dynamic shared memory a runtime call gives it;
    `shared_bytes`: another launch's dynamic shared memory instead, allocated exactly and
    passed as the kernel's argument (a radix kernel's); `options` go to Module.launch
    (schedule_seed, workers, counters). Returns (values, indices, what the launch returned)."""
    rows, n = x.shape
    values, indices = np.zeros((rows, k), x.dtype), np.full((rows, k), -1, np.int64)
    grid = (rows + spec.rows_per_block - 1) // spec.rows_per_block
    args = launch_arguments(spec, x, values, indices, rows, n, k, largest)
    if shared_bytes is None:
        shared_bytes = launch_shared_bytes(spec, n)
    else:
        args[param_names(spec).index("shared_bytes")] = np.int32(shared_bytes)
    result = module.launch(spec.name, grid, spec.threads, args, shared_bytes=shared_bytes, **options)
    return values, indices, result


def check_topk(x: np.ndarray, values: np.ndarray, indices: np.ndarray, k: int, largest: bool,
               deterministic: bool, dtype: str, what: str = "") -> None:
    """Deterministic: bit-exact against the reference. Fast: the same keys in the same order,
    distinct indices, and values that are exactly the input at those indices."""
    ref_values, ref_indices = reference.topk(x, k, largest=largest)
    bits_t = BITS[dtype]
    if deterministic:
        np.testing.assert_array_equal(indices, ref_indices, err_msg=f"{what}: indices differ")
        np.testing.assert_array_equal(values.view(bits_t), ref_values.view(bits_t), err_msg=f"{what}: values differ")
        return
    rows = x.reshape(-1, x.shape[-1])
    idx = indices.reshape(-1, k)
    assert ((idx >= 0) & (idx < x.shape[-1])).all(), f"{what}: index out of range"
    for r in range(rows.shape[0]):
        assert len(set(idx[r].tolist())) == k, f"{what}: row {r} has repeated indices"
    gathered = np.take_along_axis(rows, idx, axis=-1)
    np.testing.assert_array_equal(values.reshape(-1, k).view(bits_t), gathered.view(bits_t),
                                  err_msg=f"{what}: values are not the inputs at the returned indices")
    np.testing.assert_array_equal(reference.select_keys(values, largest), reference.select_keys(ref_values, largest),
                                  err_msg=f"{what}: selected values differ from the reference")


class PolicyKernels:
    """A test policy's kernels for one K (the kernel `select` gives at rows of 100000, per
    arch, dtype and mode of `kernels`) and one emulator module of all of them, compiled on
    first use: what the kernel-path tests of a policy of their own share."""

    def __init__(self, text: str, name: str, k: int, kernels: list[tuple[str, str, str]]) -> None:
        self.text, self.name, self.k, self.kernels = text, name, k, kernels
        self._policy = self._module = None

    def policy(self):
        from topkgen import policy as pol

        if self._policy is None:
            self._policy = pol.loads(self.text, source=self.name)
        return self._policy

    def spec(self, arch: str, dtype: str, mode: str):
        from topkgen import policy as pol

        return pol.select(self.policy(), arch, dtype, self.k, 100_000, deterministic=mode == "deterministic").kernel

    def module(self):
        from topkgen.build.render import render
        from topkgen.emulator import compile_source

        if self._module is None:
            self._module = compile_source("".join(render(self.spec(*kernel)) for kernel in self.kernels),
                                          name=self.name)
        return self._module
