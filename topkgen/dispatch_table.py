"""The dispatch table: the answers of `topkgen.policy.select` written down as data, so that
every loader (the Python runtime, loaders/cpp, anyone's) dispatches by lookup alone.

`select` tests k against the rules' k ranges and n against their n windows, nothing else,
so its answer is constant on each box between consecutive breakpoints. `build` evaluates
`select` once per box (at the box's first point inside the domain n >= k), merges
neighbours with the same answer, and `check_against_select` compares the result with
`select` on the boundary grid before a manifest is written. No rule is restated here.

A row is {"k": [lo, hi], "n": [lo, hi], "kernel", "source", "aot_fallback"}; the ranges are
inclusive. A new dispatch input (the batch size for split rows) enters `select` first and
then becomes one more range key of a row.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

from topkgen.policy import (K_MAX, MODES, N_MAX, DispatchError, Policy, check_shape, kernels_of_rule,
                            select)

Row = dict[str, Any]


class FieldError(ValueError):
    """A manifest field that breaks the contract; `path` names the field (dispatch.sm_90...)."""

    def __init__(self, path: str, message: str) -> None:
        self.path, self.message = path, message
        super().__init__(f"{path}: {message}")


# ----------------------------------------------------------------------------- building

def k_starts(policy: Policy) -> list[int]:
    """Where a k range of some rule or K rung begins: select's answer can change only there."""
    starts = {1}
    for rule in policy.rules:
        starts.add(rule.k_min)
        starts.update(k + 1 for k in rule.k_rungs if k < K_MAX)
    return sorted(starts)


def n_starts(policy: Policy, arch: str, dtype: str) -> list[int]:
    """Where an n window of some kernel of (arch, dtype) begins or ends."""
    starts = {1}
    for rule in policy.rules:
        for spec in kernels_of_rule(policy, rule, arch, dtype):
            starts.add(spec.n_min)
            if spec.n_max < N_MAX:
                starts.add(spec.n_max + 1)
    return sorted(starts)


def _answer(policy: Policy, arch: str, dtype: str, k: int, n: int, mode: str) -> tuple[str, str, str | None]:
    det = mode == "deterministic"
    sel = select(policy, arch, dtype, k, n, deterministic=det, jit=True)
    fallback = None
    if dtype in policy.aot_dtypes:
        try:
            fallback = select(policy, arch, dtype, k, n, deterministic=det, jit=False).kernel.name
        except DispatchError:  # a policy without aot_covers_all may leave shapes to JIT
            fallback = None
    return sel.kernel.name, sel.source, fallback


def build_list(policy: Policy, arch: str, dtype: str, mode: str) -> list[Row]:
    """The rows of dispatch[arch][dtype][mode]: disjoint boxes covering the whole domain."""
    ks, ns = k_starts(policy), n_starts(policy, arch, dtype)
    segments: list[list[Any]] = []  # [k_lo, k_hi, cells], cells = [[n_lo, n_hi, answer], ...]
    for si, a in enumerate(ks):
        b = ks[si + 1] - 1 if si + 1 < len(ks) else K_MAX
        cells: list[list[Any]] = []
        for ni, lo in enumerate(ns):
            hi = ns[ni + 1] - 1 if ni + 1 < len(ns) else N_MAX
            if hi < a:  # below the diagonal for every k of the segment: outside the domain
                continue
            answer = _answer(policy, arch, dtype, a, max(lo, a), mode)
            if cells and cells[-1][2] == answer:
                cells[-1][1] = hi
            else:  # the first cell starts at n = 1 and so takes in the points below the diagonal
                cells.append([lo if cells else 1, hi, answer])
        if segments and segments[-1][2] == cells:
            segments[-1][1] = b
        else:
            segments.append([a, b, cells])
    return [{"k": [k_lo, k_hi], "n": [n_lo, n_hi], "kernel": kernel, "source": source, "aot_fallback": fallback}
            for k_lo, k_hi, cells in segments for n_lo, n_hi, (kernel, source, fallback) in cells]


def build(policy: Policy, archs: list[str]) -> dict[str, dict[str, dict[str, list[Row]]]]:
    """dispatch[arch][dtype][mode] for every arch of a bundle and every dtype of the policy."""
    return {arch: {dtype: {mode: build_list(policy, arch, dtype, mode) for mode in MODES}
                   for dtype in policy.dtypes} for arch in archs}


def boundary_grid(policy: Policy, arch: str, dtype: str) -> tuple[list[int], list[int]]:
    """The k and n values at and beside every breakpoint, K rung and ladder rung: where a
    table and `select` could first disagree. Pair each k with n in ns + [k], n >= k."""
    ks: set[int] = {K_MAX}
    for s in k_starts(policy):
        ks.update((s - 1, s, s + 1))
    ns: set[int] = {N_MAX}
    rungs = {r for rule in policy.rules for r in (*rule.k_rungs, *rule.ladder)}
    for s in set(n_starts(policy, arch, dtype)) | rungs:
        ns.update((s - 1, s, s + 1))
    for rule in policy.rules:
        ks.update(r + d for r in rule.k_rungs for d in (-1, 0, 1))
    return sorted(k for k in ks if 1 <= k <= K_MAX), sorted(n for n in ns if 1 <= n <= N_MAX)


def check_against_select(policy: Policy, table: dict[str, dict[str, dict[str, list[Row]]]]) -> int:
    """Compare a table with `select` on the boundary grid, JIT on and off; raise FieldError
    at the first disagreement. Returns the number of decisions compared."""
    compared = 0
    for arch, by_dtype in table.items():
        for dtype, by_mode in by_dtype.items():
            ks, ns = boundary_grid(policy, arch, dtype)
            for mode, rows in by_mode.items():
                index = ListIndex(rows, f"dispatch.{arch}.{dtype}.{mode}")
                for k in ks:
                    for n in sorted({*ns, k}):
                        if n < k:
                            continue
                        row = rows[index.find(k, n)]
                        expect = _answer(policy, arch, dtype, k, n, mode)
                        if (row["kernel"], row["source"], row["aot_fallback"]) != expect:
                            raise FieldError(f"dispatch.{arch}.{dtype}.{mode}",
                                             f"at k={k} n={n} the table says {row['kernel']} ({row['source']}, "
                                             f"without JIT {row['aot_fallback']}) but select says {expect[0]} "
                                             f"({expect[1]}, without JIT {expect[2]})")
                        compared += 2
    return compared


# ----------------------------------------------------------------------------- reading

class ListIndex:
    """One dispatch list, checked to be a tiling of the domain and indexed for lookup.

    The check is the one every loader makes (loaders/cpp words it the same way): cut k at
    every row's k bounds; within each k segment [a, b] the rows that span it, sorted by n,
    must not overlap and must serve every n from a to N_MAX."""

    def __init__(self, rows: list[Row], path: str) -> None:
        for i, row in enumerate(rows):
            for key in ("k", "n"):
                lo, hi = row[key]
                if lo > hi:
                    raise FieldError(f"{path}[{i}].{key}", f"[{lo}, {hi}] is empty (lo > hi)")
        starts = sorted({1} | {r["k"][0] for r in rows} | {r["k"][1] + 1 for r in rows if r["k"][1] < K_MAX})
        self.k_starts = starts
        self.n_starts: list[list[int]] = []
        self.members: list[list[int]] = []
        for si, a in enumerate(starts):
            b = starts[si + 1] - 1 if si + 1 < len(starts) else K_MAX
            members = sorted((i for i, r in enumerate(rows) if r["k"][0] <= a <= r["k"][1]),
                             key=lambda i: (rows[i]["n"][0], i))
            covered, prev = a, None  # covered: the first n not yet served at k = a
            for i in members:
                lo, hi = rows[i]["n"]
                if prev is not None and lo <= rows[prev]["n"][1]:
                    raise FieldError(path, f"rows [{prev}] and [{i}] overlap at k={a}..{b} "
                                           f"n={lo}..{min(hi, rows[prev]['n'][1])}")
                if lo > covered:
                    raise FieldError(path, f"no row serves k={a} n={covered}..{lo - 1}")
                covered, prev = max(covered, hi + 1), i
            if covered <= N_MAX:
                raise FieldError(path, f"no row serves k={a} n={covered}..{N_MAX}")
            self.members.append(members)
            self.n_starts.append([rows[i]["n"][0] for i in members])

    def find(self, k: int, n: int) -> int:
        """The index of the row holding (k, n); (k, n) must be in the domain."""
        s = bisect_right(self.k_starts, k) - 1
        return self.members[s][bisect_right(self.n_starts[s], n) - 1]


@dataclass(frozen=True)
class Choice:
    kernel: str
    source: str  # "aot" or "jit"


class ArchTable:
    """dispatch[arch] of a manifest, ready for lookups: what the runtime does per call."""

    def __init__(self, arch: str, by_dtype: dict[str, dict[str, list[Row]]]) -> None:
        self.arch = arch
        self.dtypes = tuple(by_dtype)
        # (dtype, deterministic) -> (index, per row: (choice with JIT, choice without JIT or None))
        self._lists: dict[tuple[str, bool], tuple[ListIndex, list[tuple[Choice, Choice | None]]]] = {}
        self._jit_only: set[str] = set()
        for dtype, by_mode in by_dtype.items():
            for mode, rows in by_mode.items():
                choices = [(Choice(r["kernel"], r["source"]),
                            None if r["aot_fallback"] is None else Choice(r["aot_fallback"], "aot")) for r in rows]
                self._lists[dtype, mode == "deterministic"] = ListIndex(rows, f"dispatch.{arch}.{dtype}.{mode}"), choices
            if all(r["aot_fallback"] is None for rows in by_mode.values() for r in rows):
                self._jit_only.add(dtype)

    def lookup(self, dtype: str, k: int, n: int, deterministic: bool, jit: bool) -> Choice:
        """The kernel for a shape, with the messages `select` gives for shapes it refuses."""
        found = self._lists.get((dtype, bool(deterministic)))
        if found is None:
            raise DispatchError(f"dtype: '{dtype}' is not in the bundle (known: {', '.join(sorted(self.dtypes))})")
        check_shape(k, n)
        if not jit and dtype in self._jit_only:
            raise DispatchError(f"dtype: '{dtype}' has no AOT kernels and JIT is disabled")
        index, choices = found
        with_jit, without_jit = choices[index.find(k, n)]
        if jit:
            return with_jit
        if without_jit is None:
            mode = "deterministic" if deterministic else "fast"
            raise DispatchError(f"no kernel serves arch={self.arch} dtype={dtype} k={k} n={n} mode={mode} without JIT")
        return without_jit


def serving_table(manifest: dict, policy: Policy, arch: str) -> tuple[ArchTable, bool]:
    """How a bundle serves `arch`, and whether it holds that arch's kernels: its own
    dispatch[arch]; for an arch it lacks (or a schema-1 manifest, which has no table) the same
    table computed once from its embedded policy. The runtime and `diff` both ask here, so a
    bundle side of a diff is served exactly as the runtime would serve it."""
    held = arch in manifest["archs"]
    if held and "dispatch" in manifest:
        return ArchTable(arch, manifest["dispatch"][arch]), True
    return ArchTable(arch, build(policy, [arch])[arch]), held
