"""topkgen's on/off environment variables, read here alone so that each takes the same words.

Each was read on its own (`not in ("", "0")`): `TOPKGEN_DISABLE_JIT=" 1 "`, which a YAML
file or a shell quote easily gives, was on, but `=" 0 "` and `=false` were on too. Now blanks
and case do not matter, and a value that is neither on nor off is refused naming the
variable (exit 2 from the CLI) rather than read as one or the other.
"""

from __future__ import annotations

import os

from topkgen.common.errors import InputError

FLAGS = ("TOPKGEN_CACHE_READONLY", "TOPKGEN_DEBUG", "TOPKGEN_DISABLE_JIT")
ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")  # and unset or blank


class SettingError(InputError, ValueError):
    """An on/off environment variable set to neither."""


def flag(name: str) -> bool:
    """Whether the on/off variable `name` is on (SettingError when it is neither on nor off)."""
    value = os.environ.get(name, "")
    word = value.strip().lower()
    if word in ON:
        return True
    if word in OFF or not word:
        return False
    raise SettingError(f"{name}={value.strip()[:40]}: neither on ({', '.join(ON)}) nor off ({', '.join(OFF)}, "
                       f"or empty)")


def check_flags() -> None:
    """Refuse, before any work, an on/off variable set to neither, whether or not the
    command at hand reads it: a typo in one is then seen at once, not when it first matters."""
    for name in FLAGS:
        flag(name)
