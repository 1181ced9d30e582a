"""The tokens of a kernel's source, as the instruction counter's instrumenter reads them, and
which of them lie where only the GPU's compile reaches (the emulator compiles the rest)."""

from __future__ import annotations

import re

_TOKEN = re.compile(r"""
    (?P<comment>//[^\n]*|/\*.*?\*/)
  | (?P<string>"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')
  | (?P<pre>^[ \t]*\#[^\n]*(?:\\\n[^\n]*)*)
  | (?P<ident>[A-Za-z_]\w*)
  | (?P<number>\d[\w.]*)
  | (?P<punct>->|::|[{}()\[\];,<>=&|!~^%*/+\-.?:])
  | (?P<space>\s+)
""", re.VERBOSE | re.DOTALL | re.MULTILINE)


def tokens(source: str) -> list[tuple[str, str, int, int]]:
    """(kind, text, offset, line) of every significant token; preprocessor lines kept as 'pre'."""
    out, line = [], 1
    for m in _TOKEN.finditer(source):
        kind = m.lastgroup
        if kind not in ("space", "comment", "string"):
            out.append((kind, m.group(), m.start(), line))
        elif kind == "string":
            out.append(("string", m.group(), m.start(), line))
        line += m.group().count("\n")
    return out


# `#if` conditions whose arm only the GPU compiles: defined(__CUDA_ARCH__), alone or ANDed.
_DEVICE_IF = re.compile(r"defined\s*\(\s*__CUDA_ARCH__\s*\)(?:\s*&&[^|]*)?")
_HOST_IF = re.compile(r"!\s*defined\s*\(\s*__CUDA_ARCH__\s*\)")


def device_only_tokens(toks: list[tuple[str, str, int, int]]) -> list[bool]:
    """Per token: whether it lies in a preprocessor arm that only the GPU's compile keeps
    (`#if defined(__CUDA_ARCH__)`, `#ifdef __CUDA_ARCH__`, the `#else` of their negations). The
    emulator never runs a block there, so a site in it would count nothing, and the SASS of its
    lines would be charged nothing (an asm in an `if constexpr` arm under such an `#if` counted
    0.622 warp instructions per key for 0.684). Such blocks get no site: their lines belong to
    the enclosing block, which the emulator runs where the GPU runs them."""
    frames: list[list[bool]] = []  # per open #if: [this arm device-only, its #else device-only]
    flags = []
    for kind, text, _, _ in toks:
        if kind == "pre":
            m = re.match(r"\s*#\s*(ifdef|ifndef|if|elif|else|endif)\b(.*)", text, re.DOTALL)
            if m:
                directive, cond = m.group(1), " ".join(m.group(2).split())
                if directive in ("if", "ifdef", "ifndef"):
                    arch = cond == "__CUDA_ARCH__"
                    device = (directive == "ifdef" and arch) or (directive == "if" and bool(_DEVICE_IF.fullmatch(cond)))
                    host = (directive == "ifndef" and arch) or (directive == "if" and bool(_HOST_IF.fullmatch(cond)))
                    frames.append([device, host])
                elif frames and directive == "elif":
                    frames[-1] = [False, False]
                elif frames and directive == "else":
                    frames[-1] = [frames[-1][1], False]
                elif frames and directive == "endif":
                    frames.pop()
        flags.append(any(arm for arm, _ in frames))
    return flags
