"""The whole command line: the group with every command registered on it, in WORKFLOW's order
in --help (group.py's list_commands), whatever order the modules are imported in."""

from __future__ import annotations

# Imported for what they do: each registers its commands on `main`.
from topkgen.cli import build_commands, diff_command, map_command, plan_commands, run_command, show_command  # noqa: F401
from topkgen.cli.group import main

__all__ = ["main"]
