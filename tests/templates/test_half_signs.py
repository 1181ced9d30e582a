"""half_signs (templates/topk_common.cuh): the GPU runs an inline `prmt.b32`, which the CPU
emulator cannot run; the emulator runs the C++ fallback beside it. The selector is checked
here against the PTX ISA's generic-form semantics (a byte per selector nibble, its top bit
replicating that byte's sign), over every sign pattern of the two halves, and the kernel's
SASS is shown to hold that PRMT: a selector that copied the wrong byte or no sign fails."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "topk_common.cuh"


def _prmt(a: int, b: int, c: int) -> int:
    """prmt.b32 d, a, b, c with no mode, as the PTX ISA defines it."""
    source = (b << 32) | a
    out = 0
    for n in range(4):
        ctl = (c >> (4 * n)) & 0xF
        byte = (source >> (8 * (ctl & 7))) & 0xFF
        if ctl & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * n)
    return out


def _operands() -> tuple[int, int]:
    body = TEMPLATE.read_text().split("unsigned half_signs(unsigned w)", 1)[1].split("#else", 1)[0]
    (b, c), = re.findall(r'asm\("prmt\.b32 %0, %1, (\w+), (0x[0-9a-fA-F]+);"', body)
    return int(b, 0), int(c, 16)


def test_the_prmt_gives_every_bit_of_each_negative_half():
    b, c = _operands()
    rng = np.random.default_rng(5)
    words = [int(w) for w in rng.integers(0, 2**32, 4096, dtype=np.uint64)]
    words += [0, 0x8000, 0x80000000, 0x80008000, 0x7FFF7FFF, 0xFFFFFFFF, 0x00017F80, 0xFF80FFC0]
    for w in words:
        expect = (0xFFFF if w & 0x8000 else 0) | (0xFFFF0000 if w & 0x80000000 else 0)
        assert _prmt(w, b, c) == expect, hex(w)


def test_the_bfloat16_kernel_issues_that_prmt():
    from topkgen import policy
    from topkgen.build.render import render
    from topkgen.emulator.sass import disassemble, nvrtc_cubin

    _, c = _operands()
    spec = policy.select(policy.load(), "sm_90", "bfloat16", 256, 16384).kernel
    sass = disassemble(nvrtc_cubin(render(spec), spec.name, "sm_90", []))
    selectors = [i.text for i in sass if i.opcode.startswith("PRMT") and f"{c:#x}" in i.text.lower()]
    assert len(selectors) >= 16  # at least a step's 8 pieces of 4 words
