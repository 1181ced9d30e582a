"""Load-time checks that every shape of every arch, dtype and mode is served (or refused with the
fix), asked of the dispatch table so that the check and the loaders see one grid."""

from __future__ import annotations



from topkgen.policy.model import MAX_DISPATCH_CELLS, MODES, N_MAX, Policy, _Locator
from topkgen.policy.planning import _built_mode, kernels_of_rule, largest_rung


COVERAGE_RULE = ("Every arch, dtype and mode of a policy needs a kernel for every 1 <= k <= 1024 (and up to "
                 "its largest K rung) and k <= n <= 2^31-1; k above the largest K rung is served by the "
                 "large-k path.")
GAP_FIX_JIT = ("To leave the shapes your rules do not cover to JIT, add a JIT-only rule and put it last in "
               "dispatch_order: {name: jit_rest, family: radix, work: dynamic, k: [1024], "
               "n: {min: 1, max: 2147483647}, modes: [fast, deterministic], aot: false, reason: \"...\"} "
               "(it serves whatever no earlier rule serves; declare the radix family if the policy lacks it).")
GAP_FIX_AOT = ("aot_covers_all: true asks the AOT rules to serve it alone: add an AOT rule for it, or set "
               "aot_covers_all: false to let JIT-only rules serve it.")


def _check_total_dispatch(policy: Policy, loc: _Locator) -> None:
    """Every (dtype, 1 <= k <= the largest K rung (at least 1024), k <= n <= 2^31-1, mode)
    must be served on every arch with JIT (k above it goes to the large-k path) and, where
    the policy says aot_covers_all, by AOT kernels alone for AOT dtypes, every k up to the
    largest K rung of the AOT rules (at least 1024). The rules' k ranges and n windows are
    intervals, so checking the n coverage at each k-segment start proves it for all k."""
    k_starts = {1}
    for rule in policy.rules:
        k_starts.add(rule.k_min)
        for k in rule.k_rungs:
            k_starts.add(k + 1)
    for arch in policy.archs:
        for dtype in policy.dtypes:
            top = largest_rung(policy, arch, dtype)
            top_aot = max([1024] + [r.k_rungs[-1] for r in policy.rules
                                    if r.aot and arch in r.archs and dtype in r.dtypes])
            for mode in MODES:
                for with_jit in (True, False):
                    if not with_jit and (dtype not in policy.aot_dtypes or not policy.aot_covers_all):
                        continue
                    for k in sorted(x for x in k_starts if x <= (top if with_jit else top_aot)):
                        gap = _n_gap(policy, arch, dtype, mode, k, with_jit)
                        if gap is not None:
                            raise loc.error(("dispatch_order",),
                                            f"the rules leave a gap: nothing serves arch={arch} dtype={dtype} "
                                            f"mode={mode} k={k} n={gap[0]}..{gap[1]}"
                                            f"{'' if with_jit else ' without JIT'}. {COVERAGE_RULE} "
                                            f"{GAP_FIX_AOT if not with_jit else GAP_FIX_JIT}")


def _check_dispatch_grid(policy: Policy, loc: _Locator) -> None:
    from topkgen.policy import dispatch_table  # it reads a Policy: imported once there is one

    cells = dispatch_table.grid_cells(policy)
    if cells > MAX_DISPATCH_CELLS:
        raise loc.error(("rules",), f"the rules' k, n and batch bounds cut dispatch into {cells} cells over all "
                                    f"archs, dtypes and modes; at most {MAX_DISPATCH_CELLS} (every loader indexes "
                                    f"them): serve neighbouring exact n with one window (n: {{min, max}})",
                        at_key=True)


def _n_gap(policy: Policy, arch: str, dtype: str, mode: str, k: int, with_jit: bool) -> tuple[int, int] | None:
    intervals = []
    for rule in policy.rules:
        if (not with_jit and not rule.aot) or arch not in rule.archs or dtype not in rule.dtypes:
            continue
        if mode not in rule.serves or not (rule.k_min <= k <= rule.k_rungs[-1]):
            continue
        built = _built_mode(rule, mode)
        for spec in kernels_of_rule(policy, rule, arch, dtype):
            if spec.k_min <= k <= spec.k and spec.mode == built:
                intervals.append((spec.n_min, spec.n_max))
    covered = k  # first n not yet known to be served
    for lo, hi in sorted(intervals):
        if lo > covered:
            return covered, lo - 1
        covered = max(covered, hi + 1)
        if covered > N_MAX:
            return None
    return (covered, N_MAX) if covered <= N_MAX else None
