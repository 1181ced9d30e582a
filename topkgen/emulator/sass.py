"""The SASS of a kernel, as the warp-instruction counter (instructions.py) reads it: the very
source compiled by NVRTC (with -lineinfo for the count only) and disassembled by nvdisasm
from the pinned nvidia-cuda-nvdisasm wheel, each instruction with its line and inlining chain;
its basic blocks, and the instructions of ptxas's warp aggregations that only a full warp runs."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence


# ----------------------------------------------------------------------------- SASS


@dataclass(frozen=True)
class Instruction:
    address: int
    text: str                        # opcode and operands
    chain: tuple[tuple[str, int], ...]  # (file, line): innermost first, then each inlined-at
    function: str = ""               # the kernel (or device function) it belongs to
    callee: str = ""                 # the function NVRTC kept as a call (`__noinline__`) it lies in, if any

    @property
    def opcode(self) -> str:
        t = re.sub(r"^@!?U?P\w+\s+", "", self.text)
        return t.split()[0] if t else ""


def nvdisasm() -> Path:
    """The nvdisasm of the pinned nvidia-cuda-nvdisasm wheel."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for candidate in sorted(Path(root).glob("*/bin/nvdisasm")):
            return candidate
    raise FileNotFoundError("nvdisasm not found: install the nvidia-cuda-nvdisasm wheel (pip install -e '.[test]')")


def nvrtc_cubin(source: str, name: str, arch: str, extra: Sequence[str] = (), ptx: bool = False) -> bytes:
    """NVRTC's cubin (or PTX) of `source` with topkgen's options plus `extra`."""
    from cuda.bindings import nvrtc

    from topkgen.build.compile import CompileError, options

    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], [])
    try:
        base = options(arch.replace("compute_", "sm_"))
        if arch.startswith("compute_"):  # PTX for a virtual architecture
            base = [f"--gpu-architecture={arch}" if o.startswith("--gpu-architecture=") else o for o in base
                    if not o.startswith("--ptxas-options")]
        opts = [o.encode() for o in [*base, *extra]]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            err, size = nvrtc.nvrtcGetProgramLogSize(prog)
            buf = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, buf)
            raise CompileError(f"{name}: {buf.decode(errors='replace')}")
        if ptx:
            err, size = nvrtc.nvrtcGetPTXSize(prog)
            buf = b" " * size
            nvrtc.nvrtcGetPTX(prog, buf)
            return buf.rstrip(b"\0")
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        buf = b" " * size
        nvrtc.nvrtcGetCUBIN(prog, buf)
        return buf
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


_LINE = re.compile(r'//## File "([^"]*)", line (\d+)(?: inlined at "([^"]*)", line (\d+))?')
_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_CALLEE = re.compile(r"^\$[^$\s]+\$(\S+):\s*$")  # `$kernel$function:`, where a called function's code starts


def disassemble(cubin: bytes, lineinfo: bool = True) -> list[Instruction]:
    """The cubin's instructions (every function's), with their inline chains."""
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(nvdisasm()), "-c", *(["-gi"] if lineinfo else []), f.name], check=True,
                              capture_output=True, text=True).stdout
    out: list[Instruction] = []
    chain: list[tuple[str, int]] = []
    fresh = True
    function = callee = ""
    for raw in text.splitlines():
        m = re.match(r"^\.text\.(\S+):", raw)
        if m:
            function, callee, chain = m.group(1), "", []
            continue
        m = _CALLEE.match(raw)
        if m:
            callee, chain = m.group(1), []
            continue
        m = _LINE.search(raw)
        if m:
            if fresh:
                chain, fresh = [], False
            if not chain:
                chain.append((m.group(1), int(m.group(2))))
            if m.group(3):
                chain.append((m.group(3), int(m.group(4))))
            continue
        m = _INSTR.match(raw)
        if m:
            fresh = True
            out.append(Instruction(int(m.group(1), 16), m.group(2), tuple(chain), function, callee))
    return out


def sass_text(cubin: bytes) -> list[str]:
    """The instructions alone (no line information, no addresses of labels): for comparing cubins."""
    return [i.text for i in disassemble(cubin, lineinfo=False)]


def _issued(instructions: list[Instruction]) -> list[Instruction]:
    """What a warp can issue: a kernel's code up to its last EXIT, a called function's up to
    its last RET. Past them lie the padding (a self-branch, NOPs) and the slow paths of
    divergent shuffles, which a converged warp never takes."""
    out: list[Instruction] = []
    for part in dict.fromkeys((i.function, i.callee) for i in instructions):
        own = [i for i in instructions if (i.function, i.callee) == part]
        end = "RET" if part[1] else "EXIT"
        last = max((k for k, i in enumerate(own) if i.opcode.split(".")[0] == end), default=len(own) - 1)
        out.extend(own[:last + 1])
    return out


def label_addresses(cubin: bytes) -> dict[str, int]:
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(nvdisasm()), "-c", f.name], check=True, capture_output=True, text=True).stdout
    labels, pending = {}, []
    for raw in text.splitlines():
        m = re.match(r"^(\.L_x_\d+):", raw)
        if m:
            pending.append(m.group(1))
            continue
        m = _INSTR.match(raw)
        if m:
            for name in pending:
                labels[name] = int(m.group(1), 16)
            pending = []
    return labels


_VOTE_ACTIVE = re.compile(r"^VOTE\.ANY (R\d+), PT, PT$")
_BRANCH = re.compile(r"^@!(P\d) BRA `\((\.L_x_\d+)\)$")
# What ptxas's scan of a warp-aggregated atomic holds: shuffles and the adds they predicate,
# the lane's index, its test, one atomic, moves.
_SCAN_OPS = re.compile(r"^(SHFL|IMAD|IADD3|S2R|ISETP|ATOMS|ATOM|MOV|LOP3)(\.|$)")


def full_warp_only(issued: list[Instruction], labels: Mapping[str, int]) -> set[tuple[str, int]]:
    """(function, address) of the instructions only a full warp runs: ptxas's warp aggregation
    of an atomic whose result is used (atomicAdd's, and PTX atom's alike) reads the active
    lanes (VOTE.ANY R, PT, PT), tests them against all 32 (ISETP.EQ.U32 P, R, -0x1) and, unless
    every lane is active, does the lane's own atomic and branches past a scan of the lanes'
    operands and the one atomic that replaces theirs. The instructions between that branch
    and its target are the scan's: charged per full-warp execution of their path, where the
    rest of their block is charged per execution (a warp with some lanes appending runs the
    4 of the test, not the 17 of the scan)."""
    out: set[tuple[str, int]] = set()
    for i, ins in enumerate(issued):
        vote = _VOTE_ACTIVE.match(ins.text)
        if not vote:
            continue
        window = issued[i + 1:i + 12]
        tested = next((m.group(1) for t in window
                       if (m := re.match(rf"^ISETP\.EQ\.U32\.AND (P\d), PT, {vote.group(1)}, -0x1, PT$", t.text))), None)
        branch = next(((k, m) for k, t in enumerate(window) if (m := _BRANCH.match(t.text))), None)
        if tested is None or branch is None or branch[1].group(1) != tested:
            continue
        start, target = i + 1 + branch[0], labels.get(branch[1].group(2))
        # the scan: from the branch on to its target, in the same function
        end = next((j for j in range(start + 2, min(start + 40, len(issued)))
                    if issued[j].function == ins.function and issued[j].address == target), None)
        scan = issued[start + 1:end] if end is not None else []
        if not scan or not all(t.function == ins.function and _SCAN_OPS.match(t.opcode) for t in scan):
            continue  # not the pattern: leave it charged as its block
        out.update((t.function, t.address) for t in scan)
    return out


def basic_blocks(instructions: list[Instruction], labels: Mapping[str, int]) -> dict[tuple[int, str], int]:
    """(address, function) -> the index of its basic block: a block starts at a branch
    target and after a branch or EXIT. Targets are per function: addresses restart at 0 in
    each, so another kernel's target at the same address cut this one's blocks (a module
    with a kernel added counted partial_unroll 7% higher)."""
    targets = {(ins.function, labels[m.group(1)]) for ins in instructions
               if (m := re.search(r"(\.L_x_\d+)", ins.text)) and m.group(1) in labels}
    out, block, function = {}, 0, None
    starts_next = True
    for ins in instructions:
        if ins.function != function or (ins.function, ins.address) in targets or starts_next:
            block += 1
            function = ins.function
        out[ins.address, ins.function] = block
        starts_next = ins.opcode in ("BRA", "EXIT", "BRX", "JMP", "RET", "CALL")
    return out
