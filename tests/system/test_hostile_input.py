"""Hostile YAML and JSON (issue 11, point 2): every case the issue lists is refused with one
line naming file, line and column, exit 2, fast and in bounded memory; the reader's rules
(core schema, UTF-8, control characters, depth, digits) hold for policies, workload files
and manifests alike, because all of them go through topkgen.common.reader."""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from topkgen import policy as pol
from topkgen.policy import MAX_POLICY_BYTES
from topkgen.common.schema import SchemaViolation, validate

from ..conftest import DEFAULT_POLICY, ROOT
from ..support.commands import TOPKGEN

BASE = DEFAULT_POLICY.read_text()


def _variant(old: str, new: str) -> str:
    assert old in BASE, old
    return BASE.replace(old, new, 1)


def _bounded(*args: str, timeout: float = 30, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """topkgen in a child limited to 2 GiB of address space: an alias bomb or /dev/zero
    must fail the test, not the machine."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    return subprocess.run([*TOPKGEN, *args], capture_output=True, text=True, timeout=timeout, preexec_fn=limit,
                          cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)})


NESTED_500 = "[" * 500 + "]" * 500
LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8))

# case -> (policy text, where, message): each was a traceback (exit 1) before issue 11.
def _line_of(fragment: str) -> int:
    """The line of the default policy where `fragment` starts (positions move as it grows)."""
    return BASE[:BASE.index(fragment)].count("\n") + 1


B200_REASON = 'reason: "on B200'
POLICY_CASES = {
    "tag_int": (_variant("version: 1", "version: !!int abc"), ":4:10: version", "'abc' is not a valid !!int"),
    "tag_bool": (_variant("aot_covers_all: true", "aot_covers_all: !!bool x"),
                 f":{_line_of('aot_covers_all: true')}:17: aot_covers_all",
                 "'x' is not a valid !!bool"),
    "tag_timestamp": (_variant("name: topk", "name: !!timestamp x"), ":5:7: name",
                      "tag !!timestamp is not allowed: only the YAML core schema's tags are, here !!str"),
    "tag_python_key": (_variant("name: topk", "name: topk\n!!python/name:os.system : 1"), ":6:1:",
                       "tag !!python/name:os.system is not allowed: "),
    "merge_key": (_variant("name: topk", "name: topk\n<<: {version: 1}"), ":6:1:", "merge keys (<<) are not allowed"),
    "digits_4301": (_variant("version: 1", "version: " + "9" * 4301), ":4:10: version",
                    "an integer of 4301 digits is out of range (at most 20)"),
    "self_alias": (_variant("name: topk", "name: topk\nx: &a [*a]"), ":6:4: x", "anchors (&a) are not allowed"),
    "nested_500": (_variant("name: topk", "name: topk\nx: " + NESTED_500), ":6:35:", "nested deeper than 32 levels"),
    "trailing_newline_name": (_variant("name: topk", 'name: "topk\\n"'), ":5:7: name",
                              "'topk\\n' does not match the pattern"),
    "escaped_control_character": (_variant(B200_REASON, 'reason: "\\e[31mon B200'),
                                  f":{_line_of(B200_REASON)}:13: rules[2].reason",
                                  "U+001B, a control character, is not allowed"),
}


@pytest.mark.parametrize("case", sorted(POLICY_CASES))
def test_hostile_policy_is_refused_with_its_position(cli, tmp_path, case):
    text, where, message = POLICY_CASES[case]
    path = tmp_path / "hostile.yaml"
    path.write_text(text)
    result = cli("plan", "--policy", path)
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"topkgen: error: {path}{where}"), result.stderr
    assert message in result.stderr, result.stderr


@pytest.mark.parametrize("case,text,where", [
    # 40,000 nested lists segfaulted inside libyaml's composer (exit 139).
    ("nested_40000", "x: " + "[" * 40000 + "]" * 40000, ":1:35: nested deeper than 32 levels"),
    # A billion laughs: 9^9 references to 'lol' ran past 15 s and 1 GB.
    ("billion_laughs", LAUGHS, ":1:4: a: anchors (&a) are not allowed"),
], ids=["nested_40000", "billion_laughs"])
def test_bombs_are_refused_quickly_in_bounded_memory(tmp_path, case, text, where):
    path = tmp_path / f"{case}.yaml"
    path.write_text(text)
    start = time.monotonic()
    proc = _bounded("plan", "--policy", str(path))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr == f"topkgen: error: {path}{where}\n"
    assert time.monotonic() - start < 30


def test_an_endless_policy_file_is_read_no_further_than_the_cap():
    proc = _bounded("plan", "--policy", "/dev/zero")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr == f"topkgen: error: /dev/zero: the policy is larger than {pol.MAX_POLICY_BYTES} bytes\n"


def test_uniqueness_is_checked_in_one_pass(tmp_path):
    # 20,000 values in one list took over a minute: uniqueItems compared every pair.
    path = tmp_path / "long_list.yaml"
    path.write_text(_variant("aot: [float32, bfloat16]", "aot: [" + ", ".join(map(str, range(20000))) + "]"))
    proc = _bounded("plan", "--policy", str(path), timeout=30)
    assert proc.returncode == 2 and "dtypes.aot[0]: expected string, got 0" in proc.stderr
    with pytest.raises(SchemaViolation, match=r"duplicate item 1\.0"):
        validate([0, 1, 2, 1.0], {"uniqueItems": True})  # JSON equality: 1 == 1.0
    validate([1, True, "1", [1], {"a": 1}, {"a": True}], {"uniqueItems": True})  # but 1 != true


@pytest.mark.parametrize("encoding,message", [
    ("utf-16", ":1:1: not UTF-8: byte 0xff cannot be decoded (the file looks like UTF-16); save the file as UTF-8"),
    ("utf-16-le", ":1:2: U+0000, a NUL byte (is the file UTF-16?), is not allowed"),
    ("npy", ":1:1: not UTF-8: byte 0x93 cannot be decoded; the file is binary (it holds NUL bytes), not text"),
])
def test_a_policy_that_is_not_utf8_is_refused(cli, tmp_path, encoding, message):
    # A UTF-16 policy used to build a bundle whose stored text did not match its sha256.
    path = tmp_path / "utf16.yaml"
    # "npy": a numpy array file given for the policy (its header holds NUL bytes).
    path.write_bytes(b"\x93NUMPY\x01\x00v\x00" + BASE.encode() if encoding == "npy" else BASE.encode(encoding))
    result = cli("plan", "--policy", path)
    assert result.exit_code == 2
    assert result.stderr == f"topkgen: error: {path}{message}\n"


def test_stored_text_and_sha256_cover_the_same_bytes(tmp_path):
    text = _variant('reason: "on B200', 'reason: "sur B200 (mesuré à 10,91 %)')
    path = tmp_path / "accents.yaml"
    path.write_bytes(text.encode())
    policy = pol.load(path)
    assert policy.text == text and hashlib.sha256(policy.text.encode()).hexdigest() == policy.sha256
    assert pol.loads(policy.text).sha256 == policy.sha256


@pytest.mark.parametrize("text,value", [
    ("x: yes", "yes"), ("x: on", "on"), ("x: 2001-12-14", "2001-12-14"), ("x: 1_000", "1_000"), ("x: 1:30", "1:30"),
    ("x: 0x1F", 31), ("x: 0o17", 15), ("x: 007", 7), ("x: -12", -12), ("x: ~", None), ("x:", None),
    ("x: TRUE", True), ("x: .inf", float("inf")), ("x: 1e3", 1000.0), ("x: '12'", "12"), ("x: !!str 12", "12"),
    ("x: !!float 3", 3.0), ("x: |\n  a\n", "a\n"), ("'<<': 1", 1),
])
def test_plain_scalars_follow_the_yaml_12_core_schema(text, value):
    from topkgen.common import reader

    doc = reader.parse_yaml(text, "t.yaml").value
    assert doc == {text.split(":")[0].strip("'"): value}


@pytest.mark.parametrize("text,message", [
    ("a: 1\n---\nb: 2\n", "t.yaml:2:1: more than one YAML document"),
    ("? [a]\n: 1\n", "t.yaml:1:3: mapping keys must be scalars"),
    ("a: !custom 1\n", "t.yaml:1:4: a: tag !custom is not allowed: only the YAML core schema"),
    ("a: !!set {x}\n", "t.yaml:1:4: a: tag !!set is not allowed: only the YAML core schema"),
    ("a: !!binary aGk=\n", "t.yaml:1:4: a: tag !!binary is not allowed: only the YAML core schema"),
    ("a: [1, *b]\n", "t.yaml:1:8: a[1]: aliases (*b) are not allowed"),
    ("a: 1\na: 2\n", "t.yaml:2:1: a: duplicate key 'a'"),
    ("a: \"\\u202e\"\n", "t.yaml:1:4: a: U+202E, a bidirectional control, is not allowed"),
    ("a: \"x\\0\"\n", "t.yaml:1:4: a: U+0000, a NUL byte (is the file UTF-16?), is not allowed"),
    ("a: 123456789012345678901\n", "t.yaml:1:4: a: an integer of 21 digits is out of range (at most 20)"),
])
def test_reader_refusals_name_the_place(text, message):
    from topkgen.common import reader

    with pytest.raises(reader.ReadError) as caught:
        reader.parse_yaml(text, "t.yaml")
    assert str(caught.value).startswith(message), str(caught.value)


def test_workload_files_go_through_the_same_reader(tmp_path):
    from topkgen.diff import DiffInputError, load_shapes

    deep = tmp_path / "deep.json"
    deep.write_text("[" * 5000 + "]" * 5000)  # pure-Python PyYAML hit RecursionError: a traceback
    with pytest.raises(DiffInputError, match=r"deep\.json:1:33: nested deeper than 32 levels"):
        load_shapes(str(deep))
    tagged = tmp_path / "tagged.yaml"
    tagged.write_text("- {arch: sm_90, dtype: float32, k: !!python/object:os.system 1, n: 8}\n")
    with pytest.raises(DiffInputError, match=r"tagged\.yaml:1:36: \[0\]\.k: tag !!python/object:os\.system"):
        load_shapes(str(tagged))
    good = tmp_path / "good.json"
    good.write_text(json.dumps([{"arch": "sm_90", "dtype": "float32", "k": 4, "n": 0x40}]))
    assert load_shapes(str(good))[0].n == 64


# ----------------------------------------------------------------------------- JSON

@pytest.mark.parametrize("text,message", [
    ("[" * 100_000 + "]" * 100_000, "m.json:1:33: nested deeper than 32 levels"),
    ('{"text": "a\\ud800b"}', "m.json:1:12: U+D800, a lone surrogate, is not allowed"),
    ('{"text": "\\udc00"}', "m.json:1:11: U+DC00, a lone surrogate, is not allowed"),
    ('{"cubin": "sm_90/\\u0000x.cubin"}', "m.json:1:18: U+0000, a NUL byte"),
    ('{"a": NaN}', "m.json:1:7: NaN is not JSON"),
    ('{"a": -Infinity}', "m.json:1:7: -Infinity is not JSON"),
    ('{"a": 1, "a": 2}', 'm.json:1:10: duplicate key "a"'),
    ('{"a": ' + "9" * 5000 + "}", "m.json:1:7: a number of 5000 characters is out of range"),
    ('{"a": 1,}', "m.json:1:9: not valid JSON"),
    ('{"a": "\u202e"}', "m.json:1:8: U+202E, a bidirectional control, is not allowed"),
    # json said "Unexpected UTF-8 BOM (decode using utf-8-sig)": Python's advice to a programmer
    ('\ufeff{"a": 1}', "m.json:1:1: not valid JSON: the file opens with a byte order mark (U+FEFF), which JSON does "
                       "not allow; save it as UTF-8 without one"),
], ids=lambda v: v[:24] if isinstance(v, str) else None)
def test_json_refusals_name_the_place(text, message):
    from topkgen.common import reader

    with pytest.raises(reader.ReadError) as caught:
        reader.parse_json(text, "m.json")
    assert str(caught.value).startswith(message), str(caught.value)


def test_json_keeps_what_is_valid():
    from topkgen.common import reader

    text = json.dumps({"pair": "\U0001F600", "escaped": "\\u0000 is text", "nl": "a\nb", "n": [1, -2.5e3]})
    assert reader.parse_json(text, "m.json") == json.loads(text)


def test_diff_reads_no_more_of_a_policy_file_than_a_policy_may_hold(tmp_path):
    """A 3 GB policy file, as a side of its own and as the working tree's, is refused after
    its first MiB: diff read both whole first, past the 2 GiB this child may map."""
    repo = tmp_path / "repo"
    policy = repo / "policies" / "topk.yaml"
    policy.parent.mkdir(parents=True)
    shutil.copy(DEFAULT_POLICY, policy)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "policy"], check=True)
    os.truncate(policy, 3 << 30)  # sparse: no disk is spent
    for args, source in ((["diff", str(policy), str(DEFAULT_POLICY)], str(policy)),
                         (["diff", "HEAD"], "working tree: policies/topk.yaml")):
        proc = _bounded(*args, cwd=repo)
        assert (proc.returncode, proc.stderr) == (2, f"topkgen: error: {source}: the policy is larger than "
                                                     f"{MAX_POLICY_BYTES} bytes\n"), args


def _exact_n_rules(count: int) -> str:
    """The default policy with `count` JIT-only radix rules of one exact n each (66 KB for 300
    of them, whose dispatch table took `build` 12 minutes and more than loaders index)."""
    rules = "".join(f"  - name: exact_{i}\n    family: radix\n    work: exact\n    k: [64]\n"
                    f"    n: {{exact: [{10000 + 7 * i}]}}\n    modes: [fast]\n    serves: [fast]\n"
                    f"    dtypes: [float32]\n    archs: [sm_90]\n    aot: false\n    reason: \"one shape\"\n"
                    for i in range(count))
    order = "".join(f"  - exact_{i}\n" for i in range(count))
    return BASE.replace("rules:\n", "rules:\n" + rules, 1).replace("dispatch_order:\n", "dispatch_order:\n" + order, 1)


def test_a_policy_that_cuts_dispatch_too_finely_is_refused_at_once(tmp_path):
    path = tmp_path / "fine.yaml"
    path.write_text(_exact_n_rules(300))
    started = time.monotonic()
    proc = _bounded("plan", "--policy", str(path))
    assert proc.returncode == 2 and time.monotonic() - started < 10, proc.stderr
    line = BASE.split("\n").index("rules:") + 1
    found = re.fullmatch(rf"topkgen: error: {re.escape(str(path))}:{line}:1: rules: the rules' k, n and batch bounds "
                         rf"cut dispatch into (\d+) cells over all archs, dtypes and modes; at most "
                         rf"{pol.MAX_DISPATCH_CELLS} \(every loader indexes them\): serve neighbouring exact n with one "
                         rf"window \(n: \{{min, max\}}\)\n", proc.stderr)
    assert found and int(found.group(1)) > pol.MAX_DISPATCH_CELLS, proc.stderr


def test_the_finest_dispatch_a_policy_may_cut_is_within_the_loaders_index_budget():
    """The most exact-n rules the cap admits: indexing their table takes far fewer row visits
    than a loader allows, so no bundle topkgen builds is refused by its own loaders."""
    from topkgen.policy import dispatch_table

    admitted = max(c for c in range(1, 30) if _admitted(c))
    policy = pol.loads(_exact_n_rules(admitted), "fine.yaml")
    table = dispatch_table.build(policy, list(policy.archs))
    budget = dispatch_table.IndexBudget()
    for arch, dtypes in table.items():
        for dtype, modes in dtypes.items():
            for mode, rows in modes.items():
                dispatch_table.ListIndex(rows, f"dispatch.{arch}.{dtype}.{mode}", budget)
    assert dispatch_table.MAX_INDEX_VISITS - budget.left < dispatch_table.MAX_INDEX_VISITS // 8


def _admitted(count: int) -> bool:
    try:
        pol.loads(_exact_n_rules(count), "fine.yaml")
    except pol.PolicyError as err:
        assert "cut dispatch into" in str(err), err
        return False
    return True
