"""The C++ loader (loaders/cpp) against topkgen: its lookups and split plans equal
topkgen.policy.select's over the boundary grid (batch sizes included) and 10,000 random
shapes, JIT on and off, and it refuses what the Python loader refuses with the very same
message. Built by `make cpp` (g++, nlohmann/json from
PyPI, OpenSSL's libcrypto); no GPU and no CUDA toolkit needed."""

from __future__ import annotations

import copy
import ctypes
import functools
import importlib.util
import json
import os
import random
import resource
import select
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from topkgen.manifest import reading as manifests
from topkgen.policy import dispatch_table
from topkgen import policy as pol
from topkgen.runtime import TopK, TopKError
from topkgen.common.schema import _resolve, format_path, load_schema
from topkgen.policy.split import ROWS_MAX

from ..conftest import ROOT
from ..support.cpp import cpp_select, loader_flags, python_select



def boundary_shapes(policy: pol.Policy) -> list[tuple]:
    shapes = []
    for arch in policy.archs:
        for dtype in policy.dtypes:
            ks, ns, rs = dispatch_table.boundary_grid(policy, arch, dtype)
            shapes += [(arch, dtype, k, n, det, jit, rows) for k in ks for n in sorted({*ns, k}) if n >= k
                       for rows in [None, 0, *dispatch_table.rows_for(policy, arch, n, rs)]
                       for det in (False, True) for jit in (True, False)]
    return shapes


def random_shapes(policy: pol.Policy, count: int, seed: int = 9) -> list[tuple]:
    rng = random.Random(seed)
    shapes = []
    for _ in range(count):
        k = rng.randint(1, pol.K_COVERED)
        n = rng.choice([rng.randint(k, max(k, 4200)), min(pol.N_MAX, int(k * 2 ** rng.uniform(0, 31))),
                        rng.randint(max(k, 100_000), 600_000)])
        rows = rng.choice([None, 0, rng.randint(1, 128), rng.randint(1, ROWS_MAX)])
        shape = (rng.choice(list(policy.archs)), rng.choice(policy.dtypes), k, n, rng.random() < 0.5)
        shapes += [(*shape, True, rows), (*shape, False, rows)]
    return shapes


def test_cpp_lookups_equal_select(cpp, built_bundle, default_policy):
    for label, shapes in (("boundary grid", boundary_shapes(default_policy)),
                          ("10,000 random shapes", random_shapes(default_policy, 10_000))):
        got = cpp_select(cpp, built_bundle, shapes)
        expect = [python_select(default_policy, s) for s in shapes]
        mismatches = [(s, g, e) for s, g, e in zip(shapes, got, expect) if g != e]
        assert len(got) == len(shapes) and not mismatches, mismatches[:5]
        jit_on = sum(1 for s in shapes if s[5])
        refused = sum(1 for e in expect if e.startswith("error:"))
        print(f"C++ == select, {label}: {len(shapes)} decisions ({jit_on} with JIT, {len(shapes) - jit_on} without; "
              f"{refused} refusals with the same message), 0 mismatches")


def test_both_loaders_give_each_launch_the_same_shared_memory(cpp, built_bundle, default_policy):
    """Schema 6: a launch's dynamic shared memory follows from the elements its CTA reads
    (launch.shared_bytes). For the boundary grid and random shapes with a batch size, the C++
    loader's bytes per launch (select's fifth column) are the Python runtime's: the served
    kernel's manifest entry (Launch.of, as TopK reads it) through split.stages, for one launch
    or a split's two; every radix kernel of the bundle is met, with less than its maximum too."""
    from topkgen.policy.split import ChunkPlan, stages
    from topkgen.runtime.backend import Launch

    doc = json.loads((built_bundle / "manifest.json").read_text())
    entries = {e["name"]: e for e in doc["kernels"] + doc["jit_kernels"]}
    shapes = [s for s in boundary_shapes(default_policy) + random_shapes(default_policy, 3000, seed=28)
              if s[6] is not None]
    answers = cpp_select(cpp, built_bundle, shapes)
    met, below = set(), set()
    for shape, answer in zip(shapes, answers):
        if answer.startswith("error: "):
            continue
        arch, dtype, k, n, _, _, rows = shape
        name, chunks, _, _, shared = answer.split()
        launch = Launch.of(entries[name])
        plan = ChunkPlan(rows, n, k, int(chunks), pol.DTYPE_SIZES[dtype]) if int(chunks) > 1 else None
        expect = [stage.shared_bytes for stage in stages(rows, n, k, True, plan, shared=launch.shared)]
        assert json.loads(shared) == expect, (shape, answer)
        if entries[name]["family"] == "radix":
            met.add(name)
            below |= {name for b in expect if b < launch.dynamic_shared_bytes}
    radix = {name for name, e in entries.items() if e["family"] == "radix"}
    assert met == radix and below, sorted(radix - met)
    print(f"C++ == runtime, shared memory of {len(shapes)} launches' plans over {len(met)} radix kernels, "
          f"{len(below)} of them given less than their maximum")


# ----------------------------------------------------------------------------- refusals

def _tamper_cubin(doc: dict, root: Path, i: int) -> None:
    path = root / doc["kernels"][i]["cubin"]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _escaping_path(doc: dict, root: Path, i: int) -> None:
    outside = root.parent / "evil.cubin"
    outside.write_bytes((root / doc["kernels"][i]["cubin"]).read_bytes())
    doc["kernels"][i]["cubin"] = "../evil.cubin"


def _duplicate_name(doc: dict, root: Path, i: int) -> None:
    """A second entry of the float32 kernel's name pointing at a bfloat16 cubin, with that
    cubin's sha256: schema 1 took the last entry of a name and passed every sha256 check."""
    entry = doc["kernels"][i]
    other = next(e for e in doc["kernels"] if e["name"] == entry["name"].replace("_f32_", "_bf16_"))
    doc["kernels"].append({**copy.deepcopy(entry), "cubin": other["cubin"], "sha256": other["sha256"],
                           "size_bytes": other["size_bytes"]})


def _wrong_sm(doc: dict, root: Path, i: int) -> None:
    """The sm_100 build of the same kernel under the sm_90 name, its sha256 updated to match."""
    entry = doc["kernels"][i]
    twin = next(e for e in doc["kernels"] if e["name"] == entry["name"].replace("_sm_90", "_sm_100"))
    shutil.copy(root / twin["cubin"], root / entry["cubin"])
    entry["sha256"] = twin["sha256"]


def _other_kernels_cubin(doc: dict, root: Path, i: int) -> None:
    """The deterministic twin's cubin (same arch, dtype, k) under the fast kernel's name, its
    sha256 and size updated: only the cubin's symbol table tells."""
    entry = doc["kernels"][i]
    twin = next(e for e in doc["kernels"] if e["name"] == entry["name"].replace("_fast_", "_det_"))
    shutil.copy(root / twin["cubin"], root / entry["cubin"])
    entry["sha256"], entry["size_bytes"] = twin["sha256"], twin["size_bytes"]


def _symbol_table_outside(doc: dict, root: Path, i: int) -> None:
    """The cubin's SHT_SYMTAB section moved (in its header) beyond the end of the file."""
    import hashlib
    import struct

    path = root / doc["kernels"][i]["cubin"]
    data = bytearray(path.read_bytes())
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    header = next(shoff + j * shentsize for j in range(shnum)
                  if struct.unpack_from("<I", data, shoff + j * shentsize + 4)[0] == 2)
    struct.pack_into("<Q", data, header + 24, 1 << 40)
    path.write_bytes(bytes(data))
    doc["kernels"][i]["sha256"] = hashlib.sha256(data).hexdigest()


VICTIM = "topk_radix_dyn_k64_fast_f32_sm_90"
TAMPERING = {
    "tampered cubin": (_tamper_cubin, "kernels[{i}].sha256: sm_90/{name}.cubin does not match its sha256 in the manifest"),
    "escaping path": (_escaping_path, "kernels[{i}].cubin: '../evil.cubin' must be 'sm_90/{name}.cubin'"),
    "duplicate name": (_duplicate_name, "kernels[58].name: duplicate kernel name '{name}' for sm_90 (also kernels[{i}])"),
    "cubin of the wrong SM": (_wrong_sm, "kernels[{i}].cubin: sm_90/{name}.cubin is compiled for sm_100, not sm_90"),
    "cubin of another kernel": (_other_kernels_cubin,
                                "kernels[{i}].symbol: sm_90/{name}.cubin defines no function '{name}'"),
    "no mode served": (lambda doc, root, i: doc["kernels"][i].update(serves=[]),
                       "kernels[{i}].serves: must not be empty"),  # it said "must have at least 1 items"
    "symbol table outside the cubin": (_symbol_table_outside, "kernels[{i}].cubin: sm_90/{name}.cubin is not a CUDA "
                                                              "ELF file: its symbol table cannot be read"),
}


def _tampered_copy(built_bundle: Path, tmp_path: Path, mutate) -> tuple[Path, int]:
    root = tmp_path / "bundle"
    shutil.copytree(built_bundle, root)
    doc = json.loads((root / "manifest.json").read_text())
    i = next(j for j, e in enumerate(doc["kernels"]) if e["name"] == VICTIM)
    mutate(doc, root, i)
    (root / "manifest.json").write_text(json.dumps(doc, indent=2))
    return root, i


def _python_refusal(root: Path) -> str:
    with pytest.raises(TopKError) as err:
        TopK(root, arch="sm_90", backend="emulator")
    cli = subprocess.run([sys.executable, "-m", "topkgen", "show", str(root)], capture_output=True, text=True)
    assert cli.returncode == 2 and cli.stderr == f"topkgen: error: {err.value}\n"
    return str(err.value)


def _cpp_refusal(cpp: Path, root: Path) -> str:
    proc = subprocess.run([cpp, "verify", root], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("topkgen-cpp: error: "), proc.stderr
    return proc.stderr.removeprefix("topkgen-cpp: error: ").rstrip("\n")


@pytest.mark.parametrize("case", sorted(TAMPERING))
def test_both_loaders_refuse_tampering_with_the_same_message(cpp, built_bundle, tmp_path, case):
    mutate, message = TAMPERING[case]
    root, i = _tampered_copy(built_bundle, tmp_path, mutate)
    expected = f"{root}/manifest.json: " + message.format(i=i, name=VICTIM)
    python, native = _python_refusal(root), _cpp_refusal(cpp, root)
    print(f"{case}:\n  Python: {python}\n  C++:    {native}")
    assert python == native == expected


@pytest.mark.parametrize("shard", [{}, {"index": 0, "count": 2, "plan_sha256": "0" * 64},
                                   {"index": "a", "count": 2, "plan_sha256": "0" * 64},
                                   {"index": 1, "count": 2, "plan_sha256": "0" * 64, "zz": 1}],
                         ids=["empty", "index 0", "index a string", "unknown key"])
def test_both_loaders_check_a_shard_record_before_naming_the_part(cpp, built_bundle, tmp_path, shard):
    """A part of a sharded build is refused as one (test_shards), but a forged shard record is
    first a schema violation, as the runtime says: the C++ loader named the part before the
    schema, 'part null/null', 'part 0/2', 'part "a"/2'."""
    root, _ = _tampered_copy(built_bundle, tmp_path, lambda doc, root, i: doc.update(shard=shard))
    with pytest.raises(TopKError) as err:  # `show` lists a part: the runtime is the Python loader that refuses it
        TopK(root, arch="sm_90", backend="emulator")
    python = str(err.value)
    assert "sharded build" not in python and python == _cpp_refusal(cpp, root)


def _schema_1(doc, root, i):
    doc["schema_version"] = 1


def _gap(doc, root, i):
    del doc["dispatch"]["sm_100"]["float16"]["fast"][3]


def _overlap(doc, root, i):
    doc["dispatch"]["sm_90"]["bfloat16"]["deterministic"][2]["n"][0] -= 5


def _wrong_dtype_row(doc, root, i):
    row = doc["dispatch"]["sm_90"]["float32"]["fast"][-1]
    row["kernel"] = row["aot_fallback"] = row["kernel"].replace("_f32_", "_bf16_")


def _jit_source_tampered(doc, root, i):
    path = root / doc["jit_kernels"][5]["source"]
    path.write_text(path.read_text() + "// extra\n")


def _missing_cubin(doc, root, i):
    (root / doc["kernels"][i]["cubin"]).unlink()


def _jit_row_as_aot(doc, root, i):
    row = next(r for r in doc["dispatch"]["sm_90"]["float32"]["fast"] if r["source"] == "jit")
    row["source"] = "aot"


def _chunks_shorter_than_their_count(doc, root, i):
    row = next(r for r in doc["dispatch"]["sm_90"]["float32"]["fast"] if r["k"] == [1, 16] and r["n"][0] == 1025)
    row["chunks"] = row["aot_chunks"] = 64


def _split_beyond_the_grid(doc, root, i):
    row = next(r for r in doc["dispatch"]["sm_90"]["float32"]["fast"] if r["k"] == [1, 16] and r["n"][0] == 2049)
    row["chunks"] = row["aot_chunks"] = 2


@pytest.mark.parametrize("mutate", [_schema_1, _gap, _overlap, _wrong_dtype_row, _jit_source_tampered, _missing_cubin,
                                    _jit_row_as_aot, _chunks_shorter_than_their_count, _split_beyond_the_grid],
                         ids=lambda f: f.__name__.strip("_"))
def test_both_loaders_word_other_refusals_alike(cpp, built_bundle, tmp_path, mutate):
    root, _ = _tampered_copy(built_bundle, tmp_path, mutate)
    with pytest.raises(manifests.ManifestError) as err:
        manifest, top = manifests.load_manifest(root)
        manifests.read_files(top, manifest)
    assert str(err.value) == _cpp_refusal(cpp, root)


# ----------------------------------------------------------------------------- the text and the schema

def _both_refuse(cpp: Path, root: Path) -> str:
    """The message both loaders give (the Python one: load_manifest, then read_files)."""
    with pytest.raises(manifests.ManifestError) as err:
        manifest, top = manifests.load_manifest(root)
        manifests.read_files(top, manifest)
    python, native = str(err.value), _cpp_refusal(cpp, root)
    assert python == native
    return python.removeprefix(f"{root}/manifest.json")


def _edited(doc: dict, edit) -> bytes:
    edit(doc)
    return json.dumps(doc, indent=2, sort_keys=True).encode()


def _set(path: tuple, value):
    def edit(doc):
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return lambda raw: _edited(json.loads(raw), edit)


def _at(raw: bytes, offset: int) -> str:
    """line:column of a byte offset (the lines before it are ASCII)."""
    return f"{raw.count(NL, 0, offset) + 1}:{offset - raw.rfind(NL, 0, offset)}"


NL = b"\n"
BIDI = "topkgen\u202e".encode()
BIDI_ESCAPED = b"topkgen\\u202e"
VERSION_KEY = b'"schema_version":'
VERSION = str(manifests.SCHEMA_VERSION).encode()  # the schema_version this topkgen writes
# case -> (raw manifest -> raw manifest, raw manifest -> the refusal after "FILE")
RAW_CASES = {
    "UTF-8 BOM": (lambda raw: b"\xef\xbb\xbf" + raw,
                  lambda raw: ":1:1: not valid JSON: the file opens with a byte order mark (U+FEFF), which JSON does "
                              "not allow; save it as UTF-8 without one"),
    "UTF-16": (lambda raw: raw.decode().encode("utf-16"),
               lambda raw: ":1:1: not UTF-8: byte 0xff cannot be decoded (the file looks like UTF-16); save the file "
                           "as UTF-8"),
    "Latin-1": (lambda raw: raw.replace(b'"topkgen"', '"topkgén"'.encode("latin-1"), 1),
                lambda raw: f":{_at(raw, raw.index(b'topkg') + 5)}: not UTF-8: byte 0xe9 cannot be decoded; save the "
                            f"file as UTF-8"),
    "binary": (lambda raw: b"\x93NUMPY\x01\x00v\x00{'descr': '<f4'}" + raw,  # a .npy given for a bundle's manifest
               lambda raw: ":1:1: not UTF-8: byte 0x93 cannot be decoded; the file is binary (it holds NUL bytes), "
                           "not text"),
    # named where written last
    "duplicate key": (lambda raw: raw.replace(b"{", b'{\n  "schema_version": ' + VERSION + b",", 1),
                      lambda raw: f":{_at(raw, raw.rindex(VERSION_KEY))}: duplicate key " + '"schema_version"'),
    "bidirectional control": (lambda raw: raw.replace(b'"topkgen"', b'"' + BIDI + b'"', 1),
                              lambda raw: f":{_at(raw, raw.index(BIDI) + 7)}: U+202E, a bidirectional control, "
                                          f"is not allowed"),
    "bidirectional control escaped": (lambda raw: raw.replace(b'"topkgen"', b'"' + BIDI_ESCAPED + b'"', 1),
                                      lambda raw: f":{_at(raw, raw.index(BIDI_ESCAPED) + 7)}: U+202E, a "
                                                  f"bidirectional control, is not allowed"),
    "unknown key": (_set(("policy", "document"), "x"),
                    lambda raw: ": policy.document: unknown key 'document' (allowed: name, path, sha256, text)"),
    "dynamic shared memory beyond any arch": (_set(("kernels", 0, "launch", "dynamic_shared_bytes"), 2**40),
                                              lambda raw: ": kernels[0].launch.dynamic_shared_bytes: 1099511627776 "
                                                          "is greater than the maximum 232448"),
    "schema_version 3.0": (_set(("schema_version",), 3.0),
                           lambda raw: f": schema_version: 3.0 is not supported (this topkgen reads version "
                                      f"{manifests.SCHEMA_VERSION})"),
    "schema_version true": (_set(("schema_version",), True),
                            lambda raw: f": schema_version: true is not supported (this topkgen reads version "
                                      f"{manifests.SCHEMA_VERSION})"),
    "a float for an integer": (_set(("kernels", 0, "k"), 64.0),
                               lambda raw: ": kernels[0].k: expected integer, got 64.0"),
    "an integer beyond 64 bits": (_set(("kernels", 0, "launch", "threads_per_block"), 2**70),
                                  lambda raw: f":{_at(raw, raw.index(str(2**70).encode()))}: the integer {2**70} "
                                              f"does not fit in 64 bits"),
    # were an unnamed nlohmann error in C++ ("number overflow parsing '1E400'") and inf in Python
    "a number beyond a double": (lambda raw: raw.replace(VERSION_KEY + b" " + VERSION, VERSION_KEY + b" -1E400", 1),
                                 lambda raw: f":{_at(raw, raw.index(b'-1E400'))}: the number -1E400 is beyond the "
                                             f"range of a double"),
    # floats as Python's repr writes them: nlohmann wrote 1e+15 and 2.3782631626533768e+16
    "a float below 1e16": (_set(("kernels", 0, "k"), 1e15),
                           lambda raw: ": kernels[0].k: expected integer, got 1000000000000000.0"),
    "a float's shortest digits": (_set(("kernels", 0, "k"), 2.378263162653377e+16),
                                  lambda raw: ": kernels[0].k: expected integer, got 2.378263162653377e+16"),
    # as json.dumps writes it: nlohmann wrote {"a":1,"b":[2.5,"é"]}
    "schema_version a mapping": (_set(("schema_version",), {"a": 1, "b": [2.5, "\u00e9"]}),
                                 lambda raw: ': schema_version: {"a": 1, "b": [2.5, "\\u00e9"]} is not supported '
                                             f'(this topkgen reads version {manifests.SCHEMA_VERSION})'),
    "an invisible character where a number goes": (_set(("kernels", 0, "k"), "\u200b"),
                                                   lambda raw: ": kernels[0].k: expected integer, got '\\u200b'"),
}


SM90, SM100 = b'"sm_90"', b'"sm_100"'
# The common JSON syntax errors: (raw -> raw, raw -> the offset Python's json names, its words).
# The C++ loader said what nlohmann says ("syntax error while parsing object - unexpected
# string literal; expected '}'"), often at another column.
SYNTAX_CASES = {
    "an empty file": (lambda raw: b"", lambda raw: 0, "Expecting value"),
    "a truncated file": (lambda raw: raw[:-2], len, "Expecting ',' delimiter"),
    "a cut string": (lambda raw: raw[:raw.index(SM90) + 4], lambda raw: raw.index(b'"sm_'),
                     "Unterminated string starting at"),
    "a missing comma": (lambda raw: raw.replace(SM90 + b",", SM90, 1), lambda raw: raw.index(SM100),
                        "Expecting ',' delimiter"),
    "a missing colon": (lambda raw: raw.replace(b'"archs":', b'"archs"', 1), lambda raw: raw.index(b"["),
                        "Expecting ':' delimiter"),
    "a missing value": (lambda raw: raw.replace(VERSION_KEY + b" " + VERSION, VERSION_KEY, 1),
                        lambda raw: raw.index(VERSION_KEY) + len(VERSION_KEY), "Expecting value"),
    "a trailing comma": (lambda raw: raw[:-3] + b",\n}\n", lambda raw: raw.rindex(b"}"),
                         "Expecting property name enclosed in double quotes"),
    "single quotes": (lambda raw: raw.replace(SM90, b"'sm_90'", 1), lambda raw: raw.index(b"'"), "Expecting value"),
    "True for true": (lambda raw: raw.replace(SM90, b"True", 1), lambda raw: raw.index(b"True"), "Expecting value"),
    "a tab in a string": (lambda raw: raw.replace(SM90, b'"sm\t_90"', 1), lambda raw: raw.index(b"\t"),
                          "Invalid control character at"),
    "an unknown escape": (lambda raw: raw.replace(SM90, b'"sm\\_90"', 1), lambda raw: raw.index(b"sm\\_") + 2,
                          "Invalid \\escape"),
    "a short \\u escape": (lambda raw: raw.replace(SM90, b'"sm\\u90"', 1), lambda raw: raw.index(b"sm\\u") + 3,
                            "Invalid \\uXXXX escape"),
    "a number ending in a dot": (lambda raw: raw.replace(VERSION_KEY + b" " + VERSION,
                                                         VERSION_KEY + b" " + VERSION + b".", 1),
                                 lambda raw: raw.index(VERSION_KEY) + len(VERSION_KEY) + 2, "Expecting ',' delimiter"),
    "a leading zero": (lambda raw: raw.replace(VERSION_KEY + b" " + VERSION, VERSION_KEY + b" 0" + VERSION, 1),
                       lambda raw: raw.index(VERSION_KEY) + len(VERSION_KEY) + 2, "Expecting ',' delimiter"),
    "a comment": (lambda raw: b"// the bundle's manifest\n" + raw, lambda raw: 0, "Expecting value"),
    "a second document": (lambda raw: raw + b"{}\n", lambda raw: raw.rindex(b"{"), "Extra data"),
}
RAW_CASES |= {f"JSON: {name}": (change, lambda raw, where=where, words=words: f":{_at(raw, where(raw))}: not valid "
                                                                            f"JSON: {words}")
              for name, (change, where, words) in SYNTAX_CASES.items()}


@pytest.mark.parametrize("case", sorted(RAW_CASES))
def test_both_loaders_read_the_text_and_the_schema_alike(cpp, built_bundle, tmp_path, case):
    """What Python's reader and schema refuse, the C++ loader refuses with the same message:
    it scans the text as topkgen.common.reader does and validates against the same (embedded) schema."""
    change, message = RAW_CASES[case]
    root = tmp_path / "bundle"
    shutil.copytree(built_bundle, root)
    raw = change((root / "manifest.json").read_bytes())
    (root / "manifest.json").write_bytes(raw)
    got = _both_refuse(cpp, root)
    print(f"{case}: {got}")
    assert got == message(raw)


def test_both_loaders_refuse_a_table_cut_too_finely_to_index(cpp, built_bundle, tmp_path):
    """Indexing a list visits, at every n cut, every row spanning it: quadratic in the rows. A
    forged list of 10,000 rows (a 5 MB manifest) took the Python loader a minute and the C++
    one 450 MB; a 64 MB one would take hours. Both stop at MAX_INDEX_VISITS, the same way."""
    root = tmp_path / "bundle"
    shutil.copytree(built_bundle, root)
    doc = json.loads((root / "manifest.json").read_text())
    rows, pieces = doc["dispatch"]["sm_90"]["float32"]["fast"], 1100  # 1100 + 1100 x 1100 visits
    rows[:] = [{**rows[0], "k": [1, pol.N_MAX], "n": [1 + 1000 * j, pol.N_MAX if j == pieces - 1 else 1000 * (j + 1)],
                "rows": [1, ROWS_MAX]} for j in range(pieces)]
    (root / "manifest.json").write_text(json.dumps(doc))
    assert _both_refuse(cpp, root) == (f": dispatch.sm_90.float32.fast: the dispatch lists are cut too finely: "
                                       f"indexing them takes more than {dispatch_table.MAX_INDEX_VISITS} row visits")


def test_an_object_of_many_keys_is_read_in_linear_time(cpp, built_bundle, tmp_path):
    """nlohmann's ordered_json searched an object's keys before adding each: 200,000 keys (a
    2 MB manifest) took the C++ loader 90 s, 64 MB would take a day. It refuses it at once."""
    root = tmp_path / "bundle"
    shutil.copytree(built_bundle, root)
    raw = (root / "manifest.json").read_bytes()
    keys = b"{" + b",".join(b'"k%d":1' % i for i in range(200_000)) + b"}"
    (root / "manifest.json").write_bytes(raw.replace(b"{", b'{"zz": ' + keys + b",", 1))
    proc = _bounded(cpp, "verify", root)  # 60 s
    assert proc.stderr.startswith(f"topkgen-cpp: error: {root}/manifest.json: zz: unknown key 'zz' (allowed: ")


def test_many_archs_and_kernels_are_checked_in_linear_time(cpp, built_bundle, tmp_path):
    """Each kernel's arch was looked up in the list of archs (and each table's arch too): a
    forged manifest of 600,000 archs and 10,000 kernels (14 MB) took `show` minutes and the C++
    loader half a minute; 64 MB would take an hour. Both look archs up in a set (~10 s here,
    25 s on a loaded machine; the list took over 2 minutes)."""
    root = tmp_path / "bundle"
    shutil.copytree(built_bundle, root)
    doc = json.loads((root / "manifest.json").read_text())
    doc["archs"] = [f"sm_{1000 + i}" for i in range(600_000)] + ["sm_100", "sm_90"]
    kernel = next(e for e in doc["kernels"] if e["arch"] == "sm_90")
    doc["kernels"][:0] = [{**kernel, "name": f"topk_x{i}", "symbol": f"topk_x{i}", "cubin": f"sm_90/topk_x{i}.cubin"}
                          for i in range(10_000)]
    (root / "manifest.json").write_text(json.dumps(doc, separators=(",", ":")))
    expected = f"{root}/manifest.json: dispatch: no table for sm_1000\n"
    python = subprocess.run([sys.executable, "-m", "topkgen", "show", root], capture_output=True, text=True, timeout=60)
    assert (python.returncode, python.stderr) == (2, f"topkgen: error: {expected}")
    assert _bounded(cpp, "verify", root).stderr == f"topkgen-cpp: error: {expected}"


def _closed_objects(value, node: dict, schema: dict, path: tuple = (), seen: set | None = None) -> list[tuple]:
    """The path of the first object of the manifest under each schema node that allows no
    other keys (additionalProperties: false)."""
    seen = set() if seen is None else seen
    while "$ref" in node:
        node = _resolve(node["$ref"], schema)
    found = []
    if isinstance(value, dict):
        if node.get("additionalProperties") is False and id(node) not in seen:
            seen.add(id(node))
            found.append(path)
        extra = node.get("additionalProperties")
        for key, item in value.items():
            sub = node.get("properties", {}).get(key, extra if isinstance(extra, dict) else None)
            if sub is not None:
                found += _closed_objects(item, sub, schema, path + (key,), seen)
    elif isinstance(value, list) and "items" in node:
        for i, item in enumerate(value[:2]):
            found += _closed_objects(item, node["items"], schema, path + (i,), seen)
    return found


def test_both_loaders_refuse_an_unknown_key_in_every_object_the_schema_closes(cpp, built_bundle, tmp_path):
    schema = load_schema("manifest.schema.json")
    root = tmp_path / "bundle"
    shutil.copytree(built_bundle, root)
    doc = json.loads((root / "manifest.json").read_text())
    paths = _closed_objects(doc, schema, schema)
    assert len(paths) >= 15, paths  # the document, generator, toolchain, ..., a dispatch row
    print(f"{len(paths)} closed objects: {', '.join(format_path(p) for p in paths)}")
    for path in paths:
        (root / "manifest.json").write_bytes(_set(path + ("zz",), 1)(json.dumps(doc).encode()))
        got = _both_refuse(cpp, root)
        assert got.startswith(f": {format_path(path + ('zz',))}: unknown key 'zz' (allowed: "), got


MUTANTS = [0, -1, 3.0, 2.5, True, None, "", "x", "a'b", "\u00a0", [], {}, [1, 2], [1, 2, 3], 2**63, -2**63, 2**64 - 1,
           1e30, "sm_90", "topk_x", "float32", "fast", "jit", "0" * 64, 1024, 1025, 232449]


def test_both_loaders_refuse_random_mutations_alike(cpp, built_bundle, tmp_path):
    """One value of the manifest replaced, removed or given a sibling key, 30 times (seeded):
    both loaders serve the bundle, or refuse it with the same message."""
    rng = random.Random(3)
    root = tmp_path / "bundle"
    shutil.copytree(built_bundle, root)
    base = json.loads((root / "manifest.json").read_text())

    def paths(node, path=()):
        yield path
        children = node.items() if isinstance(node, dict) else enumerate(node[:2]) if isinstance(node, list) else ()
        for key, item in children:
            if path != () or key != "dispatch" or rng.random() < 0.2:
                yield from paths(item, path + (key,))

    candidates = list(paths(base))[1:]
    outcomes = []
    for _ in range(30):
        doc, path = copy.deepcopy(base), rng.choice(candidates)
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        kind = rng.random()
        if kind < 0.15 and isinstance(parent, dict):
            del parent[path[-1]]
        elif kind < 0.25 and isinstance(parent, dict):
            parent["zz"] = 1
        else:
            parent[path[-1]] = copy.deepcopy(rng.choice(MUTANTS))
        (root / "manifest.json").write_text(json.dumps(doc, indent=1))
        try:
            manifest, top = manifests.load_manifest(root)
            manifests.read_files(top, manifest)
            python = "served"
        except manifests.ManifestError as err:
            python = str(err)
        proc = subprocess.run([cpp, "verify", root], capture_output=True, text=True)
        native = "served" if proc.returncode == 0 else proc.stderr.removeprefix("topkgen-cpp: error: ").rstrip("\n")
        assert python == native, path
        outcomes.append(python)
    print("\n".join(outcomes))
    assert sum(o != "served" for o in outcomes) >= 20  # most mutations break the bundle


def test_the_cpp_loader_embeds_the_shipped_schema():
    """loaders/cpp/include/topkgen/manifest_schema.hpp is generated from the schema: run
    scripts/embed_manifest_schema.py after changing it."""
    spec = importlib.util.spec_from_file_location("embed", ROOT / "scripts" / "embed_manifest_schema.py")
    embed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(embed)
    assert embed.HEADER.read_text(encoding="utf-8") == embed.header_text()


def test_dynamic_shared_memory_is_bounded_by_the_largest_arch_limit():
    launch = load_schema("manifest.schema.json")["$defs"]["launch"]["properties"]["dynamic_shared_bytes"]
    assert launch["maximum"] == max(pol.SHARED_BYTES_PER_BLOCK.values())
    header = (ROOT / "loaders" / "cpp" / "include" / "topkgen" / "loader.hpp").read_text()
    assert f"DYNAMIC_SHARED_MAX = {launch['maximum']};" in header


# ----------------------------------------------------------------------------- files that are not regular files

def _bounded(*cmd) -> subprocess.CompletedProcess:
    """A loader in a child limited in time and to 2 GiB of address space: an endless or
    blocking file must fail the test, not hang it or the machine."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    return subprocess.run(list(map(str, cmd)), capture_output=True, text=True, timeout=60, preexec_fn=limit)


def _first(root: Path, key: str, arch: str) -> tuple[str, dict]:
    """The first entry of `key` (kernels, jit_kernels) of `arch`, as the loaders meet it."""
    doc = json.loads((root / "manifest.json").read_text())
    i = next(j for j, e in enumerate(doc[key]) if e["arch"] == arch)
    return f"{key}[{i}]", doc[key][i]


def _outside(root: Path, rel: str) -> None:
    """Move `rel` out of the bundle and leave a symbolic link to it in its place."""
    target = root.parent / f"outside-{rel.replace('/', '-')}"
    os.rename(root / rel, target)
    os.symlink(target, root / rel)


def _in_bundle_link(root: Path, rel: str) -> None:
    os.rename(root / rel, root / f"{rel}.real")
    os.symlink(Path(rel).name + ".real", root / rel)


def _replace(root: Path, rel: str, make) -> None:
    os.unlink(root / rel)
    make(root / rel)


def _huge(path: Path) -> None:
    with open(path, "wb") as f:
        f.truncate(manifests.MAX_FILE_BYTES + 1)  # sparse: nothing is written


CUBIN, SOURCE = "{cubin}", "{source}"
# case -> (what is done to which path, the refusal after "FILE: ")
SPECIAL_FILES = {
    "cubin linked to /dev/zero": (lambda r, p: _replace(r, p, lambda q: os.symlink("/dev/zero", q)), CUBIN,
                                  "{k}.cubin: cannot read {cubin}: it is a symbolic link; a bundle holds none"),
    "cubin linked out of the bundle": (_outside, CUBIN,
                                       "{k}.cubin: cannot read {cubin}: it is a symbolic link; a bundle holds none"),
    "cubin linked within the bundle": (_in_bundle_link, CUBIN,
                                       "{k}.cubin: cannot read {cubin}: it is a symbolic link; a bundle holds none"),
    "arch directory linked out": (_outside, "sm_90",
                                  "{k}.cubin: cannot read {cubin}: sm_90 is a symbolic link; a bundle holds none"),
    "jit directory linked out": (_outside, "jit",
                                 "{j}.source: cannot read {source}: jit is a symbolic link; a bundle holds none"),
    "manifest linked out": (_outside, "manifest.json", "cannot read manifest: it is a symbolic link; a bundle holds none"),
    "cubin a FIFO": (lambda r, p: _replace(r, p, os.mkfifo), CUBIN,
                     "{k}.cubin: cannot read {cubin}: it is a FIFO, not a regular file"),
    "manifest a FIFO": (lambda r, p: _replace(r, p, os.mkfifo), "manifest.json",
                        "cannot read manifest: it is a FIFO, not a regular file"),
    "arch directory a file": (lambda r, p: (shutil.rmtree(r / p), (r / p).write_bytes(b"")), "sm_90",
                              "{k}.cubin: cannot read {cubin}: sm_90 is a regular file, not a directory"),
    "cubin larger than the bound": (lambda r, p: _replace(r, p, _huge), CUBIN,
                                    "{k}.cubin: cannot read {cubin}: it is larger than 67108864 bytes"),
}


@pytest.mark.parametrize("case", sorted(SPECIAL_FILES))
def test_both_loaders_refuse_what_is_not_a_regular_file_of_the_bundle(cpp, built_bundle, tmp_path, case):
    """A bundle is directories and regular files (the schema's load check 3): a link, even
    one that stays inside, a FIFO or an endless file is refused, in bounded time
    and memory, with the same message by `show` and the C++ loader."""
    mutate, target, message = SPECIAL_FILES[case]
    root = tmp_path / "bundle"
    shutil.copytree(built_bundle, root)
    k, kernel = _first(root, "kernels", "sm_90")
    j, jit = _first(root, "jit_kernels", "sm_90")
    mutate(root, target.format(cubin=kernel["cubin"], source=jit["source"]))
    expected = f"{root}/manifest.json: " + message.format(k=k, j=j, cubin=kernel["cubin"], source=jit["source"])
    python = _bounded(sys.executable, "-m", "topkgen", "show", root)
    native = _bounded(cpp, "verify", root)
    print(f"{case}:\n  Python: {python.stderr.strip()}\n  C++:    {native.stderr.strip()}")
    assert (python.returncode, python.stderr) == (2, f"topkgen: error: {expected}\n")
    assert (native.returncode, native.stderr) == (2, f"topkgen-cpp: error: {expected}\n")


def test_a_fifo_manifest_stops_no_command(built_bundle, tmp_path):
    """`diff` and `run` read manifests through the same function as `show`."""
    root = tmp_path / "bundle"
    shutil.copytree(built_bundle, root)
    _replace(root, "manifest.json", os.mkfifo)
    np = pytest.importorskip("numpy")
    np.save(tmp_path / "x.npy", np.zeros((1, 64), np.float32))
    expected = f"topkgen: error: {root}/manifest.json: cannot read manifest: it is a FIFO, not a regular file\n"
    for args in (["diff", root, built_bundle], ["run", "--bundle", root, "--backend", "emulator", "--arch", "sm_90",
                                                "--k", "4", tmp_path / "x.npy"]):
        proc = _bounded(sys.executable, "-m", "topkgen", *args)
        assert (proc.returncode, proc.stderr) == (2, expected), args


def test_a_bundle_reached_through_a_link_is_served(cpp, built_bundle, tmp_path):
    """Only what is inside the bundle must not be a link: the directory itself may be one."""
    os.symlink(built_bundle, tmp_path / "link")
    assert _bounded(sys.executable, "-m", "topkgen", "show", tmp_path / "link").returncode == 0
    assert _bounded(cpp, "verify", tmp_path / "link").returncode == 0


def _python_outcome(given: str) -> str:
    """What `show` does with a bundle argument: "served", or the refusal."""
    try:
        manifest, top = manifests.load_manifest(given)
        manifests.read_files(top, manifest)
    except manifests.ManifestError as err:
        return str(err)
    return "served"


@pytest.mark.parametrize("given", ["{b}/", "{b}//", "{b}/.", "{t}//./{n}", "{n}", "{b}/manifest.json",
                                   "{n}/manifest.json", ".", "{b}/sm_90", "{t}/missing", "x" * 300, "/a" * 3000],
                         ids=lambda g: g[:20])
def test_both_loaders_read_and_name_a_bundle_however_it_is_given(cpp, built_bundle, monkeypatch, given):
    """A bundle's directory or its manifest file, spelled as a user may spell it: both loaders
    serve it, or refuse it naming the manifest as pathlib spells it ('//' and '.' parts
    dropped; a path that is no directory is the manifest itself). The C++ loader took every
    argument for a directory and named it as given ('./manifest.json', 'missing/manifest.json');
    a name too long to look up was an internal error in Python."""
    monkeypatch.chdir(built_bundle.parent)
    arg = given.format(b=built_bundle, t=built_bundle.parent, n=built_bundle.name)
    proc = subprocess.run([cpp, "verify", arg], capture_output=True, text=True)
    native = "served" if proc.returncode == 0 else proc.stderr.removeprefix("topkgen-cpp: error: ").rstrip("\n")
    assert proc.returncode in (0, 2) and proc.stderr.count("\n") == (proc.returncode == 2)
    assert _python_outcome(arg) == native
    if len(arg) > 255:
        cli = subprocess.run([sys.executable, "-m", "topkgen", "show", arg], capture_output=True, text=True)
        assert (cli.returncode, cli.stderr) == (2, f"topkgen: error: {native}\n")
    print(f"{given[:40]!r}: {native[:120]}")


# ----------------------------------------------------------------------------- under sanitizers

@pytest.fixture(scope="session")
def cpp_sanitized(tmp_path_factory) -> Path:
    """topkgen-cpp built with AddressSanitizer and UBSan, any report fatal (-O0: ~15 s of g++)."""
    out = tmp_path_factory.mktemp("sanitized") / "topkgen-cpp"
    proc = subprocess.run(["g++", *loader_flags(), "-O0", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                           "-fno-omit-frame-pointer", ROOT / "loaders/cpp/src/topkgen_cpp.cpp", "-o", out, "-lcrypto",
                           "-ldl"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


def _cubin_edit(edit):
    """A cubin edited in place by edit(data, section headers), its sha256 fixed in the manifest."""
    def mutate(doc: dict, root: Path, i: int) -> None:
        import hashlib
        import struct

        path = root / doc["kernels"][i]["cubin"]
        data = bytearray(path.read_bytes())
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
        data = edit(data, [shoff + j * shentsize for j in range(shnum)])
        path.write_bytes(bytes(data))
        doc["kernels"][i]["sha256"] = hashlib.sha256(data).hexdigest()
    return mutate


def _every_symbol_name_beyond(data: bytearray, headers: list[int]) -> bytearray:
    import struct

    for h in headers:
        if struct.unpack_from("<I", data, h + 4)[0] == 2:  # SHT_SYMTAB
            offset, size = struct.unpack_from("<QQ", data, h + 24)
            for at in range(offset, offset + size, 24):
                struct.pack_into("<I", data, at, 0xFFFFFFFF)
    return data


HOSTILE = {  # case -> a tampering of (doc, root, i)
    "symbol table beyond the file": _symbol_table_outside,
    "cubin cut to its ELF header": _cubin_edit(lambda d, h: d[:64]),
    "section headers at 2^64 - 1": _cubin_edit(lambda d, h: d[:0x28] + b"\xff" * 8 + d[0x30:]),
    "every symbol name beyond the string table": _cubin_edit(_every_symbol_name_beyond),
    "a 1 MiB kernel name": lambda doc, root, i: doc["kernels"][i].update(name="a" * (1 << 20)),
    "nested 33 deep": lambda doc, root, i: doc["kernels"][i].update(k=functools.reduce(lambda v, _: [v], range(33), 1)),
    "2^64 in a dispatch row": lambda doc, root, i: doc["dispatch"]["sm_90"]["float32"]["fast"][0].update(chunks=2**64),
}


def test_the_loader_under_sanitizers_serves_and_refuses_cleanly(cpp_sanitized, built_bundle, default_policy, tmp_path):
    """The C++ loader built with ASan and UBSan: it serves the bundle and shapes at the edges
    of the domain as select does, and refuses forged cubins (offsets beyond the file, cut
    short) and hostile JSON with Python's message; no sanitizer report, one error line."""
    def run(*args, stdin: str = "") -> subprocess.CompletedProcess:
        return subprocess.run([cpp_sanitized, *args], input=stdin, capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, ASAN_OPTIONS="detect_leaks=1", UBSAN_OPTIONS="print_stacktrace=1"))

    assert run("verify", built_bundle).returncode == 0
    shapes = [("sm_90", "float32", k, n, False, True, rows) for k, n, rows in
              [(0, 10, 1), (1, 1, 1), (1024, 2**31 - 1, 2**31 - 1), (1, 2**31, 1), (8, 10**6, 2**31), (8, 10**6, -1),
               (-2**63, 2**63 - 1, 0), (1025, 1025, 1), (1, 10**6, 3), (512, 10**7, 2**20)]]
    assert cpp_select(cpp_sanitized, built_bundle, shapes) == [python_select(default_policy, s) for s in shapes]
    proc = run("select", built_bundle, stdin="sm_90 float32 8 9223372036854775808 fast 1\n")
    assert proc.returncode == 2 and proc.stderr.startswith("topkgen-cpp: error: stdin:1: ") and proc.stderr.count("\n") == 1
    for case, mutate in HOSTILE.items():
        root, _ = _tampered_copy(built_bundle, tmp_path / case.replace(" ", "-"), mutate)
        with pytest.raises(manifests.ManifestError) as err:
            manifest, top = manifests.load_manifest(root)
            manifests.read_files(top, manifest)
        proc = run("verify", root)
        print(f"{case}: {proc.stderr.strip()[:160]}")
        assert (proc.returncode, proc.stderr) == (2, f"topkgen-cpp: error: {err.value}\n"), case
    raw = (built_bundle / "manifest.json").read_bytes()
    for case, (change, _, _) in SYNTAX_CASES.items():  # offsets worked out from what nlohmann read: in bounds
        (root / "manifest.json").write_bytes(change(raw))
        with pytest.raises(manifests.ManifestError) as err:
            manifests.load_manifest(root)
        assert run("verify", root).stderr == f"topkgen-cpp: error: {err.value}\n", case


# ----------------------------------------------------------------------------- driver

def test_the_driver_declarations_agree_with_cuda_h(cpp, tmp_path):
    """loader.hpp declares the few driver types and constants it needs instead of including
    cuda.h; the cuda.h of the nvidia-cuda-runtime wheel must agree with them."""
    from topkgen.common.paths import cuda_include_dir

    probe = tmp_path / "probe.cpp"
    probe.write_text("""
#include <cuda.h>
#include <topkgen/loader.hpp>
#include <type_traits>
static_assert(std::is_same_v<topkgen::cu::Stream, CUstream>);
static_assert(std::is_same_v<topkgen::cu::Context, CUcontext>);
static_assert(std::is_same_v<topkgen::cu::Module, CUmodule>);
static_assert(std::is_same_v<topkgen::cu::Function, CUfunction>);
static_assert(std::is_same_v<topkgen::cu::DevicePtr, CUdeviceptr>);
static_assert(std::is_same_v<topkgen::cu::Device, CUdevice>);
static_assert(topkgen::cu::FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
static_assert(topkgen::cu::DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
static_assert(topkgen::cu::DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
static_assert(topkgen::cu::DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
static_assert(topkgen::cu::SUCCESS == CUDA_SUCCESS);
static_assert(sizeof(CUresult) == sizeof(topkgen::cu::Result));  // an enum in cuda.h, returned as int
int main() {}
""")
    proc = subprocess.run(["g++", *loader_flags(), "-fsyntax-only", f"-I{cuda_include_dir()}", str(probe)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_run_refuses_a_plan_made_for_another_batch_a_misaligned_workspace_and_shared_memory(cpp, built_bundle,
                                                                                            tmp_path):
    """A Plan's chunk and workspace size are its request's; buffers that overlap would race
    (the Python runtime refuses them alike). run() checks before touching the driver (so this
    runs without a GPU)."""
    probe = tmp_path / "run_checks.cpp"
    probe.write_text("""
#include <topkgen/loader.hpp>
#include <cstdio>
int main(int, char** argv) {
  topkgen::Bundle b(argv[1]);
  const topkgen::Plan p = b.plan("sm_90", "float32", 256, 131072, 1, false, false);
  std::printf("chunks %lld\\n", static_cast<long long>(p.chunks));
  // x: 1 x 131072 floats (512 KiB) at 1 MiB; values 1 KiB, indices 2 KiB; the workspace p.workspace_bytes
  const unsigned long long x = 1 << 20, v = 4 << 20, i = 5 << 20, w = 6 << 20;
  struct Case { int rows; unsigned long long x, v, i, w; };
  for (const Case& c : {Case{4, x, v, i, w}, Case{1, x, v, i, w + 1}, Case{1, x, x + 4096, i, w},
                        Case{1, x, v, v + 512, w}, Case{1, x, v, i, x + (256 << 10)}, Case{1, x, v, i, i},
                        Case{1, ~0ull - 4095, ~0ull - 2047, i, w}}) {  // x's end past 2^64: no wrap-around
    try {
      b.run(p, nullptr, c.x, c.v, c.i, c.rows, 131072, 256, true, c.w);
    } catch (const topkgen::Error& e) {
      std::printf("%s\\n", e.what());
    }
  }
}
""")
    exe = tmp_path / "run_checks"
    subprocess.run(["g++", *loader_flags(), "-O1", str(probe), "-o", str(exe), "-lcrypto", "-ldl"], check=True,
                   capture_output=True)
    out = subprocess.run([exe, built_bundle], capture_output=True, text=True, check=True).stdout.splitlines()
    shared = "{a}: shares memory with {b}; the kernels write {a} while they read or write {b}: pass separate arrays"
    assert out == ["chunks 32", "plan: made for rows=1 n=131072 k=256, run with rows=4 n=131072 k=256",
                   "workspace: must start at a multiple of 16 bytes",  # then only one pair overlaps in each:
                   shared.format(a="values", b="x"), shared.format(a="indices", b="values"),
                   shared.format(a="workspace", b="x"), shared.format(a="workspace", b="indices"),
                   shared.format(a="values", b="x")]


def test_cpp_select_reads_rows_as_select_does(cpp, built_bundle, default_policy):
    """A ROWS of 0, an empty batch, is served unsplit with no workspace (as select serves it;
    plan once refused it), one below 0 refused with select's reason; a line whose K, N or ROWS
    is not a whole 64-bit integer, or whose JIT is not 0 or 1, is a malformed line."""
    shapes = [("sm_90", "float32", 8, 1000, False, True, rows) for rows in (0, -5, 4)]
    got = cpp_select(cpp, built_bundle, shapes)
    assert got == [python_select(default_policy, s) for s in shapes]
    assert got[:2] == ["topk_register_ladder_k16_det_f32_sm_90 1 0 0 [0]", "error: rows: must be >= 0, got -5"]
    for line in ("sm_90 float32 8 1000 fast 1 abc", "sm_90 float32 8 1000 fast 1 4x", "sm_90 float32 8 1000 fast 1 4 5",
                 # were served: JIT 2 as JIT on, "1000fast" as n=1000 and fast, "+8" as 8
                 "sm_90 float32 8 1000 fast 2", "sm_90 float32 8 1000fast 1", "sm_90 float32 +8 1000 fast 1",
                 "sm_90 float32 8 1000 fast 1 9223372036854775808"):
        proc = subprocess.run([cpp, "select", built_bundle], input=line + "\n", capture_output=True, text=True)
        assert (proc.returncode, proc.stdout) == (2, ""), line
        assert proc.stderr == f"topkgen-cpp: error: stdin:1: expected 'ARCH DTYPE K N MODE JIT [ROWS]', got '{line}'\n"


def test_cpp_select_shows_what_stdin_said_escaped(cpp, built_bundle):
    """A line's bytes went to the terminal as they came: an escape sequence acted, a NUL cut
    the message short (no closing quote), a bidirectional override reordered it. Control
    bytes and bytes beyond ASCII are shown as \\xNN, a tab as \\t, in a malformed line's
    echo and in an answer's error quoting the line's ARCH."""
    for line, echo in (("sm_90 \x1b[2J x", "sm_90 \\x1b[2J x"), ("sm_90 float32 8 1000 fast 1\0",
                                                                  "sm_90 float32 8 1000 fast 1\\x00"),
                       ("sm_90\tfloat32 8", "sm_90\\tfloat32 8")):
        proc = subprocess.run([cpp, "select", built_bundle], input=(line + "\n").encode(), capture_output=True)
        assert (proc.returncode, proc.stdout) == (2, b""), line
        expected = f"topkgen-cpp: error: stdin:1: expected 'ARCH DTYPE K N MODE JIT [ROWS]', got '{echo}'\n"
        assert proc.stderr == expected.encode()
    proc = subprocess.run([cpp, "select", built_bundle], input="sm_9\u202e0 float32 8 1000 fast 1\n".encode(),
                          capture_output=True)
    assert proc.returncode == 1  # refused
    assert proc.stdout == b"error: arch: 'sm_9\\xe2\\x80\\xae0' is not in the bundle (known: sm_100, sm_90)\n"


def test_cpp_select_answers_line_by_line_and_names_a_bad_line(cpp, built_bundle, default_policy):
    """select read all of stdin first: a bad line dropped the answers to every line before it
    and the error named no line. Each answer now comes (flushed) before the next line is read,
    and the error names stdin:LINE, blank lines counted, as topkgen's workload files do."""
    good = ("sm_90", "float32", 8, 1000, False, True)
    proc = subprocess.run([cpp, "select", built_bundle], capture_output=True, text=True,
                          input="sm_90 float32 8 1000 fast 1\n\nsm_90 float32 8 1000 fast 1 4\nsm_90 float32 8\n"
                                "sm_90 float32 8 1000 fast 1\n")
    assert proc.returncode == 2
    assert proc.stdout.splitlines() == [python_select(default_policy, good), python_select(default_policy, (*good, 4))]
    assert proc.stderr == "topkgen-cpp: error: stdin:4: expected 'ARCH DTYPE K N MODE JIT [ROWS]', got 'sm_90 float32 8'\n"
    # Answered while stdin is still open: a caller on a pipe reads each answer before writing the next line.
    with subprocess.Popen([cpp, "select", built_bundle], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as live:
        try:
            for rows in (None, 4):
                live.stdin.write("sm_90 float32 8 1000 fast 1" + ("" if rows is None else f" {rows}") + "\n")
                live.stdin.flush()
                ready, _, _ = select.select([live.stdout], [], [], 30)
                assert ready, "no answer while stdin is open"
                assert live.stdout.readline() == python_select(default_policy, (*good, rows)) + "\n"
        finally:
            live.stdin.close()
        assert live.wait(timeout=30) == 0 and live.stdout.read() == ""


def _driver_loads() -> bool:
    """Whether libcuda.so.1 loads here, as the C++ loader's dlopen would find it (any path)."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_driver_loads(), reason="a CUDA driver is installed here")
def test_launch_without_a_driver_says_so(cpp, built_bundle, tmp_path):
    x = tmp_path / "x.bin"
    x.write_bytes(bytes(4 * 3 * 300))
    proc = subprocess.run([cpp, "launch", built_bundle, "sm_90", "float32", "10", "300", "3", "fast", "0", "1", x,
                           tmp_path / "v.bin", tmp_path / "i.bin"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.startswith("topkgen-cpp: error: the CUDA driver is not available: libcuda.so.1")
    assert not (tmp_path / "v.bin").exists()


@pytest.mark.parametrize("rows, largest, message", [
    ("abc", "1", "launch: expected ARCH DTYPE K N ROWS MODE JIT as whole numbers and names, got "
                 "'sm_90 float32 10 300 abc fast 0'"),  # was "error: stoi"
    ("3x", "1", "launch: expected ARCH DTYPE K N ROWS MODE JIT as whole numbers and names, got "
                "'sm_90 float32 10 300 3x fast 0'"),  # was read as 3
    ("99999999999", "1", "rows: must be <= 2147483647, got 99999999999"),  # was "error: stoi"
    ("-1", "1", "rows: must be >= 0, got -1"),
    ("3", "2", "launch: LARGEST must be 0 or 1, got '2'"),
])
def test_launch_reads_its_arguments_whole_before_the_driver(cpp, built_bundle, tmp_path, rows, largest, message):
    x = tmp_path / "x.bin"
    x.write_bytes(bytes(4 * 3 * 300))
    proc = subprocess.run([cpp, "launch", built_bundle, "sm_90", "float32", "10", "300", rows, "fast", "0", largest, x,
                           tmp_path / "v.bin", tmp_path / "i.bin"], capture_output=True, text=True)
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", f"topkgen-cpp: error: {message}\n")


@pytest.mark.parametrize("windows, message", [
    ((8 * 2,), "L.bin: expected 24 bytes (ROWS int64 lengths), got 16"),
    ((8 * 3, 4 * 3), "S.bin: expected 24 bytes (ROWS int64 starts), got 12"),
])
def test_launch_reads_a_ragged_batchs_windows_before_the_driver(cpp, built_bundle, tmp_path, windows, message):
    """topkgen-cpp launch ... [LENGTHS [STARTS]]: ROWS int64 each, their sizes checked before
    the driver is asked for anything (the launch itself needs a GPU: tests/runtime/test_gpu.py)."""
    x = tmp_path / "x.bin"
    x.write_bytes(bytes(4 * 3 * 300))
    files = []
    for name, size in zip(("L.bin", "S.bin"), windows):
        (tmp_path / name).write_bytes(bytes(size))
        files.append(tmp_path / name)
    proc = subprocess.run([cpp, "launch", built_bundle, "sm_90", "float32", "10", "300", "3", "fast", "0", "1", x,
                           tmp_path / "v.bin", tmp_path / "i.bin", *files], capture_output=True, text=True)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert proc.stderr.startswith("topkgen-cpp: error: ") and proc.stderr.rstrip().endswith(message), proc.stderr
    assert not (tmp_path / "v.bin").exists()


def test_launch_of_an_empty_batch_writes_empty_outputs_without_the_driver(cpp, built_bundle, tmp_path):
    """ROWS 0 is a valid call that launches nothing, in topkgen-cpp as in TopK: no driver."""
    x = tmp_path / "x.bin"
    x.write_bytes(b"")
    proc = subprocess.run([cpp, "launch", built_bundle, "sm_90", "float32", "256", "131072", "0", "fast", "0", "1", x,
                           tmp_path / "v.bin", tmp_path / "i.bin"], capture_output=True, text=True)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "topk_radix_dyn_k256_fast_f32_sm_90 1\n", "")
    assert (tmp_path / "v.bin").read_bytes() == (tmp_path / "i.bin").read_bytes() == b""


def test_gpu_check_launches_every_aot_kernel_through_both_loaders(cpp, built_bundle, gpu_check, monkeypatch):
    """scripts/gpu_check.py's C++-against-Python step (it needs a GPU): its cases reach every
    AOT kernel, and both loaders pick that kernel for the case's shape with JIT off."""
    manifest = json.loads((built_bundle / "manifest.json").read_text())
    monkeypatch.setenv("TOPKGEN_DISABLE_JIT", "1")
    for arch in ("sm_90", "sm_100"):
        cases = gpu_check.aot_launch_cases(manifest, arch)
        assert [c[0] for c in cases] == [e["name"] for e in manifest["kernels"] if e["arch"] == arch]
        op = TopK(built_bundle, arch=arch, backend="emulator")
        assert [op.choose(dtype, k, n, det).kernel for _, dtype, k, n, det in cases] == [c[0] for c in cases]
        shapes = [(arch, dtype, k, n, det, False) for _, dtype, k, n, det in cases]
        assert cpp_select(cpp, built_bundle, shapes) == [c[0] for c in cases]


def test_both_loaders_refuse_a_schema_3_manifest_by_its_version(cpp, built_bundle, tmp_path):
    """Schema 4 (issue 29) serves k up to n and has `options`; a schema-3 bundle, whose table
    stops at k = 1024, is refused by its version, in the same words, before anything else."""
    root = tmp_path / "bundle"
    shutil.copytree(built_bundle, root)
    doc = json.loads((root / "manifest.json").read_text())
    doc["schema_version"] = 3
    del doc["options"]
    (root / "manifest.json").write_text(json.dumps(doc))
    assert _both_refuse(cpp, root) == (": schema_version: 3 stops k at 1024 and has no options (sorted, "
                                       "index_dtype); rebuild the bundle (topkgen build)")


def test_both_loaders_refuse_a_schema_4_manifest_by_its_version(cpp, built_bundle, tmp_path):
    """Schema 5 passes the output flags to the kernels (issue 29) and adds split_rules and
    load_order (issues 31, 32); a schema-4 bundle, whose kernels always sort and write int64, is
    refused by its version, in the same words, before anything else."""
    from topkgen.manifest.params import OUTPUT_FLAGS

    root = tmp_path / "bundle"
    shutil.copytree(built_bundle, root)
    doc = json.loads((root / "manifest.json").read_text())
    assert doc["options"]["flags"] == OUTPUT_FLAGS
    doc["schema_version"] = 4
    del doc["split_rules"], doc["load_order"]
    (root / "manifest.json").write_text(json.dumps(doc))
    assert _both_refuse(cpp, root) == (": schema_version: 4 has no output flags, ragged-batch parameters, "
                                       "split_rules or load_order (its kernels always sort, write int64 indices and "
                                       "read dense rows; a split for the GPU's SM count, which binary serves a GPU); "
                                       "rebuild the bundle (topkgen build)")


def test_both_loaders_refuse_a_schema_5_manifest_by_its_version(cpp, built_bundle, tmp_path):
    """Schema 6 sizes each radix launch's shared memory to its row and passes it to the kernel
    (issue 28); a schema-5 bundle, whose kernels take no shared_bytes, is refused by its version,
    in the same words, before anything else."""
    root = tmp_path / "bundle"
    shutil.copytree(built_bundle, root)
    doc = json.loads((root / "manifest.json").read_text())
    doc["schema_version"] = 5
    for entry in doc["kernels"] + doc["jit_kernels"]:
        del entry["launch"]["shared_buffer_bytes"], entry["launch"]["shared_bytes"]
    (root / "manifest.json").write_text(json.dumps(doc))
    assert _both_refuse(cpp, root) == (": schema_version: 5 launches every radix kernel with all of its dynamic "
                                       "shared memory and has no shared_bytes parameter (its kernels size nothing to "
                                       "the row); rebuild the bundle (topkgen build)")


def test_both_loaders_refuse_a_schema_6_manifest_by_its_version(cpp, built_bundle, tmp_path):
    """Schema 7 adds a split in one launch (tickets, merged_*: issue 28); a schema-6 bundle is
    refused by its version, in the same words, before anything else."""
    root = tmp_path / "bundle"
    shutil.copytree(built_bundle, root)
    doc = json.loads((root / "manifest.json").read_text())
    doc["schema_version"] = 6
    (root / "manifest.json").write_text(json.dumps(doc))
    assert _both_refuse(cpp, root) == (": schema_version: 6 has no tickets or merged_* parameters (a split always "
                                       "takes two launches); rebuild the bundle (topkgen build)")


def test_the_cpp_loader_serves_a_one_launch_bundle_as_two_launches(cpp, one_launch_bundle):
    """A kernel that merges (schema 7) lists tickets, merged_values, merged_indices and
    merged_flags: loaders/cpp loads the bundle (its load checks know their C types) and plans
    its splits as two launches (it passes null tickets): the workspace of the candidates
    alone, and each launch's shared memory, as the Python planner gives two launches."""
    from dataclasses import replace

    from topkgen.policy.split import stages

    policy = pol.load(one_launch_bundle.parent / "policy.yaml")
    rows, n, k = 4, 262144, 16
    sel = pol.select(policy, "sm_90", "float32", k, n, rows=rows)
    assert sel.kernel.merges and sel.split is not None and sel.split.one_launch
    two = replace(sel.split, one_launch=False)
    shared = ",".join(str(stage.shared_bytes) for stage in stages(rows, n, k, True, two, shared=sel.kernel.shared))
    assert shared.count(",") == 1 and two.workspace_bytes < sel.split.workspace_bytes
    assert cpp_select(cpp, one_launch_bundle, [("sm_90", "float32", k, n, False, False, rows),
                                               ("sm_90", "float32", k, 5000, False, False, rows)]) == [
        f"{sel.kernel.name} {two.chunks} {two.workspace_bytes} {two.values_offset} [{shared}]",
        python_select(policy, ("sm_90", "float32", k, 5000, False, False, rows))]


def test_every_kernel_takes_the_ragged_parameters_after_its_flags(built_bundle):
    """Schema 5 (issue 30) adds the ragged-batch parameters to every kernel's params, right
    after the output flags (issue 29), where both loaders pass them."""
    from topkgen.manifest.params import RAGGED_PARAMS

    for entry in json.loads((built_bundle / "manifest.json").read_text())["kernels"]:
        names = tuple(p["name"] for p in entry["params"])
        at = names.index("flags") + 1
        assert names[at:at + len(RAGGED_PARAMS)] == RAGGED_PARAMS, entry["name"]


def test_the_cpp_loader_serves_every_k(cpp, built_bundle):
    """k above 1024 dispatches to the JIT-only K=2048/4096 tier, above 4096 to the large-k path,
    as select says; without JIT nothing serves them."""
    lines = "sm_90 bfloat16 2048 163840 fast 1 1\nsm_90 float32 40000 163840 deterministic 1\n" \
            "sm_100 float16 4097 4097 fast 1\nsm_90 float32 2048 4096 fast 0\n"
    proc = subprocess.run([str(cpp), "select", str(built_bundle)], input=lines, capture_output=True, text=True,
                          timeout=60)
    out = proc.stdout.splitlines()
    assert out[0].startswith("topk_radix_dyn_k2048_fast_bf16_sm_90 4 "), out
    assert out[1] == "topk_radix_large_det_f32_sm_90", out
    assert out[2] == "topk_radix_large_fast_f16_sm_100", out
    assert "no kernel serves arch=sm_90 dtype=float32 k=2048 n=4096 mode=fast without JIT" in proc.stderr + proc.stdout


def test_the_cpp_loader_takes_the_request_options_as_the_runtime_does(cpp, built_bundle):
    """topkgen-cpp select --unsorted --index-dtype int32 plans what TopK plans: the flags the
    output launch gets (manifest options.flags) and the workspace (a split's, the large-k
    path's int32 scratch); an option it does not know is a usage error."""
    from topkgen.manifest.params import output_flags

    op = TopK(built_bundle, arch="sm_90", backend="emulator")
    shapes = [("float32", 5000, 20000, 3), ("float32", 256, 262144, 1), ("bfloat16", 256, 5000, 4)]
    lines = "".join(f"sm_90 {d} {k} {n} fast 1 {r}\n" for d, k, n, r in shapes)
    for options, sorted_, index_dtype in (([], True, "int64"), (["--unsorted"], False, "int64"),
                                          (["--index-dtype", "int32"], True, "int32"),
                                          (["--unsorted", "--index-dtype", "int32"], False, "int32")):
        proc = subprocess.run([str(cpp), "select", str(built_bundle), "--format", "json", *options], input=lines,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        for (dtype, k, n, rows), line in zip(shapes, proc.stdout.splitlines(), strict=True):
            got = json.loads(line)
            assert got["kernel"] == op.choose(dtype, k, n, rows=rows).kernel
            assert got.get("flags", 0) == output_flags(sorted_, index_dtype), (options, line)  # 0: not shown
            assert got["workspace_bytes"] == op.workspace_bytes(dtype, k, n, rows, index_dtype=index_dtype), line
    bad = subprocess.run([str(cpp), "select", str(built_bundle), "--index-dtype", "int16"], input=lines,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--index-dtype int64|int32" in bad.stderr


def test_launch_takes_the_request_options(cpp, built_bundle, tmp_path):
    """launch ... INDICES --unsorted --index-dtype int32 is read whole (then, here, stops at the
    missing driver); an option it does not know is a usage error, before the driver."""
    x = tmp_path / "x.bin"
    x.write_bytes(bytes(4 * 3 * 300))
    args = [cpp, "launch", built_bundle, "sm_90", "float32", "10", "300", "3", "fast", "0", "1", x,
            tmp_path / "v.bin", tmp_path / "i.bin"]
    proc = subprocess.run([*args, "--unsorted", "--index-dtype", "int32"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.startswith("topkgen-cpp: error: the CUDA driver is not available: libcuda.so.1")
    for bad in (["--index-dtype", "int16"], ["--index-dtype"], ["--sorted"]):
        proc = subprocess.run([*args, *bad], capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stderr.startswith("usage: topkgen-cpp"), bad
    assert not (tmp_path / "v.bin").exists()
