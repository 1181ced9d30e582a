"""A small JSON Schema (draft 2020-12 subset) validator, standard library only.

`topkgen.policy` must import with the standard library and PyYAML alone (other build
systems and the JIT path import it), so it cannot lean on a schema library. The shipped
schemas use only the keywords implemented here; the test suite validates the same
documents with the reference `jsonschema` package to prove the two agree.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

Path = tuple[str | int, ...]


@dataclass
class SchemaViolation(Exception):
    """One violation: where it is (a key path), what is wrong, and whether the path names
    a mapping key (an unknown or badly named key) rather than a value."""

    path: Path
    message: str
    at_key: bool = False

    def __str__(self) -> str:
        return f"{format_path(self.path)}: {self.message}"


def format_path(path: Path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<document>"


@lru_cache(maxsize=None)
def load_schema(name: str) -> dict:
    """Load a schema shipped in topkgen/schemas by file name."""
    text = resources.files("topkgen").joinpath("schemas", name).read_text(encoding="utf-8")
    return json.loads(text)


_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def validate(instance: Any, schema: dict) -> None:
    """Raise SchemaViolation for the first violation found (depth first, document order)."""
    _check(instance, schema, schema, ())


def _resolve(ref: str, root: dict) -> dict:
    if not ref.startswith("#/"):
        raise ValueError(f"only local $ref is supported: {ref}")
    node: Any = root
    for part in ref[2:].split("/"):
        node = node[part]
    return node


def _check(value: Any, schema: dict, root: dict, path: Path) -> None:
    if "x-refusal" in schema:  # a sentence that says why the schema refuses such values
        try:
            _check_node(value, schema, root, path)
        except SchemaViolation as err:
            if err.path == path:
                err.message = f"{err.message}: {schema['x-refusal']}"
            raise
    else:
        _check_node(value, schema, root, path)


@lru_cache(maxsize=None)
def _pattern(pattern: str) -> re.Pattern:
    """A schema pattern as ECMA-262 reads it: `$` is the end of the string, never the place
    before a trailing newline (Python's `$`), so "topk\n" does not pass ^[a-z]+$."""
    return re.compile(re.sub(r"(?<!\\)\$", r"\\Z", pattern))


def _check_node(value: Any, schema: dict, root: dict, path: Path) -> None:
    if "$ref" in schema:
        _check(value, _resolve(schema["$ref"], root), root, path)
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[t](value) for t in types):
            # the whole document of the wrong type: a file that is no policy or manifest at all
            # (a secret linked in its place) is named, its content never echoed
            got = describe(value) if path else kind_of(value)
            raise SchemaViolation(path, f"expected {' or '.join(types)}, got {got}")
    if "const" in schema and not _same(value, schema["const"]):
        raise SchemaViolation(path, f"must be {json.dumps(schema['const'])}, got {describe(value)}")
    if "enum" in schema and not any(_same(value, e) for e in schema["enum"]):
        choices = ", ".join(json.dumps(e) for e in schema["enum"])
        raise SchemaViolation(path, f"{describe(value)} is not one of {choices}")
    if _TYPES["number"](value):
        if "minimum" in schema and value < schema["minimum"]:
            raise SchemaViolation(path, f"{value} is less than the minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            raise SchemaViolation(path, f"{value} is greater than the maximum {schema['maximum']}")
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            raise SchemaViolation(path, f"must have at least {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            raise SchemaViolation(path, f"must have at most {schema['maxLength']} characters")
        if "pattern" in schema and not _pattern(schema["pattern"]).search(value):
            raise SchemaViolation(path, f"{value!r} does not match the pattern {schema['pattern']}")
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            least = schema["minItems"]
            raise SchemaViolation(path, "must not be empty" if least == 1 else f"must have at least {least} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            most = schema["maxItems"]
            raise SchemaViolation(path, f"must have at most {most} item{'' if most == 1 else 's'}")
        if schema.get("uniqueItems"):
            seen: set[Any] = set()
            for i, item in enumerate(value):
                key = _identity(item)
                if key in seen:
                    raise SchemaViolation(path + (i,), f"duplicate item {describe(item)}")
                seen.add(key)
        if "items" in schema:
            for i, item in enumerate(value):
                _check(item, schema["items"], root, path + (i,))
    if isinstance(value, dict):
        _check_object(value, schema, root, path)


def _check_object(value: dict, schema: dict, root: dict, path: Path) -> None:
    props = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    # Unknown and badly named keys first: a typo reads better than "missing key".
    for key in value:
        if "propertyNames" in schema:
            try:
                _check(key, schema["propertyNames"], root, path + (key,))
            except SchemaViolation as err:
                raise SchemaViolation(path + (key,), f"bad key: {err.message}", at_key=True) from None
        if key not in props and extra is False:
            allowed = ", ".join(sorted(props)) or "none"
            raise SchemaViolation(path + (key,), f"unknown key '{key}' (allowed: {allowed})", at_key=True)
    if "minProperties" in schema and len(value) < schema["minProperties"]:
        raise SchemaViolation(path, f"must have at least {schema['minProperties']} entries")
    for key in schema.get("required", []):
        if key not in value:
            raise SchemaViolation(path, f"missing required key '{key}'")
    for key, item in value.items():
        if key in props:
            _check(item, props[key], root, path + (key,))
        elif isinstance(extra, dict):
            _check(item, extra, root, path + (key,))


def _identity(value: Any) -> Any:
    """A hashable key equal for exactly the values JSON calls equal (1 == 1.0, 1 != true),
    so uniqueItems is one pass over a set instead of comparing every pair."""
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, (int, float)):
        return ("number", value)
    if isinstance(value, list):
        return ("array", tuple(_identity(v) for v in value))
    if isinstance(value, dict):
        return ("object", frozenset((k, _identity(v)) for k, v in value.items()))
    return ("string", value)


def _same(a: Any, b: Any) -> bool:
    # JSON equality: 1 and True are different values.
    return type(a) is type(b) and a == b or (_TYPES["number"](a) and _TYPES["number"](b) and a == b)


def kind_of(value: Any) -> str:
    """What a value is, in the file's words, without what it holds."""
    if isinstance(value, (bool, type(None), dict, list)):
        return describe(value)
    return "a string" if isinstance(value, str) else "a number"


def describe(value: Any) -> str:
    """A value as a message shows it: in the file's words (true, null, a list), not Python's."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (dict, list)):
        return "a mapping" if isinstance(value, dict) else "a list"
    return repr(value)
