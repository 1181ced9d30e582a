"""Warp instructions a kernel issues: its static SASS weighted by what the emulator counts.

The method, in three steps (sass.py reads the SASS; benchmarks/README.md words it for readers):
1. `instrument(source)` inserts a counting site, `::tk::WarpSite tk_ws_(ID);`, at the start of
   every code block of the source the emulator compiles: function and lambda bodies, loop
   bodies (a loop without braces is given them), braced if/else branches. It adds no line,
   so line numbers stay those of the source NVRTC compiles. A loop under `#pragma unroll`
   (one SASS copy per iteration) gets a site of kind "unrolled", left out of paths (`_fold`);
   under `#pragma unroll N` the SASS says (tests: a runtime trip count is charged per trip);
   a braced branch written on one line gets none (the compiler predicates such code), nor
   does a block in a preprocessor arm only the GPU's compile keeps (`#if
   defined(__CUDA_ARCH__)`): the emulator runs the #else, and the block's lines are charged
   as the enclosing block's (tests: an asm's shuffle in an `if constexpr` arm there).
   On the emulator a site counts a *warp* execution once per distinct instance among the
   warp's lanes (include/topkgen_sim.h, WarpSite): a warp issues a block when any lane runs it.
2. `sass(source, name, arch)` compiles the very same source with NVRTC and `-lineinfo` (the
   only difference from the bundle's compile; tests show the SASS is the same) and
   disassembles it with nvdisasm (the pinned nvidia-cuda-nvdisasm wheel), keeping for every
   instruction its line and the lines it was inlined at.
3. `path_of` turns that chain into the path of sites the emulator saw live there: for each
   inlined level, the blocks of that level's function that hold the line; a loop's header
   line belongs to its body (its compare, increment and branch run once per trip). Each SASS
   instruction is then issued as often as its path executed (`count`). A function NVRTC
   keeps as a call (`__noinline__`) has one copy, whose chains start at its own lines: its
   paths start at its site, charged for every call (tests: called in a loop and a branch).

One branch the compiler adds is followed: ptxas wraps an atomic whose result is used in a
warp aggregation (a vote of the active lanes; where all 32 are, a scan and one lane's atomic
for the warp; otherwise each lane's own atomic), and the scan's instructions are charged the
executions of their path that all 32 lanes of the warp entered (the emulator counts those
per site: `full_warp_sites`), the rest of the block every execution (tests: an append by 31
and by 32 lanes). The kernels keep such an atomic first in a braced block of its own, so that
the block's lanes are the atomic's; elsewhere the scan is charged as its block, an upper bound.

What it cannot see: stalls, replays (bank conflicts, uncoalesced accesses), dual issue and
scheduling; code the compiler moved across blocks (hoisted out of a loop it is still charged
per trip), predicated code (charged as its block: a branch no lane takes costs nothing
here, though a predicated one still issues). A loop with no backward branch in SASS is
taken as fully unrolled, each SASS copy of its body charged once per execution of its
enclosing block (tests: SHFL exactly the emulator's warp shuffles); a loop with no
condition (`for (;;)`) never is: NVRTC may name another line for its backward branch
(tests: the radix stream's rounds). A loop the compiler
unrolled partially (U copies in its back-edge ranges, R remainder copies outside them,
told apart by their memory, barrier and collective instructions) is charged one copy per
trip, and its guards and dispatch once per entry whether taken or not: few trips per entry
are overcounted (tests: +32% at 1 trip, within 5% from 8). A loop inside a fully unrolled
one has a copy per trip of that one (tests: a bit walk per piece, charged every trip). Two
copies of one function called from one line (`c ? f<true>() : f<false>()`) share a path,
and both are charged for each call: a kernel keeps such copies in arms of their own (tests:
charged for the arm taken); a lambda written inside a call takes the call's charge (tests: the
templates have none). Counts are exact integers, per-key figures divided, printed to 2 decimals.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Mapping
from topkgen.emulator.sass import (Instruction, _issued, basic_blocks, disassemble, full_warp_only, label_addresses,
                                  nvrtc_cubin)
from topkgen.emulator.source_tokens import device_only_tokens, tokens

MARK = "::tk::WarpSite tk_ws_({id});"
# Instructions the compiler never merges between two copies of a loop body: one per copy.
_NEVER_MERGED = re.compile(r"^(LDS|STS|LDG|STG|LD|ST|ATOMS|ATOMG|ATOM|RED|BAR|SHFL|MATCH|VOTE|REDUX|LDSM)(\.|$)")


@dataclass(frozen=True)
class Site:
    id: int
    kind: str                 # function, loop, branch
    first_line: int           # lines the block holds (a loop: from its keyword)
    last_line: int
    function: int             # the id of the innermost function block holding it (itself for one)


@dataclass
class Instrumented:
    source: str
    sites: list[Site]
    by_id: dict[int, Site] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.by_id = {s.id: s for s in self.sites}


_CONTROL = {"if", "for", "while", "switch"}
_LOOPS = {"for", "while"}


def instrument(source: str) -> Instrumented:
    """The source with a counting site at the start of every code block (see the module's
    docstring), and the sites' line ranges. Line numbers are unchanged.

    Kept whole: one pass over the tokens, whose helpers share the bracket matches, the
    pending `#pragma unroll` and the stack of open functions."""
    toks = tokens(source)
    # matching parentheses and braces
    match: dict[int, int] = {}
    stack: list[int] = []
    for i, (kind, text, _, _) in enumerate(toks):
        if kind != "punct":
            continue
        if text in "({":
            stack.append(i)
        elif text in ")}":
            if stack:
                j = stack.pop()
                match[i], match[j] = j, i
    inserts: list[tuple[int, str]] = []  # (offset, text)
    opens = sorted(j for j in match if toks[j][1] in "({" and match[j] > j)
    sites: list[Site] = []
    pending_unroll = False
    unrolled: dict[int, bool] = {}  # loop keyword token: under `#pragma unroll` (fully unrolled)
    functions: list[tuple[int, int]] = []  # (closing token index, site id) of open functions

    def prev(i: int) -> int:
        j = i - 1
        while j >= 0 and toks[j][0] == "pre":
            j -= 1
        return j

    def statement_end(i: int) -> int:
        """The last token of the statement starting at token i."""
        j = i
        while j < len(toks):
            kind, text = toks[j][0], toks[j][1]
            if kind == "punct" and text in "({" and j in match:
                if text == "{" and toks[prev(j)][1] not in ("=", ",", "(", "return") and toks[prev(j)][0] != "ident":
                    return match[j]
                j = match[j] + 1
                continue
            if kind == "punct" and text == ";":
                return j
            j += 1
        return len(toks) - 1

    def line_of_end(i: int) -> int:
        """The last line a block holds: its closing brace's, unless more code follows it there."""
        close_line = toks[i][3]
        nxt = i + 1
        if nxt < len(toks) and toks[nxt][3] == close_line and toks[nxt][1] not in (";", ")", ","):
            return close_line - 1
        return close_line

    def stack_of(i: int) -> list[int]:
        """The open brackets around token i, outermost first."""
        return [j for j in opens if j < i < match[j]]

    def innermost_function(i: int) -> int:
        while functions and functions[-1][0] < i:
            functions.pop()
        return functions[-1][1] if functions else -1

    device_only = device_only_tokens(toks)
    next_id = 1
    for i, (kind, text, offset, line) in enumerate(toks):
        if kind == "pre":
            m = re.match(r"\s*#\s*pragma\s+unroll\b\s*(\d+)?", text)
            if m:
                # `#pragma unroll N`: the SASS says whether a back-edge is left (SiteMap)
                pending_unroll = m.group(1) is None
            continue
        if device_only[i]:
            if kind == "ident" and text in _LOOPS:
                pending_unroll = False  # the pragma was this loop's
            continue
        if kind == "ident" and text in _LOOPS:
            unrolled[i] = pending_unroll
            pending_unroll = False
            # a loop whose body has no braces: give it braces and a site
            j = i + 1
            if text == "while" and toks[prev(i)][1] == "}":
                continue  # do ... while
            if j < len(toks) and toks[j][1] == "(" and j in match:
                body = match[j] + 1
                if body < len(toks) and toks[body][1] != "{":
                    end = statement_end(body)
                    fn = innermost_function(i)
                    site = Site(next_id, "unrolled" if unrolled[i] else "loop", line, toks[end][3], fn)
                    sites.append(site)
                    inserts.append((toks[body][2], "{ " + MARK.format(id=next_id) + " "))
                    inserts.append((toks[end][2] + len(toks[end][1]), " }"))
                    next_id += 1
            continue
        if kind == "ident" and text == "if" and i + 1 < len(toks) and toks[i + 1][1] == "(" and i + 1 in match:
            # `if (...) return/break/continue ...;`: what follows runs only for the lanes that
            # stay, so it is a block of its own until the end of the enclosing one
            body = match[i + 1] + 1
            if body < len(toks) and toks[body][1] in ("return", "break", "continue"):
                end = statement_end(body)
                enclosing = [j for j in stack_of(i) if toks[j][1] == "{"]
                if enclosing and end + 1 < len(toks):
                    close = match[enclosing[-1]]
                    rest_first = toks[end][3] + 1
                    if toks[end + 1][3] == toks[end][3]:
                        rest_first = toks[end][3]
                    sites.append(Site(next_id, "rest", rest_first, line_of_end(close), innermost_function(i)))
                    inserts.append((toks[end][2] + 1, f" ::tk::WarpSite tk_ws_{next_id}({next_id});"))
                    next_id += 1
        if not (kind == "punct" and text == "{") or i not in match:
            continue
        p = prev(i)
        ptext = toks[p][1] if p >= 0 else ""
        if ptext in ("const", "mutable", "noexcept") and p >= 0:
            q = prev(p)
            ptext, p = toks[q][1], q
        block_kind = None
        keyword_line = line
        if ptext == ")" and p in match:
            opener = match[p]
            before = prev(opener)
            word = toks[before][1] if before >= 0 else ""
            if word == "constexpr":
                word = toks[prev(before)][1]
            if word in _LOOPS:
                block_kind, keyword_line = ("unrolled" if unrolled.get(before) else "loop"), toks[before][3]
            elif word in _CONTROL:
                block_kind = "branch"
            else:
                block_kind = "function"
        elif ptext in ("else", "do", "]"):  # "]": a lambda with no parameter list, `[&] { ... }`
            block_kind = {"do": "loop", "else": "branch"}.get(ptext, "function")
        if block_kind is None:
            continue
        close = match[i]
        last = line_of_end(close)
        if block_kind == "branch":
            if toks[close][3] == line:
                continue  # a one-line branch: the compiler predicates it; charged as its enclosing block
            first = line + 1
        elif block_kind in ("loop", "unrolled"):
            first = keyword_line
        else:
            first = line
        fn = next_id if block_kind == "function" else innermost_function(i)
        sites.append(Site(next_id, block_kind, first, last, fn))
        if block_kind == "function":
            functions.append((close, next_id))
        inserts.append((offset + 1, " " + MARK.format(id=next_id)))
        next_id += 1
    out, last_at = [], 0
    for at, text in sorted(inserts, key=lambda t: t[0]):
        out.append(source[last_at:at])
        out.append(text)
        last_at = at
    out.append(source[last_at:])
    return Instrumented("".join(out), sites)


# ----------------------------------------------------------------------------- mapping


_ENDLESS = re.compile(r"\b(?:for\s*\(\s*;\s*;\s*\)|while\s*\(\s*(?:true|1)\s*\))")


class SiteMap:
    """SASS instructions to site paths, for one instrumented source compiled as `name`.cu.

    A loop's sites hold an instruction only when its address lies inside one of the loop's
    SASS ranges (from the target of a backward branch the loop's lines own to that branch):
    the compiler attributes loop set-up (the first compare, hoisted invariants) to the loop's
    lines, and those run once per entry, as the enclosing block. A loop with no backward
    branch is unrolled (as is one under `#pragma unroll`): it is left out of paths, each
    copy of its body is charged as the enclosing block, and the blocks inside it are spread
    over its copies (_fold)."""

    def __init__(self, inst: Instrumented, name: str, instructions: list["Instruction"],
                 labels: Mapping[str, int]) -> None:
        self.inst, self.name = inst, name
        self.ranges: dict[int, list[tuple[int, int]]] = {}
        for ins in (issued := _issued(instructions)):  # past an EXIT or RET, a slow path branches back: no loop
            if ins.opcode != "BRA":
                continue
            m = re.search(r"(\.L_x_\d+)", ins.text)
            target = labels.get(m.group(1)) if m else None
            if target is None or target > ins.address:
                continue
            loops = [sid for sid in self._raw(ins.chain[0][0], ins.chain[0][1]) if self.inst.by_id[sid].kind != "function"
                     and self.inst.by_id[sid].kind in ("loop", "unrolled")] if ins.chain and self._own(ins.chain[0][0]) else []
            if loops:
                self.ranges.setdefault(loops[-1], []).append((target, ins.address))
        # A loop with no condition cannot be unrolled in full, whichever line its back-edge's
        # line information names (NVRTC has named a line of an unrolled loop inside it): every
        # instruction of its lines is its body's.
        source_lines = inst.source.splitlines()
        self.dropped = {s.id for s in inst.sites
                        if s.kind == "unrolled" or (s.kind == "loop" and s.id not in self.ranges
                                                    and not _ENDLESS.search(source_lines[s.first_line - 1]))}
        self.block = basic_blocks(instructions, labels)
        # The sites of functions NVRTC kept as calls, by their entry's line (_fold keys their
        # paths from there). Deeper in a large one (the split's merge) a chain may skip levels:
        # such instructions match no path and are charged nothing.
        entry = {(i.function, i.callee): i.chain[-1] for i in reversed(instructions) if i.callee and i.chain}
        self.called = {raw[0] for file, line in entry.values() if self._own(file) and (raw := self._raw(file, line))}
        self.copy_blocks: dict[int, set[int]] = {}
        self.copies = self._copies(issued)
        self.full_warp = full_warp_only(issued, labels)

    def _own(self, file: str) -> bool:
        return Path(file).name == f"{self.name}.cu"

    @lru_cache(maxsize=None)
    def _raw(self, file: str, line: int) -> tuple[int, ...]:
        """The sites of the innermost function holding the line that hold it, outermost first."""
        holding = [s for s in self.inst.sites if s.first_line <= line <= s.last_line]
        functions = [s for s in holding if s.kind == "function"]
        if not functions:
            return ()
        fn = min(functions, key=lambda s: s.last_line - s.first_line)
        inner = [s for s in holding if s.function == fn.id]
        inner.sort(key=lambda s: (s.first_line, -s.last_line, s.id))
        return tuple(s.id for s in inner)

    def _walk(self, ins: "Instruction", dropped: bool = False):
        """(site, inside its SASS ranges) along the instruction's chain, outermost first;
        loops with ranges say whether the address lies in one; dropped sites are skipped
        (with `dropped`, given as (site, None))."""
        for file, line in reversed(ins.chain):
            if not self._own(file):
                continue
            for sid in self._raw(file, line):
                if sid in self.dropped:
                    if dropped:
                        yield sid, None
                    continue
                ranges = self.ranges.get(sid)
                yield sid, ranges is None or any(lo <= ins.address <= hi for lo, hi in ranges)

    def _copies(self, issued: list["Instruction"]) -> dict[int, tuple[int, int]]:
        """(U, R) of every loop the compiler unrolled partially: U copies of the body inside
        its back-edge ranges, R remainder copies outside them (trips left over, run before or
        after). Copies are told by the instructions never merged between them (memory,
        barrier, warp-collective): for each such (inline chain, opcode) whose innermost loop
        it is (not inside a fully unrolled one), the count inside the ranges and outside; U
        and R are the least counts (1 and 0 without any), over the opcodes whose keys agree
        in count where some do (line information may differ between copies of one
        instruction). LLVM's scheme for a runtime trip count (a remainder of up to 3 trips,
        copies of 16, then 8 and 4) gives U + R = 31 copies, any of which a trip may run. A
        loop inside a fully unrolled one has a copy, with back-edges, per copy of that one,
        over which _fold spreads its executions: a key's counts are divided by the number of
        the loop's back-edge ranges that hold it (the radix stream's appends, a walk a piece,
        were charged an eighth of their trips)."""
        inside: dict[int, dict[tuple, int]] = {}
        outside: dict[int, dict[tuple, int]] = {}
        enclosed: dict[tuple, set[int]] = {}  # (loop, key) inside a fully unrolled loop: the ranges hit
        for ins in issued:
            if not _NEVER_MERGED.match(ins.opcode):
                continue
            walk = list(self._walk(ins, dropped=True))
            loops = [(at, sid, hit) for at, (sid, hit) in enumerate(walk) if sid in self.ranges]
            if not loops:
                continue
            at, sid, hit = loops[-1]
            if any(h is None for _, h in walk[at:]):
                continue  # in a fully unrolled loop inside: one per copy of that loop, not of this one
            key = (ins.chain, ins.opcode)
            if any(h is None for _, h in walk[:at]):
                enclosed.setdefault((sid, key), set()).update(
                    i for i, (lo, hi) in enumerate(self.ranges[sid]) if lo <= ins.address <= hi)
            side = inside if hit else outside
            side.setdefault(sid, {})
            side[sid][key] = side[sid].get(key, 0) + 1
            if not hit:
                self.copy_blocks.setdefault(sid, set()).add(self.block[ins.address, ins.function])
        out = {}
        for sid, counts in inside.items():
            spread = {key: max(len(enclosed.get((sid, key), ())), 1) for key in counts}
            per_copy = {key: n // spread[key] for key, n in counts.items()}
            # opcodes whose keys agree (the large-k output loop's NaN payload load: 9 + 1 of 10 do not)
            agree = {op for _, op in counts if len({n for (_, o), n in per_copy.items() if o == op}) == 1}
            kept = [key for key in counts if key[1] in agree] or list(counts)
            u = min(per_copy[key] for key in kept)
            rest = outside.get(sid, {})
            r = min(rest.get(key, 0) // spread[key] for key in kept)
            if u > 1 or r > 0:
                out[sid] = (u, r)
        return out

    def weighted_path(self, ins: "Instruction") -> tuple[tuple[int, ...], float]:
        """The path of sites the instruction runs under and the share of the path's
        executions it issues. In a loop unrolled U times with R remainder copies, each trip
        runs one copy of the body, wherever it lies: an instruction of a copy (inside the
        back-edge ranges, or in a basic block outside them that holds a remainder copy's
        memory instruction) issues 1/(U+R) of the trips (1/U without remainder). Any other
        instruction of a loop's lines outside its SASS body is set-up, a guard or the
        dispatch between copies: once per entry (the path stops there)."""
        path: list[int] = []
        share = 1.0
        for sid, hit in self._walk(ins):
            u, r = self.copies.get(sid, (1, 0))
            if not hit and (r == 0 or self.block[ins.address, ins.function] not in self.copy_blocks.get(sid, ())):
                return tuple(path), share  # outside the loop's body in SASS: once per entry
            share /= u + r
            path.append(sid)
        return tuple(path), share

    def path_of(self, ins: "Instruction") -> tuple[int, ...]:
        return self.weighted_path(ins)[0]

    def count(self, instructions: list["Instruction"], warp_sites: Mapping[tuple[int, ...], float],
              full_warp_sites: Mapping[tuple[int, ...], float] | None = None) -> "Census":
        """Each instruction issued as often as its path executed; one that only a full warp runs
        (full_warp) as often as its path executed with all 32 lanes, where full_warp_sites is
        given (without it, as its path: an upper bound)."""
        issued = _issued(instructions)
        total = 0.0
        by_site: dict[int, float] = {}
        by_instruction: dict[Instruction, float] = {}
        unmatched = 0
        for ins in issued:
            path, share = self.weighted_path(ins)
            full = full_warp_sites is not None and (ins.function, ins.address) in self.full_warp
            n = (full_warp_sites if full else warp_sites).get(path, 0.0) * share
            if path and path not in warp_sites:
                unmatched += 1
            total += n
            by_instruction[ins] = n
            if path:
                by_site[path[-1]] = by_site.get(path[-1], 0.0) + n
        return Census(total, len(issued), unmatched, by_site, by_instruction)


@dataclass(frozen=True)
class Census:
    warp_instructions: float   # issued, summed over the launch's warps
    static_instructions: int   # SASS instructions that can issue
    never_run: int             # of those, on a path the emulator never entered
    by_site: Mapping[int, float]  # warp instructions charged to each innermost site
    by_instruction: Mapping[Instruction, float] = field(default_factory=dict)  # and to each SASS instruction


class Counter:
    """One kernel source, ready to count: the instrumented text for the emulator and the
    SASS of the source as NVRTC compiles it (with -lineinfo) for `arch`."""

    def __init__(self, source: str, name: str, arch: str = "sm_90") -> None:
        self.source, self.name, self.arch = source, name, arch
        self.inst = instrument(source)
        cubin = nvrtc_cubin(source, name, arch, ["-lineinfo"])
        self.instructions = disassemble(cubin)
        self.map = SiteMap(self.inst, name, self.instructions, label_addresses(cubin))

    def module(self):
        from topkgen.emulator import compile_source

        return compile_source(self.inst.source, name=self.name)

    def count(self, counters, kernel: str | None = None, opcode: str | None = None) -> Census:
        """The census of one counted launch of `module()` (Counters with warp_sites): the
        SASS of `kernel` (its symbol; default: every function of the cubin), only the
        instructions whose opcode starts with `opcode` when it is given (e.g. "SHFL")."""
        own = [i for i in self.instructions if kernel is None or i.function == kernel]
        if not own:
            raise ValueError(f"{self.name}: no function {kernel!r} in the SASS")
        if opcode is not None:  # of what can issue (the padding after EXIT holds a BRA)
            own = [i for i in _issued(own) if i.opcode.startswith(opcode)]
        fold = lambda sites: _fold(counters, sites, self.inst, self.map.dropped, self.map.called)  # noqa: E731
        return self.map.count(own, fold(counters.warp_sites), fold(counters.full_warp_sites))


def _fold(counters, sites: Mapping[tuple[int, ...], int], inst: Instrumented, dropped: set[int],
          called: set[int]) -> dict[tuple[int, ...], float]:
    """Warp executions by path, spread over the SASS copies of a block. The compiler copies a
    block once per call of its function from one block (four calls on one line are four
    inlined copies no line information tells apart) and once per iteration of an unrolled
    loop; each copy runs the mean share. So a path is charged its executions divided, for
    each function site and each unrolled loop on it, by a lane's mean entries of that site
    under one instance of its parent; unrolled loops are then taken out of the path.

    A path that ends at an unrolled loop is left out: its SASS copies are charged through the
    path without it, the enclosing block's, which has executions of its own (a loop's site
    is entered under its enclosing block's, a function body at the least), and each copy runs
    once per execution of that block. Folding it in as well charged the whole enclosing block
    twice per such loop. Deeper paths are folded: (A, B, C) with B unrolled is charged to
    (A, C), divided by B's trips (C has one copy per iteration).

    A function NVRTC kept as a call (`called`) has one copy, whatever calls it: a path through
    it is charged from its site on, undivided there, summed over the callers."""
    out: dict[tuple[int, ...], float] = {}
    entries = counters.site_entries
    for path, n in sites.items():
        if path and path[-1] in dropped:
            continue
        weight = float(n)
        kept = []
        start = max((i for i, site in enumerate(path) if site in called), default=0)
        for i, site in enumerate(path[start:], start):
            kind = inst.by_id[site].kind if site in inst.by_id else "function"
            if (site in dropped or kind == "function") and site not in called:
                copies = entries.get(path[:i + 1], 1.0)
                weight /= copies if copies > 0 else 1.0
            if site not in dropped:
                kept.append(site)
        key = tuple(kept)
        out[key] = out.get(key, 0.0) + weight
    return out
