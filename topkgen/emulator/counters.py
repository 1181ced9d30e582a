"""Traffic counters of one emulator launch: what a kernel moved through global memory and
how its shared atomics, barriers and warp collectives would load a GPU.

The counts are exact for what they count: global loads and stores that go through the
kernels' memory helpers (templates/topk_memory.cuh; a raw pointer access is not counted),
every atomic, every completed `__syncthreads` and warp collective. Bank figures need a
notion of "one warp instruction", which threads run as fibers do not have; the emulator
groups the lanes of a warp by call site, by the number of synchronisation points (barriers
and warp collectives) each lane has passed, and by how often the lane reached the site
since then. That is the hardware's grouping for converged code; where lanes skip a site in
some loop iterations, their k-th arrivals are grouped as if packed into one instruction.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field, fields
from typing import Mapping


# tk::AtomicKind, in its order: "inc" is a warp instruction on which every lane added 1 and
# dropped the result (ATOMS.POPC.INC on sm_70+: same-address lanes merge), "add" any other
# atomicAdd (a result used, another operand), "min/max", "other" (sub, and/or/xor, exch, cas).
ATOMIC_KINDS = ("inc", "add", "min/max", "other")
_COUNTS = ("global_load_bytes", "global_store_bytes", "global_atomics", "shared_atomics",
           "shared_atomic_instructions", "bank_lanes_sum", "bank_lanes_max", "barriers", "shuffles", "votes")


class PhaseStats(ctypes.Structure):
    """Mirror of tk::PhaseStats in include/topkgen_sim.h."""

    _fields_ = ([("label", ctypes.c_char_p)] + [(name, ctypes.c_uint64) for name in _COUNTS]
                + [(name, ctypes.c_uint64 * len(ATOMIC_KINDS))
                   for name in ("kind_instructions", "kind_lanes_sum", "kind_lanes_max")])


@dataclass(frozen=True)
class BankLanes:
    """Shared atomic warp instructions of one kind and their bank lanes (mean and worst)."""

    instructions: int = 0
    lanes_mean: float = 0.0
    lanes_max: int = 0


@dataclass(frozen=True)
class Counters:
    """Counts of one launch, summed over its CTAs.

    shared_atomics counts lanes (one per thread that executed an atomic on shared memory);
    shared_atomic_instructions counts warp instructions. bank_lanes_max / bank_lanes_mean:
    the most lanes of one warp instruction that hit one 4-byte bank, the worst instruction and
    the mean over instructions. Lanes on the same address count one each (a GPU serialises
    them), except on an "inc" instruction (every lane added 1 and dropped the result: sm_70+
    compile that to ATOMS.POPC.INC, whose same-address lanes the shared-memory unit merges),
    where a bank's lanes are its distinct words. The kind is decided at run time, per warp
    instruction (a +1 the compiler cannot see as constant is counted "inc" here).
    bank_lanes_by_kind: the same per kind (ATOMIC_KINDS), the kinds that ran. barriers: completed `__syncthreads`, per CTA, summed. shuffles and votes:
    warp instructions (ballot, any, all, match count as votes). phases: the same counts per
    label a kernel set with `topk::counter_phase` (unlabelled work is under "").
    warp_sites: warp executions of each counting site, by its path (the ids of the sites
    live when it was entered, outermost first); only a source instrumented by
    emulator/instructions.py has sites, and only the launch's totals carry them.
    site_entries: a lane's mean entries of each path under one instance of its parent (the
    calls of a function from one block; a loop's trips). full_warp_sites: of warp_sites, the
    executions all 32 lanes of the warp entered (ptxas's warp-aggregated atomics run their
    scan only then)."""

    global_load_bytes: int = 0
    global_store_bytes: int = 0
    global_atomics: int = 0
    shared_atomics: int = 0
    shared_atomic_instructions: int = 0
    bank_lanes_max: int = 0
    bank_lanes_mean: float = 0.0
    barriers: int = 0
    shuffles: int = 0
    votes: int = 0
    bank_lanes_by_kind: Mapping[str, BankLanes] = field(default_factory=dict)
    phases: Mapping[str, "Counters"] = field(default_factory=dict)
    warp_sites: Mapping[tuple[int, ...], int] = field(default_factory=dict)
    site_entries: Mapping[tuple[int, ...], float] = field(default_factory=dict)  # mean entries per parent instance
    full_warp_sites: Mapping[tuple[int, ...], int] = field(default_factory=dict)


def _one(stats: list[PhaseStats]) -> Counters:
    total = {name: sum(getattr(s, name) for s in stats) for name in _COUNTS}
    instructions = total["shared_atomic_instructions"]
    kinds = {}
    for i, kind in enumerate(ATOMIC_KINDS):
        count = sum(s.kind_instructions[i] for s in stats)
        if count:
            kinds[kind] = BankLanes(count, sum(s.kind_lanes_sum[i] for s in stats) / count,
                                    max(s.kind_lanes_max[i] for s in stats))
    return Counters(bank_lanes_by_kind=kinds,
        global_load_bytes=total["global_load_bytes"], global_store_bytes=total["global_store_bytes"],
        global_atomics=total["global_atomics"], shared_atomics=total["shared_atomics"],
        shared_atomic_instructions=instructions,
        bank_lanes_max=max((s.bank_lanes_max for s in stats), default=0),
        bank_lanes_mean=total["bank_lanes_sum"] / instructions if instructions else 0.0,
        barriers=total["barriers"], shuffles=total["shuffles"], votes=total["votes"])


def from_phases(stats: list[PhaseStats]) -> Counters:
    """The launch's counts: totals over every phase, and each phase that counted anything."""
    phases = {}
    for s in stats:
        one = _one([s])
        if one != Counters():
            phases[s.label.decode()] = one
    total = _one(stats)
    return Counters(**{f.name: getattr(total, f.name) for f in fields(total) if f.name not in ("phases", "warp_sites")},
                    phases=phases)


def site_paths(rows: list[tuple[int, ...]]) -> tuple[dict[tuple[int, ...], int], dict[tuple[int, ...], float],
                                                     dict[tuple[int, ...], int]]:
    """Warp executions by site path, lanes' mean entries per parent instance, and executions
    by a full warp, from the emulator's (path, parent path, id, count, lane entries, lane
    first entries, full-warp count) rows."""
    by_path = {row[0]: (row[1], row[2]) for row in rows}

    def ids(path: int) -> tuple[int, ...]:
        out = []
        while path:
            parent, site = by_path[path]
            out.append(site)
            path = parent
        return tuple(reversed(out))

    return ({ids(r[0]): r[3] for r in rows}, {ids(r[0]): r[4] / r[5] if r[5] else 0.0 for r in rows},
            {ids(r[0]): r[6] for r in rows if r[6]})
