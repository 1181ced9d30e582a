"""The one careful reader of every YAML and JSON file topkgen takes from a user: policies,
`diff --shapes` workloads, manifests and the policy text a manifest embeds.

Such files may be careless or hostile, so every check here is bounded and linear in the
input, and every refusal is a ReadError naming file, line and column:
- a size cap, enforced by a bounded read (`--policy /dev/zero` is not read to the end);
- UTF-8 only, decoded strictly, so the text a bundle stores and its sha256 cover the same
  bytes; control characters other than tab and line breaks, lone surrogates and
  bidirectional overrides are refused wherever they appear, raw or escaped;
- a nesting-depth cap checked on the parser's event stream (YAML) or a token scan (JSON)
  before anything is composed: libyaml's composer and Python's json recurse per level;
- YAML: no anchors or aliases (policies do not need them, and alias bombs are built from
  them), no merge keys, only the core schema's tags, and plain scalars resolved by the
  YAML 1.2 core schema (`yes` stays a string, nothing becomes a timestamp);
- integers limited by digit count before conversion (JSON: by characters, and to 64 bits,
  signed or unsigned, as a C++ loader holds them); JSON without NaN, Infinity or duplicate
  keys.
Standard library and PyYAML only: topkgen.policy imports this module.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

import yaml

from topkgen.common.errors import InputError
from topkgen.common.schema import format_path

MAX_DEPTH = 32
MAX_INT_DIGITS = 20   # 2^63 has 19 digits; no value topkgen reads needs more
MAX_NUMBER_CHARS = 40  # a JSON number token, sign, fraction and exponent included
# The most values one JSON file may hold, bounded by its commas, colons and opening brackets
# (counted at C speed before anything is parsed): a manifest of the largest policy holds about
# 2.7 million (131072 dispatch rows), the default one 35,000. 64 MiB of `[0,0,...]` took 30 s
# and 1.1 GiB to refuse; `[[],[],...]` 1.6 GiB.
MAX_JSON_VALUES = 1 << 22
BINARY_PROBE = 8000    # a NUL among the first 8000 bytes: binary, as git decides it (loaders/cpp: the same)

# Refused in any text and any string value: C0 controls but tab, LF and CR; DEL and C1;
# line and paragraph separators (libyaml counts them as line breaks, editors do not);
# bidirectional embeddings, overrides and isolates; lone surrogates; noncharacters.
_FORBIDDEN = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069"
                        "\ud800-\udfff\ufffe\uffff]")
_ESCAPE_ON_OUTPUT = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff\ufffe\uffff]")


class ReadError(InputError, ValueError):
    """An input file that cannot be used: file, line, column and what is wrong."""

    def __init__(self, message: str, *, source: str, line: int | None = None, column: int | None = None,
                 key: str | None = None) -> None:
        self.message, self.source, self.line, self.column, self.key = message, source, line, column, key
        where = source if line is None else f"{source}:{line}:{column}"
        super().__init__(f"{where}: {key}: {message}" if key else f"{where}: {message}")


def printable(text: str) -> str:
    """`text` with control and bidirectional characters escaped, for messages and output."""
    return _ESCAPE_ON_OUTPUT.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _describe_char(char: str) -> str:
    code = ord(char)
    kind = ("a lone surrogate" if 0xD800 <= code <= 0xDFFF
            else "a bidirectional control" if 0x202A <= code <= 0x202E or 0x2066 <= code <= 0x2069
            else "a line separator" if code in (0x2028, 0x2029)
            else "a noncharacter" if code in (0xFFFE, 0xFFFF)
            else "a NUL byte (is the file UTF-16?)" if code == 0
            else "a control character")
    return f"U+{code:04X}, {kind}, is not allowed"


# ----------------------------------------------------------------------------- bytes and text

def read_bytes(path: str | os.PathLike, *, limit: int, what: str) -> bytes:
    """The file's bytes, refused when there are more than `limit` (read no further)."""
    source = os.fspath(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except IsADirectoryError:
        raise ReadError(f"cannot read {what}: it is a directory", source=source) from None
    except OSError as err:
        raise ReadError(f"cannot read {what}: {err.strerror}", source=source) from None
    except ValueError as err:  # a NUL byte in the path
        raise ReadError(f"cannot read {what}: {err}", source=printable(source)) from None
    if len(data) > limit:
        raise ReadError(f"the {what} is larger than {limit} bytes", source=source)
    return data


def decode(raw: bytes, source: str) -> str:
    """Strict UTF-8 (so text.encode() gives back exactly `raw`), then `check_text`."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line_start = raw.rfind(b"\n", 0, err.start) + 1
        column = len(raw[line_start:err.start].decode("utf-8", "replace")) + 1
        if raw[:2] in (b"\xff\xfe", b"\xfe\xff"):
            advice = " (the file looks like UTF-16); save the file as UTF-8"
        elif b"\0" in raw[:BINARY_PROBE]:
            advice = "; the file is binary (it holds NUL bytes), not text"
        else:
            advice = "; save the file as UTF-8"
        raise ReadError(f"not UTF-8: byte 0x{raw[err.start]:02x} cannot be decoded{advice}",
                        source=source, line=raw.count(b"\n", 0, err.start) + 1, column=column) from None
    check_text(text, source)
    return text


def _line_column(text: str, offset: int) -> tuple[int, int]:
    return text.count("\n", 0, offset) + 1, offset - (text.rfind("\n", 0, offset) + 1) + 1


def check_text(text: str, source: str) -> None:
    bad = _FORBIDDEN.search(text)
    if bad is not None:
        line, column = _line_column(text, bad.start())
        raise ReadError(_describe_char(bad.group()), source=source, line=line, column=column)


# ----------------------------------------------------------------------------- YAML

@dataclass
class Document:
    """A parsed file: its value, and the 1-based (line, column) of each value by key path
    (a tuple of keys and list indices); ("key",) + path locates a mapping key itself."""

    value: Any
    positions: dict[tuple, tuple[int, int]] = field(default_factory=dict)

    def position(self, path: tuple) -> tuple[int | None, int | None]:
        """Where `path` is, or the nearest enclosing value that is known."""
        probe = tuple(path)
        while probe not in self.positions and probe:
            probe = probe[:-1]
        return self.positions.get(probe, (None, None))


_CORE_TAG = "tag:yaml.org,2002:"
_SCALAR_TAGS = ("str", "int", "float", "bool", "null")
_BOOLS = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_NULLS = ("", "~", "null", "Null", "NULL")
_INT = re.compile(r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+")
_FLOAT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)")


class _Frame:
    __slots__ = ("container", "path", "key")

    def __init__(self, container: Any, path: tuple) -> None:
        self.container, self.path, self.key = container, path, None


def parse_yaml(text: str, source: str, *, max_depth: int = MAX_DEPTH) -> Document:
    """One YAML document as plain data (dict, list, str, int, float, bool, None) with the
    position of every value. An empty stream gives Document(None).

    Kept whole: one pass over PyYAML's events, with the frame stack, the bounds and the
    positions it keeps as local state; split up, that state would have to travel between parts."""
    check_text(text, source)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    positions: dict[tuple, tuple[int, int]] = {}
    stack: list[_Frame] = []
    root: list[Any] = []
    documents = 0

    def here() -> tuple | None:
        """The key path of the value the parser is at (None before the document)."""
        if not stack:
            return () if not root else None
        frame = stack[-1]
        if isinstance(frame.container, list):
            return frame.path + (len(frame.container),)
        return frame.path if frame.key is None else frame.path + (frame.key,)

    def fail(message: str, mark: Any) -> ReadError:
        path = here()
        return ReadError(message, source=source, line=mark.line + 1, column=mark.column + 1,
                         key=printable(format_path(path)) if path else None)

    def place(value: Any, event: Any) -> tuple | None:
        """Put a value where the parser is; returns its path (None for a mapping key)."""
        at = (event.start_mark.line + 1, event.start_mark.column + 1)
        if not stack:
            root.append(value)
            positions[()] = at
            return ()
        frame = stack[-1]
        if isinstance(frame.container, list):
            path = frame.path + (len(frame.container),)
            frame.container.append(value)
        elif frame.key is None:  # a mapping key
            if not isinstance(event, yaml.ScalarEvent):
                raise fail("mapping keys must be scalars", event.start_mark)
            key = event.value  # keys are names: `1024:` is the key "1024"
            if key == "<<" and event.tag is None and event.implicit[0]:
                raise fail("merge keys (<<) are not allowed", event.start_mark)
            if key in frame.container:
                raise ReadError(f"duplicate key '{printable(key)}'", source=source, line=at[0], column=at[1],
                                key=printable(format_path(frame.path + (key,))))
            positions[("key",) + frame.path + (key,)] = at
            frame.key = key
            return None
        else:
            path = frame.path + (frame.key,)
            frame.container[frame.key] = value
            frame.key = None
        positions[path] = at
        return path

    try:
        for event in yaml.parse(text, Loader=loader):
            if isinstance(event, yaml.AliasEvent):
                raise fail(f"aliases (*{printable(event.anchor)}) are not allowed", event.start_mark)
            if getattr(event, "anchor", None) is not None:
                raise fail(f"anchors (&{printable(event.anchor)}) are not allowed", event.start_mark)
            if isinstance(event, yaml.DocumentStartEvent):
                documents += 1
                if documents > 1:
                    raise fail("more than one YAML document in the file", event.start_mark)
            elif isinstance(event, yaml.ScalarEvent):
                place(_scalar(event, fail), event)
            elif isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                is_map = isinstance(event, yaml.MappingStartEvent)
                _check_tag(event.tag, ("map",) if is_map else ("seq",), fail, event.start_mark)
                if len(stack) >= max_depth:
                    raise ReadError(f"nested deeper than {max_depth} levels", source=source,
                                    line=event.start_mark.line + 1, column=event.start_mark.column + 1)
                container: Any = {} if is_map else []
                path = place(container, event)
                if path is None:
                    raise fail("mapping keys must be scalars", event.start_mark)
                stack.append(_Frame(container, path))
            elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                stack.pop()
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = printable(str(getattr(err, "problem", None) or err))
        if mark is None:
            raise ReadError(f"malformed YAML: {problem}", source=source) from None
        raise ReadError(f"malformed YAML: {problem}", source=source, line=mark.line + 1,
                        column=mark.column + 1) from None
    return Document(root[0] if root else None, positions)


def _check_tag(tag: str | None, allowed: tuple[str, ...], fail: Any, mark: Any) -> str | None:
    """The core-schema kind an explicit tag asks for (None when there is no tag)."""
    if tag is None or tag == "!":
        return None
    kind = tag[len(_CORE_TAG):] if tag.startswith(_CORE_TAG) else None
    if kind not in allowed:
        shown = f"!!{kind or tag[len(_CORE_TAG):]}" if tag.startswith(_CORE_TAG) else tag
        raise fail(f"tag {printable(shown)} is not allowed: only the YAML core schema's tags are, here "
                   f"{', '.join('!!' + t for t in allowed)}", mark)
    return kind


def _scalar(event: Any, fail: Any) -> Any:
    kind = _check_tag(event.tag, _SCALAR_TAGS, fail, event.start_mark)
    text: str = event.value
    if _FORBIDDEN.search(text):  # an escape in a double-quoted scalar
        raise fail(_describe_char(_FORBIDDEN.search(text).group()), event.start_mark)
    plain = event.tag is None and event.implicit[0]
    if kind == "str" or (kind is None and not plain):
        return text
    if kind in (None, "null") and text in _NULLS:
        return None
    if kind in (None, "bool") and text in _BOOLS:
        return _BOOLS[text]
    if kind in (None, "int") and _INT.fullmatch(text):
        digits = text.lstrip("+-")
        if len(digits) > MAX_INT_DIGITS:
            raise fail(f"an integer of {len(digits)} digits is out of range (at most {MAX_INT_DIGITS})",
                       event.start_mark)
        return int(text, 0 if text[:2] in ("0x", "0o") else 10)
    if kind in (None, "float") and _FLOAT.fullmatch(text):
        lowered = text.lower()
        return float(lowered.replace(".inf", "inf").replace(".nan", "nan"))
    if kind is None:
        return text
    raise fail(f"{printable(text)!r} is not a valid !!{kind}", event.start_mark)


def read_yaml(path: str | os.PathLike, *, limit: int, what: str, max_depth: int = MAX_DEPTH) -> Document:
    source = os.fspath(path)
    return parse_yaml(decode(read_bytes(path, limit=limit, what=what), source), source, max_depth=max_depth)


# ----------------------------------------------------------------------------- JSON

# Strings (a raw line break ends a broken one), brackets, numbers and the constants
# Python's json would take: enough to measure depth and vet escapes and numbers in one pass.
# Numbers only where one could fail a check (over 40 characters, 19 digits, a 3-digit exponent):
# the others pass them all, and a file of millions of them is scanned at C speed.
_JSON_TOKEN = re.compile(r'"[^"\\\n]*(?:\\.[^"\\\n]*)*"|[\[\]{}]|NaN|-?Infinity'
                         r'|(?<![0-9.eE+-])-?(?=[0-9.eE+-]{41}|[0-9]{19}|[0-9.]*[eE]\+?[0-9]{3})[0-9][0-9.eE+-]*')
_JSON_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|.)")
_JSON_INT = re.compile(r"-?[0-9]+")
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


def parse_json(text: str, source: str, *, max_depth: int = MAX_DEPTH) -> Any:
    """One JSON value, after a linear token scan has checked depth, escapes and numbers."""
    _check_values(text, source)
    check_text(text, source)

    def fail(message: str, offset: int) -> ReadError:
        line, column = _line_column(text, offset)
        return ReadError(message, source=source, line=line, column=column)

    if not _needs_token_scan(text, max_depth):
        return _loads(text, source, fail)
    depth = 0
    for token in _JSON_TOKEN.finditer(text):
        value = token.group()
        first = value[0]
        if first == '"':
            if "\\u" in value:
                _check_escapes(value, token.start(), fail)
        elif first in "[{":
            depth += 1
            if depth > max_depth:
                raise fail(f"nested deeper than {max_depth} levels", token.start())
        elif first in "]}":
            depth -= 1
        elif value in ("NaN", "Infinity", "-Infinity"):
            raise fail(f"{value} is not JSON", token.start())
        elif len(value) > MAX_NUMBER_CHARS:
            raise fail(f"a number of {len(value)} characters is out of range (at most {MAX_NUMBER_CHARS})",
                       token.start())
        elif _JSON_INT.fullmatch(value) and not -2**63 <= int(value) < 2**64:  # what a C++ loader can hold
            raise fail(f"the integer {value} does not fit in 64 bits", token.start())
        elif _JSON_NUMBER.fullmatch(value) and math.isinf(float(value)):  # 1e400: json reads inf
            raise fail(f"the number {value} is beyond the range of a double", token.start())

    return _loads(text, source, fail)


# What the token scan looks for, found at C speed: a text none of these match passes it, so
# the scan (a Python step per token: seconds for a few million) runs only on the few texts
# where one does, to say exactly where and what. Each errs on the side of scanning: a match
# inside a string costs only the scan.
_SUSPECT = re.compile(r"NaN|Infinity|[0-9]{19}|[0-9.eE+-]{%d}|[eE]\+?[0-9]{3}" % (MAX_NUMBER_CHARS + 1))
_JSON_STRING = re.compile(r'"[^"\\\n]*(?:\\.[^"\\\n]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_EMPTY_PAIR = re.compile(r"\[\]|\{\}")


def _needs_token_scan(text: str, max_depth: int) -> bool:
    if "\\u" in text:
        return True
    compact = "".join(_JSON_STRING.sub('""', text).split())  # no strings, no blanks: what numbers and brackets are
    if _SUSPECT.search(compact):
        return True
    brackets = _NOT_BRACKET.sub("", compact)
    for _ in range(max_depth):  # each pass removes the innermost level
        if not brackets:
            return False
        brackets = _EMPTY_PAIR.sub("", brackets)
    return bool(brackets)  # deeper than max_depth, or unbalanced: the scan says where


def _loads(text: str, source: str, fail: Any) -> Any:
    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                needle = re.compile(re.escape(json.dumps(key)) + r"\s*:")
                hits = [m.start() for m in needle.finditer(text)]
                raise fail(f"duplicate key {printable(json.dumps(key))}", hits[-1] if hits else 0)
            out[key] = value
        return out

    if text.startswith("\ufeff"):  # json said "Unexpected UTF-8 BOM (decode using utf-8-sig)", Python's advice
        raise fail("not valid JSON: the file opens with a byte order mark (U+FEFF), which JSON does not allow; "
                   "save it as UTF-8 without one", 0)
    try:
        return json.loads(text, object_pairs_hook=unique)
    except json.JSONDecodeError as err:
        raise ReadError(f"not valid JSON: {err.msg}", source=source, line=err.lineno, column=err.colno) from None


def _check_escapes(token: str, offset: int, fail: Any) -> None:
    """\\u escapes in a JSON string must not spell a forbidden character or half a pair."""
    escapes: Iterator[re.Match] = _JSON_ESCAPE.finditer(token)
    pending_high: re.Match | None = None
    for m in escapes:
        code = int(m.group(1), 16) if m.group(1) else None
        if pending_high is not None:
            if code is None or not 0xDC00 <= code <= 0xDFFF or m.start() != pending_high.end():
                raise fail(_describe_char(chr(int(pending_high.group(1), 16))), offset + pending_high.start())
            pending_high = None
            continue
        if code is None:
            continue
        if 0xD800 <= code <= 0xDBFF:
            pending_high = m
        elif _FORBIDDEN.match(chr(code)):
            raise fail(_describe_char(chr(code)), offset + m.start())
    if pending_high is not None:
        raise fail(_describe_char(chr(int(pending_high.group(1), 16))), offset + pending_high.start())


def _check_values(data: str | bytes, source: str) -> None:
    """At most MAX_JSON_VALUES values, counted at C speed (loaders/cpp: the same, first)."""
    marks = (",", ":", "[", "{") if isinstance(data, str) else (b",", b":", b"[", b"{")
    values = sum(data.count(mark) for mark in marks)  # type: ignore[arg-type]
    if values > MAX_JSON_VALUES:
        raise ReadError(f"holds {values} commas, colons and brackets: more JSON values than the {MAX_JSON_VALUES} "
                        f"a file topkgen reads may hold", source=source)


def read_json(path: str | os.PathLike, *, limit: int, what: str, max_depth: int = MAX_DEPTH) -> Any:
    source = os.fspath(path)
    raw = read_bytes(path, limit=limit, what=what)
    _check_values(raw, source)  # before decoding, as loaders/cpp counts first
    return parse_json(decode(raw, source), source, max_depth=max_depth)
