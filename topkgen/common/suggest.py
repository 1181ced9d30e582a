"""Did-you-mean for mistyped names (commands, archs, dtypes), standard library only.

Why the digits rule: names here differ mostly by their numbers (sm_90 / sm_100, float16 /
float32), which string similarity alone weighs little: `sm90` must suggest sm_90, and
`float64` must suggest nothing rather than float16.
"""

from __future__ import annotations

import difflib
import re
from typing import Iterable

DTYPE_ALIASES = {"fp32": "float32", "f32": "float32", "bf16": "bfloat16", "fp16": "float16", "f16": "float16",
                 "half": "float16"}


def _digits(text: str) -> str:
    return "".join(re.findall(r"[0-9]", text))


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice `word` most likely meant, or None when none is close."""
    choices = list(choices)
    typed = word.strip().lower().replace("-", "_")
    digits = _digits(typed)
    if digits:
        same = [c for c in choices if _digits(c) == digits]
        if len(same) == 1:
            return same[0]
        choices = [c for c in choices if _digits(c).startswith(digits)]
    found = difflib.get_close_matches(typed, choices, n=1, cutoff=0.7)
    return found[0] if found else None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`; did you mean sm_90?` to append to an error message, or ''."""
    found = closest(word, choices)
    return f"; did you mean {found}?" if found else ""


def unknown_dtype(value: str, choices: Iterable[str]) -> str:
    """What to say of a dtype name none of `choices` answers to (with the short spellings
    that would have), and the one it most likely meant: "'flaot32' is not one of float32,
    ... (or fp32, ...); did you mean float32?"."""
    choices = tuple(choices)
    aliases = ", ".join(a for a, d in DTYPE_ALIASES.items() if d in choices)
    if _is_integer_dtype(str(value)):  # int32 is no mistyped float32: say what is wrong
        return (f"{value!r}: integer inputs are not supported; top-k runs on floating point values "
                f"({', '.join(choices)}; or {aliases})")
    return f"{value!r} is not one of {', '.join(choices)} (or {aliases}){did_you_mean(str(value), choices)}"


def _is_integer_dtype(name: str) -> bool:
    """int8..int64, uint8..uint64, i32, u8, ..., long, short, bool: names of integer types."""
    lowered = name.strip().lower()
    return bool(re.fullmatch(r"u?int(8|16|32|64)?|[iu](8|16|32|64)|long|short|byte|bool", lowered))


def dtype(name: str) -> str:
    """A dtype name with the usual short spellings accepted: fp32, bf16, fp16, f32, f16, half."""
    lowered = name.strip().lower()
    return DTYPE_ALIASES.get(lowered, lowered)
