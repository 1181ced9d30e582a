"""The dispatch table: the answers of `topkgen.policy.select` written down as data, so that
every loader (the Python runtime, loaders/cpp, anyone's) dispatches by lookup alone.

`select` tests k against the rules' k ranges, n against their n windows and, for split rows,
(rows, n, K) against the arch's split section and the kernel's window, nothing else, so its
answer is constant on each box between consecutive breakpoints. `build` evaluates `select`
once per box (at the box's first point inside the domain n >= k), merges neighbours with
the same answer, and `check_against_select` compares the result with `select` on the
boundary grid before a manifest is written. No rule is restated here.

A row is {"k": [lo, hi], "n": [lo, hi], "rows": [lo, hi], "kernel", "source", "chunks",
"aot_fallback", "aot_chunks"}; the ranges are inclusive. `chunks` is how many chunks each
row of the request is cut into when `kernel` serves (1: not split), `aot_chunks` the same
for `aot_fallback` (topkgen.policy.split says how to launch a split).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

from topkgen.policy.model import MODES, N_MAX, DispatchError, Policy
from topkgen.policy.selection import check_rows, check_shape, resident_elements, select, split_capable, unknown_dtype
from topkgen.policy.planning import kernels_of_rule
from topkgen.policy.split import ROWS_MAX

Row = dict[str, Any]
Answer = tuple[str, str, int, "str | None", "int | None"]  # kernel, source, chunks, aot_fallback, aot_chunks


class FieldError(ValueError):
    """A manifest field that breaks the contract; `path` names the field (dispatch.sm_90...)."""

    def __init__(self, path: str, message: str) -> None:
        self.path, self.message = path, message
        super().__init__(f"{path}: {message}")


# ----------------------------------------------------------------------------- building

def _split_specs(policy: Policy, arch: str, dtype: str):
    """The kernels of (arch, dtype) that may run split rows, when the arch splits."""
    if policy.archs[arch].split is None:
        return []
    return [spec for rule in policy.rules for spec in kernels_of_rule(policy, rule, arch, dtype) if split_capable(spec)]


def k_starts(policy: Policy) -> list[int]:
    """Where a k range of some rule or K rung begins, or where a split's merge (chunks x k)
    enters or leaves a kernel's n window: select's answer can change only there."""
    starts = {1}
    for rule in policy.rules:
        starts.add(rule.k_min)
        starts.update(k + 1 for k in rule.k_rungs)  # the last rung's: the large-k path begins
    for arch, tuning in policy.archs.items():
        if tuning.split is None:
            continue
        for dtype in policy.dtypes:
            for spec in _split_specs(policy, arch, dtype):
                for s in tuning.split.chunk_counts():
                    starts.update((-(-spec.n_min // s), spec.n_max // s + 1))
    return sorted(x for x in starts if x <= N_MAX)


def n_starts(policy: Policy, arch: str, dtype: str) -> list[int]:
    """Where an n window of some kernel of (arch, dtype) begins or ends, or where the chunks
    a split gets or a chunk's fit in its kernel's window changes."""
    starts = {1}
    for rule in policy.rules:
        for spec in kernels_of_rule(policy, rule, arch, dtype):
            starts.add(spec.n_min)
            if spec.n_max < N_MAX:
                starts.add(spec.n_max + 1)
    split = policy.archs[arch].split
    if split is not None:
        starts.add(split.min_n)
        for spec in _split_specs(policy, arch, dtype):
            resident = resident_elements(spec)
            for s in split.chunk_counts():
                starts.update((s * split.min_chunk_for(spec.k), s * spec.n_min))
            if resident:  # where the chunks that fit its shared memory change (1: the row fits)
                starts.update(s * (resident - s + 1) + 1 for s in (1, *split.chunk_counts()))
    return sorted(x for x in starts if x <= N_MAX)


def rows_starts(policy: Policy, arch: str) -> list[int]:
    """Where the batch size may change the chunks per row."""
    split = policy.archs[arch].split
    return [1] if split is None else split.rows_starts()


def _answer(policy: Policy, arch: str, dtype: str, k: int, n: int, mode: str, rows: int) -> Answer:
    det = mode == "deterministic"
    sel = select(policy, arch, dtype, k, n, deterministic=det, jit=True, rows=rows)
    fallback, fallback_chunks = None, None
    if dtype in policy.aot_dtypes:
        try:
            aot = select(policy, arch, dtype, k, n, deterministic=det, jit=False, rows=rows)
            fallback, fallback_chunks = aot.kernel.name, aot.chunks
        except DispatchError:  # a policy without aot_covers_all may leave shapes to JIT
            pass
    return sel.kernel.name, sel.source, sel.chunks, fallback, fallback_chunks


def _merged(cells: list[list[Any]], lo: int, hi: int, value: Any) -> None:
    """Append [lo, hi, value] to cells, or widen the last cell when its value is the same."""
    if cells and cells[-1][2] == value:
        cells[-1][1] = hi
    else:
        cells.append([lo, hi, value])


def build_list(policy: Policy, arch: str, dtype: str, mode: str) -> list[Row]:
    """The rows of dispatch[arch][dtype][mode]: disjoint boxes covering the whole domain."""
    ks, ns, rs = k_starts(policy), n_starts(policy, arch, dtype), rows_starts(policy, arch)
    segments: list[list[Any]] = []  # [k_lo, k_hi, n cells]; an n cell is [n_lo, n_hi, rows cells]
    for si, a in enumerate(ks):
        b = ks[si + 1] - 1 if si + 1 < len(ks) else N_MAX
        cells: list[list[Any]] = []
        for ni, lo in enumerate(ns):
            hi = ns[ni + 1] - 1 if ni + 1 < len(ns) else N_MAX
            if hi < a:  # below the diagonal for every k of the segment: outside the domain
                continue
            by_rows: list[list[Any]] = []
            for ri, r in enumerate(rs):
                _merged(by_rows, r, rs[ri + 1] - 1 if ri + 1 < len(rs) else ROWS_MAX,
                        _answer(policy, arch, dtype, a, max(lo, a), mode, r))
            # the first cell starts at n = 1 and so takes in the points below the diagonal
            _merged(cells, lo if cells else 1, hi, by_rows)
        _merged(segments, a, b, cells)
    return [{"k": [k_lo, k_hi], "n": [n_lo, n_hi], "rows": [r_lo, r_hi], "kernel": kernel, "source": source,
             "chunks": chunks, "aot_fallback": fallback, "aot_chunks": fallback_chunks}
            for k_lo, k_hi, cells in segments for n_lo, n_hi, by_rows in cells
            for r_lo, r_hi, (kernel, source, chunks, fallback, fallback_chunks) in by_rows]


def grid_cells(policy: Policy) -> int:
    """The (k, n, rows) cells of every arch's, dtype's and mode's grid that build_list
    walks (those below the diagonal included), asking select at each."""
    ks = len(k_starts(policy))
    return sum(ks * len(n_starts(policy, arch, dtype)) * len(rows_starts(policy, arch)) * len(MODES)
               for arch in policy.archs for dtype in policy.dtypes)


def build(policy: Policy, archs: list[str]) -> dict[str, dict[str, dict[str, list[Row]]]]:
    """dispatch[arch][dtype][mode] for every arch of a bundle and every dtype of the policy."""
    return {arch: {dtype: {mode: build_list(policy, arch, dtype, mode) for mode in MODES}
                   for dtype in policy.dtypes} for arch in archs}


def _beside(points: set[int], lo: int, hi: int) -> list[int]:
    return sorted({p + d for p in points for d in (-1, 0, 1) if lo <= p + d <= hi})


def boundary_grid(policy: Policy, arch: str, dtype: str) -> tuple[list[int], list[int], list[int]]:
    """The k, n and rows values at and beside every breakpoint, K rung and ladder rung: where
    a table and `select` could first disagree. Pair each k with n in ns + [k], n >= k; rows
    matter only where select may split (see `rows_for`)."""
    ks = set(k_starts(policy)) | {r for rule in policy.rules for r in rule.k_rungs} | {N_MAX}
    rungs = {r for rule in policy.rules for r in (*rule.k_rungs, *rule.ladder)}
    ns = set(n_starts(policy, arch, dtype)) | rungs | {N_MAX}
    rs = sorted({r + d for r in rows_starts(policy, arch) for d in (-1, 0) if r + d >= 1} | {ROWS_MAX})
    return _beside(ks, 1, N_MAX), _beside(ns, 1, N_MAX), rs


def rows_for(policy: Policy, arch: str, n: int, rs: list[int]) -> list[int]:
    """The rows values of the boundary grid worth checking at n: all of them where the arch
    may split rows of n elements, else the ends (select's answer does not depend on rows)."""
    split = policy.archs[arch].split
    return rs if split is not None and n >= split.min_n else [1, ROWS_MAX]


def check_against_select(policy: Policy, table: dict[str, dict[str, dict[str, list[Row]]]]) -> int:
    """Compare a table with `select` on the boundary grid, JIT on and off; raise FieldError
    at the first disagreement. Returns the number of decisions compared."""
    compared = 0
    for arch, by_dtype in table.items():
        for dtype, by_mode in by_dtype.items():
            ks, ns, rs = boundary_grid(policy, arch, dtype)
            for mode, rows in by_mode.items():
                index = ListIndex(rows, f"dispatch.{arch}.{dtype}.{mode}")
                for k in ks:
                    for n in sorted({*ns, k}):
                        if n < k:
                            continue
                        for r in rows_for(policy, arch, n, rs):
                            row = rows[index.find(k, n, r)]
                            expect = _answer(policy, arch, dtype, k, n, mode, r)
                            got = (row["kernel"], row["source"], row["chunks"], row["aot_fallback"], row["aot_chunks"])
                            if got != expect:
                                raise FieldError(f"dispatch.{arch}.{dtype}.{mode}",
                                                 f"at k={k} n={n} rows={r} the table says {_words(got)} but select "
                                                 f"says {_words(expect)}")
                            compared += 2
    return compared


def _words(answer: Answer) -> str:
    kernel, source, chunks, fallback, fallback_chunks = answer

    def split(count: int | None) -> str:
        return f" in {count} chunks per row" if count is not None and count > 1 else ""

    return f"{kernel} ({source}{split(chunks)}, without JIT {fallback}{split(fallback_chunks)})"


# ----------------------------------------------------------------------------- reading

MAX_INDEX_VISITS = 1 << 20  # row visits to index all the lists of a manifest; the default policy's take ~8,300


class IndexBudget:
    """The row visits left for indexing a manifest's dispatch lists. Indexing costs, per k
    segment, a pass over the list's rows and a pass over the rows spanning the segment at
    each of its n cuts: quadratic in the rows, so a forged manifest of a few MB could take
    hours and gigabytes. Every loader refuses one that needs more than MAX_INDEX_VISITS."""

    def __init__(self) -> None:
        self.left = MAX_INDEX_VISITS

    def spend(self, visits: int, path: str) -> None:
        self.left -= visits
        if self.left < 0:
            raise FieldError(path, f"the dispatch lists are cut too finely: indexing them takes more than "
                                   f"{MAX_INDEX_VISITS} row visits")


class ListIndex:
    """One dispatch list, checked to be a tiling of the domain and indexed for lookup.

    The check is the one every loader makes (loaders/cpp words it the same way): cut k at
    every row's k bounds; within each k segment [a, b] cut n at the n bounds of the rows that
    span it, from a to N_MAX; within each of those n segments the rows that span it, sorted
    by rows, must not overlap and must serve every batch size from 1 to ROWS_MAX. `budget`
    bounds the work (the load checks pass one for all the lists of a manifest)."""

    def __init__(self, rows: list[Row], path: str, budget: IndexBudget | None = None) -> None:
        for i, row in enumerate(rows):
            for key in ("k", "n", "rows"):
                lo, hi = row[key]
                if lo > hi:
                    raise FieldError(f"{path}[{i}].{key}", f"[{lo}, {hi}] is empty (lo > hi)")
        self.k_starts = sorted({1} | {r["k"][0] for r in rows} | {r["k"][1] + 1 for r in rows if r["k"][1] < N_MAX})
        self.n_starts: list[list[int]] = []       # per k segment: where its n segments start
        self.rows_starts: list[list[list[int]]] = []  # per k and n segment: where its members' rows start
        self.members: list[list[list[int]]] = []      # per k and n segment: its rows, in rows order
        for si, a in enumerate(self.k_starts):
            b = self.k_starts[si + 1] - 1 if si + 1 < len(self.k_starts) else N_MAX
            if budget is not None:
                budget.spend(len(rows), path)
            spanning = [i for i, r in enumerate(rows) if r["k"][0] <= a <= r["k"][1]]
            cuts = sorted({a} | {rows[i]["n"][0] for i in spanning if rows[i]["n"][0] > a}
                          | {rows[i]["n"][1] + 1 for i in spanning if a < rows[i]["n"][1] + 1 <= N_MAX})
            if budget is not None:
                budget.spend(len(spanning) * len(cuts), path)
            starts, by_rows, members = [], [], []
            for ci, c in enumerate(cuts):
                d = cuts[ci + 1] - 1 if ci + 1 < len(cuts) else N_MAX
                here = sorted((i for i in spanning if rows[i]["n"][0] <= c <= rows[i]["n"][1]),
                              key=lambda i: (rows[i]["rows"][0], i))
                if not here:
                    raise FieldError(path, f"no row serves k={a} n={c}..{d}")
                covered, prev = 1, None  # covered: the first batch size not yet served
                for i in here:
                    lo, hi = rows[i]["rows"]
                    if prev is not None and lo <= rows[prev]["rows"][1]:
                        raise FieldError(path, f"rows [{prev}] and [{i}] overlap at k={a}..{b} n={c}..{d} "
                                               f"rows={lo}..{min(hi, rows[prev]['rows'][1])}")
                    if lo > covered:
                        raise FieldError(path, f"no row serves k={a} n={c}..{d} rows={covered}..{lo - 1}")
                    covered, prev = max(covered, hi + 1), i
                if covered <= ROWS_MAX:
                    raise FieldError(path, f"no row serves k={a} n={c}..{d} rows={covered}..{ROWS_MAX}")
                starts.append(c)
                by_rows.append([rows[i]["rows"][0] for i in here])
                members.append(here)
            self.n_starts.append(starts)
            self.rows_starts.append(by_rows)
            self.members.append(members)

    def find(self, k: int, n: int, rows: int) -> int:
        """The index of the row holding (k, n, rows); (k, n) must be in the domain."""
        s = bisect_right(self.k_starts, k) - 1
        t = bisect_right(self.n_starts[s], n) - 1
        return self.members[s][t][bisect_right(self.rows_starts[s][t], rows) - 1]


@dataclass(frozen=True)
class Choice:
    kernel: str
    source: str      # "aot" or "jit"
    chunks: int = 1  # per row: more than 1 runs the split (topkgen.policy.split)


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
                choices = [(Choice(r["kernel"], r["source"], r["chunks"]),
                            None if r["aot_fallback"] is None else Choice(r["aot_fallback"], "aot", r["aot_chunks"]))
                           for r in rows]
                self._lists[dtype, mode == "deterministic"] = ListIndex(rows, f"dispatch.{arch}.{dtype}.{mode}"), choices
            if all(r["aot_fallback"] is None for rows in by_mode.values() for r in rows):
                self._jit_only.add(dtype)

    def lookup(self, dtype: str, k: int, n: int, deterministic: bool, jit: bool, rows: int | None = None) -> Choice:
        """The kernel for a shape, with the messages `select` gives for shapes it refuses.
        rows=None (the batch size unknown) and rows=0 (an empty batch, which launches nothing)
        are served unsplit: the row for rows = ROWS_MAX names the kernel, which serves any
        batch one CTA per row."""
        found = self._lists.get((dtype, bool(deterministic)))
        if found is None:
            raise unknown_dtype(dtype, self.dtypes)
        check_shape(k, n)
        if rows is not None:
            check_rows(rows)
        if not jit and dtype in self._jit_only:
            raise DispatchError(f"dtype: '{dtype}' has no AOT kernels and JIT is disabled")
        index, choices = found
        with_jit, without_jit = choices[index.find(k, n, rows or ROWS_MAX)]
        choice = with_jit if jit else without_jit
        if choice is None:
            mode = "deterministic" if deterministic else "fast"
            raise DispatchError(f"no kernel serves arch={self.arch} dtype={dtype} k={k} n={n} mode={mode} without JIT")
        return choice if rows else Choice(choice.kernel, choice.source)


def serving_table(manifest: dict, policy: Policy, arch: str) -> tuple[ArchTable, bool]:
    """How a bundle serves `arch`, and whether it holds that arch's kernels: its own
    dispatch[arch]; for an arch it lacks (or a manifest older than schema 3, whose table has
    no batch dimension, or schema 3, whose k stops at 1024, which diff still reads) the same table computed once from its
    embedded policy. The runtime and `diff` both ask here, so a bundle side of a diff is
    served exactly as the runtime would serve it."""
    held = arch in manifest["archs"]
    if held and manifest["schema_version"] >= 4:  # 5 adds the ragged parameters, not the table
        return ArchTable(arch, manifest["dispatch"][arch]), True
    return ArchTable(arch, build(policy, [arch])[arch]), held
