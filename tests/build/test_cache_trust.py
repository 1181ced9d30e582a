"""Issue 33, point 3: a poisoned cubin (other code under the same key, every other check
passed) was served from the local cache or a file:// remote, and copied from the remote into
the local cache; only `cache verify` noticed. Now `build --verify-cache P` recompiles a
sample and refuses a poisoned entry by name; `TOPKGEN_CACHE_PINS` (a trusted build's
`--provenance`) keeps unpinned or mismatched remote entries from serving or being copied, and
repairs a mismatched local one; `--provenance` says where each kernel came from, outside the
bundle."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from topkgen.build import cache, cache_trust

from ..support.commands import one_line_error, tree
from ..support.cubin_info import sections
from ..support.hostile import bounded_topkgen as topkgen
from ..support.tiny import TINY_POLICY


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> dict[str, Path]:
    """The tiny policy's bundle and provenance from the session's cache, and a private cache
    (import of that bundle) to copy and poison."""
    import os

    base = tmp_path_factory.mktemp("trust")
    (base / "tiny.yaml").write_text(TINY_POLICY)
    shared = Path(os.environ["TOPKGEN_CACHE_DIR"])
    proc = topkgen("build", "--policy", base / "tiny.yaml", "--out", base / "out", "--provenance",
                   base / "provenance.json", cache_dir=shared)
    assert proc.returncode == 0, proc.stderr
    proc = topkgen("cache", "import", base / "out", cache_dir=base / "cache")
    assert proc.returncode == 0, proc.stderr
    return {"policy": base / "tiny.yaml", "bundle": base / "out", "cache": base / "cache",
            "provenance": base / "provenance.json"}


def _poison(store: Path, provenance: Path) -> tuple[str, str]:
    """Replace the first kernel's cubin in `store` (a folder of ac/ and cas/) by one whose code
    differs in one byte, its record updated to match: sha256, ELF, symbol and .nv.info all
    pass. Returns the kernel's name and the poisoned cubin's sha256."""
    entry = json.loads(provenance.read_text())["kernels"][0]
    record_path = store / "ac" / f"{entry['key']}.json"
    record = json.loads(record_path.read_bytes())
    cubin = (store / "cas" / record["cubin_sha256"]).read_bytes()
    code = sections(cubin)[f".text.{record['symbol']}"][0]
    at = cubin.index(code) + len(code) // 2
    poisoned = cubin[:at] + bytes([cubin[at] ^ 0x5A]) + cubin[at + 1:]
    digest = hashlib.sha256(poisoned).hexdigest()
    (store / "cas" / digest).write_bytes(poisoned)
    record["cubin_sha256"], record["cubin_size"] = digest, len(poisoned)
    record_path.write_bytes(cache.record_bytes(record))
    return entry["name"], digest


def _local(cache_dir: Path) -> Path:
    return cache_dir / cache.LOCAL_DIR


def test_provenance_is_written_outside_the_bundle_and_names_each_kernels_origin(clean, tmp_path):
    document = json.loads(clean["provenance"].read_text())
    manifest = json.loads((clean["bundle"] / "manifest.json").read_text())
    assert document["format"] == cache_trust.PROVENANCE_FORMAT
    assert sorted(k["name"] for k in document["kernels"]) == sorted(k["name"] for k in manifest["kernels"])
    assert {k["origin"] for k in document["kernels"]} <= {"local", "remote", "compiled"}
    assert "provenance" not in json.dumps(manifest) and not list(clean["bundle"].glob("*provenance*"))
    proc = topkgen("build", "--policy", clean["policy"], "--out", tmp_path / "out", "--provenance",
                   tmp_path / "out" / "p.json", cache_dir=clean["cache"])
    one_line_error(proc, "--provenance: ", "is inside the bundle")


def test_a_poisoned_local_entry_is_served_without_verification_and_refused_with_it(clean, tmp_path):
    private = tmp_path / "cache"
    shutil.copytree(clean["cache"], private)
    name, _ = _poison(_local(private), clean["provenance"])
    served = topkgen("build", "--policy", clean["policy"], "--out", tmp_path / "served", cache_dir=private)
    assert served.returncode == 0 and "2 local hits" in served.stdout  # what README owns up to without the switch
    assert tree(tmp_path / "served") != tree(clean["bundle"])
    proc = topkgen("build", "--policy", clean["policy"], "--out", tmp_path / "out", "--verify-cache", "100",
                   cache_dir=private)
    one_line_error(proc, f"kernel {name} (sm_90): its cubin", "differs from a fresh compile", "no bundle written")
    assert not (tmp_path / "out").exists()


def test_a_poisoned_local_entry_against_the_pins_is_compiled_again_and_repaired(clean, tmp_path):
    private = tmp_path / "cache"
    shutil.copytree(clean["cache"], private)
    _poison(_local(private), clean["provenance"])
    env = {"TOPKGEN_CACHE_PINS": str(clean["provenance"])}
    proc = topkgen("build", "--policy", clean["policy"], "--out", tmp_path / "out", cache_dir=private, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "1 local hits, 0 remote hits, 1 compiled" in proc.stdout
    assert tree(tmp_path / "out") == tree(clean["bundle"])
    again = topkgen("build", "--policy", clean["policy"], "--out", tmp_path / "again", cache_dir=private, env=env)
    assert "2 local hits" in again.stdout, again.stdout  # repaired


def test_a_poisoned_remote_is_served_only_as_far_as_the_pins_say(clean, tmp_path):
    remote = tmp_path / "remote"
    url = {"TOPKGEN_CACHE_URL": f"file://{remote}"}
    proc = topkgen("cache", "import", clean["bundle"], cache_dir=tmp_path / "filler", env=url)
    assert proc.returncode == 0, proc.stderr
    _, digest = _poison(remote, clean["provenance"])
    # unpinned: the remote serves both, the poisoned one too, and fills the local cache with it
    proc = topkgen("build", "--policy", clean["policy"], "--out", tmp_path / "trusting", cache_dir=tmp_path / "c1",
                   env=url)
    assert proc.returncode == 0 and "2 remote hits" in proc.stdout, proc.stdout
    assert tree(tmp_path / "trusting") != tree(clean["bundle"])
    # pinned to the clean build: the poisoned entry is compiled here, never copied
    pinned = {**url, "TOPKGEN_CACHE_PINS": str(clean["provenance"]), "TOPKGEN_CACHE_READONLY": "1"}
    proc = topkgen("build", "--policy", clean["policy"], "--out", tmp_path / "out", "--provenance",
                   tmp_path / "p.json", cache_dir=tmp_path / "c2", env=pinned)
    assert proc.returncode == 0, proc.stderr
    assert "0 local hits, 1 remote hits, 1 compiled" in proc.stdout
    assert "1 of the remote's entries failed verification" in proc.stderr
    assert tree(tmp_path / "out") == tree(clean["bundle"])
    origins = sorted(k["origin"] for k in json.loads((tmp_path / "p.json").read_text())["kernels"])
    assert origins == ["compiled", "remote"]
    assert (_local(tmp_path / "c1") / "cas" / digest).exists()
    assert not (_local(tmp_path / "c2") / "cas" / digest).exists()


def test_a_remote_entry_the_pins_do_not_name_is_compiled_here(clean, tmp_path):
    remote = tmp_path / "remote"
    url = {"TOPKGEN_CACHE_URL": f"file://{remote}"}
    assert topkgen("cache", "import", clean["bundle"], cache_dir=tmp_path / "filler", env=url).returncode == 0
    pins = json.loads(clean["provenance"].read_text())
    pins["kernels"] = pins["kernels"][:1]
    (tmp_path / "pins.json").write_text(json.dumps(pins))
    proc = topkgen("build", "--policy", clean["policy"], "--out", tmp_path / "out", cache_dir=tmp_path / "c",
                   env={**url, "TOPKGEN_CACHE_PINS": str(tmp_path / "pins.json"), "TOPKGEN_CACHE_READONLY": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "0 local hits, 1 remote hits, 1 compiled" in proc.stdout
    assert "1 of the remote's entries are not pinned by TOPKGEN_CACHE_PINS" in proc.stderr


@pytest.mark.parametrize("content,message", [
    (None, "cannot read it"), ("{", "not the JSON of `topkgen build --provenance`"),
    ('{"format": "x", "kernels": []}', "not a provenance file"),
    ('{"format": "topkgen-provenance-1", "kernels": [{"key": "ab"}]}', "kernels[0]: expected a key"),
])
def test_pins_that_are_no_provenance_file_are_one_line_before_any_compile(clean, tmp_path, content, message):
    pins = tmp_path / "pins.json"
    if content is not None:
        pins.write_text(content)
    proc = topkgen("build", "--policy", clean["policy"], "--out", tmp_path / "out", cache_dir=clean["cache"],
                   env={"TOPKGEN_CACHE_PINS": str(pins)})
    one_line_error(proc, f"TOPKGEN_CACHE_PINS={pins}: ", message)
