"""The one base class of errors caused by what a user gave topkgen (a file, an argument).

The CLI's top-level handler prints such an error as one line and exits 2; any other
exception is a bug in topkgen and exits 70. Each module keeps its own error class (with
its own base, so callers that catch it keep working) and adds this one.
"""

from __future__ import annotations


class InputError(Exception):
    """Bad input: the message names the file, line, key or argument and says what is wrong."""
