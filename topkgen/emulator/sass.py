"""The SASS of a kernel, as the warp-instruction counter (instructions.py) reads it: the very
source compiled by NVRTC (with -lineinfo for the count only) and disassembled by nvdisasm
from the pinned nvidia-cuda-nvdisasm wheel, each instruction with its line and inlining chain."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence


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
