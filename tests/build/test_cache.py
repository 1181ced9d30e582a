"""The shared compile cache: exact keys, the ac/cas tiers, a remote on memory:// and on a real
S3 protocol server (moto, in this process), read-only jobs, seeding from a bundle, verify."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import uuid
from importlib import metadata
from pathlib import Path

import pytest

from topkgen.build import cache, toolchain
from topkgen.common.paths import cuda_include_dir

from ..support.commands import TOPKGEN, topkgen, tree

SHARD = "1/29"  # 2 of the 58 kernels (one per arch): a plan small enough to compile cold in a test


def stats_line(stdout: str) -> str:
    """The cache part of the build's summary line."""
    return next(line.strip() for line in stdout.splitlines() if line.startswith("  cache: "))


@pytest.fixture(scope="module")
def full_bundle(tmp_path_factory) -> Path:
    """The 58-kernel bundle, built with the session's cache (warm after the first build)."""
    out = tmp_path_factory.mktemp("full") / "out"
    topkgen("build", "--out", out, "-j", "2", env={})
    return out


# ----------------------------------------------------------------------------- keys

KEY_PROBE = """
import json, sys
from topkgen import policy
from topkgen.build.compile import compile_kernel, toolchain
from topkgen.build.render import render
spec = policy.plan(policy.load(), "sm_90")[0]
k = compile_kernel(render(spec), spec.name, spec.arch)
print(json.dumps({"key": k.key, "cubin": k.cubin.hex(), "toolchain": toolchain(), "origin": k.outcome.origin}))
"""


def probe(include: Path, cache_dir: Path) -> dict:
    env = {**os.environ, "TOPKGEN_CUDA_INCLUDE": str(include), "TOPKGEN_CACHE_DIR": str(cache_dir)}
    env.pop("TOPKGEN_CACHE_URL", None)
    proc = subprocess.run([sys.executable, "-c", KEY_PROBE], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_header_trees_at_two_paths_share_keys_and_bytes_and_one_changed_byte_makes_a_new_key(tmp_path):
    a, b = tmp_path / "a" / "include", tmp_path / "deeper" / "b" / "include"
    shutil.copytree(cuda_include_dir(), a)
    shutil.copytree(cuda_include_dir(), b)
    first, second = probe(a, tmp_path / "cache-a"), probe(b, tmp_path / "cache-b")
    assert first["origin"] == second["origin"] == "compiled"
    assert first["key"] == second["key"]
    assert first["cubin"] == second["cubin"]
    assert first["toolchain"] == second["toolchain"]
    assert str(tmp_path) not in json.dumps(first["toolchain"])

    header = b / "cuda_bf16.h"  # included by every kernel
    text = header.read_bytes()
    assert b"Copyright 1993" in text
    header.write_bytes(text.replace(b"Copyright 1993", b"Copyright 1994", 1))
    changed = probe(b, tmp_path / "cache-b")
    assert changed["origin"] == "compiled"  # the old entry in cache-b is not reused
    assert changed["key"] != first["key"]
    assert changed["toolchain"]["headers_sha256"] != first["toolchain"]["headers_sha256"]
    assert {k: v for k, v in changed["toolchain"].items() if k != "headers_sha256"} == \
           {k: v for k, v in first["toolchain"].items() if k != "headers_sha256"}


def test_wheel_records_at_two_paths_give_one_digest_and_a_changed_hash_another(tmp_path):
    installed = [metadata.distribution(name) for name in toolchain.CUDA_WHEELS]
    copies = []
    for site in (tmp_path / "venv1" / "site-packages", tmp_path / "elsewhere" / "lib" / "site-packages"):
        for dist in installed:
            src = Path(dist._path)  # the dist-info directory: RECORD lists files relative to site-packages
            (site / src.name).mkdir(parents=True)
            for name in ("METADATA", "RECORD"):
                shutil.copy(src / name, site / src.name / name)
        copies.append([metadata.PathDistribution(site / Path(d._path).name) for d in installed])
    digests = [toolchain.wheel_files_digest(c) for c in copies]
    assert digests[0] == digests[1] == toolchain.wheel_files_digest(installed)
    record = Path(copies[1][0]._path) / "RECORD"
    lines = record.read_text().splitlines()
    i = next(i for i, line in enumerate(lines) if "/lib/libnvrtc.so" in line)
    path, digest, size = lines[i].split(",")
    lines[i] = f"{path},{digest[:-1]}{'A' if digest[-1] != 'A' else 'B'},{size}"
    record.write_text("\n".join(lines) + "\n")
    assert toolchain.wheel_files_digest(copies[1]) != digests[0]


def test_every_input_of_a_compile_is_in_its_key():
    base = dict(source="extern \"C\" __global__ void k() {}", name="k", arch="sm_90", options=["-std=c++17"],
                toolchain_digest="0" * 64)
    key = cache.action_key(**base)
    for field, other in (("source", base["source"] + " "), ("name", "k2"), ("arch", "sm_100"),
                         ("options", ["-std=c++20"]), ("toolchain_digest", "1" + "0" * 63)):
        assert cache.action_key(**{**base, field: other}) != key, field
    assert cache.action_key(**base) == key


def test_manifest_records_each_kernels_cache_key_and_the_toolchain(full_bundle):
    from topkgen import policy
    from topkgen.build.compile import cache_key, toolchain as machine_toolchain
    from topkgen.build.render import render

    manifest = json.loads((full_bundle / "manifest.json").read_text())
    assert manifest["toolchain"] == machine_toolchain()
    assert manifest["toolchain"]["wheels"] == {n: metadata.version(n) for n in toolchain.CUDA_WHEELS}
    specs = {s.name: s for a in manifest["archs"] for s in policy.plan(policy.load(), a)}
    local = cache.local_store()
    for entry in manifest["kernels"]:
        spec = specs[entry["name"]]
        assert entry["cache_key"] == cache_key(render(spec), spec.name, spec.arch)
        record = json.loads(local.get(cache.ac_path(entry["cache_key"])))
        assert record["cubin_sha256"] == entry["sha256"]
        assert local.get(cache.cas_path(entry["sha256"])) == (full_bundle / entry["cubin"]).read_bytes()


# ----------------------------------------------------------------------------- create-if-absent

def _race(root: str, barrier, payload: bytes, keys: int, queue) -> None:
    import random

    store = cache.LocalStore(Path(root))
    order = random.Random(payload).sample(range(keys), keys)  # each writer its own order: they collide throughout
    barrier.wait()
    created = {i: store.create(f"ac/{i:04d}.json", payload) for i in order}
    queue.put((payload, [created[i] for i in range(keys)]))


def test_create_if_absent_race_two_processes_one_entry(tmp_path):
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(str(tmp_path), barrier, payload, 300, queue))
             for payload in (b'{"writer": 1}', b'{"writer": 2}')]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
    entries = sorted((tmp_path / "ac").iterdir())
    assert [p.name for p in entries] == [f"{i:04d}.json" for i in range(300)]  # no temporary files left
    for i, path in enumerate(entries):
        winners = [payload for payload, created in results if created[i]]
        assert len(winners) == 1, (i, winners)  # exactly one writer created the entry
        assert path.read_bytes() == winners[0]  # and it holds that writer's bytes
    assert {sum(created) > 0 for _, created in results} == {True}  # both won some: they interleaved


def test_conflicting_action_record_is_a_loud_error_and_nothing_is_overwritten(tmp_path):
    from topkgen.build.compile import cache_key, toolchain as machine_toolchain
    from topkgen.policy import load, plan
    from topkgen.build.render import render

    spec = plan(load(), "sm_90")[0]
    key = cache_key(render(spec), spec.name, spec.arch)
    local = cache.LocalStore(tmp_path / "cache" / cache.LOCAL_DIR)
    bogus = {"key": key, "name": spec.name, "arch": spec.arch, "symbol": spec.name, "resources": {},
             "cubin_sha256": "ab" * 32, "cubin_size": 1, "source_sha256": "cd" * 32, "toolchain": machine_toolchain()}
    assert local.create(cache.ac_path(key), cache.record_bytes(bogus))  # its cubin is not in cas: a miss
    proc = topkgen("build", "--arch", "sm_90", "--shard", "1/29", "--out", tmp_path / "out",
                   env={"TOPKGEN_CACHE_DIR": str(tmp_path / "cache")}, check=False)
    assert proc.returncode == 1
    assert f"cache conflict for kernel {spec.name} (sm_90)" in proc.stderr
    assert "names cubin sha256 abababababababab..." in proc.stderr
    assert json.loads(local.get(cache.ac_path(key))) == bogus
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- remote: memory://

def test_memory_remote_second_build_on_an_empty_local_cache_compiles_nothing(tmp_path, cli, monkeypatch):
    url = f"memory://topkgen-{uuid.uuid4().hex}"
    monkeypatch.setenv("TOPKGEN_CACHE_URL", url)
    monkeypatch.setenv("TOPKGEN_CACHE_DIR", str(tmp_path / "job1"))
    first = cli("build", "--shard", SHARD, "--out", tmp_path / "out1", "-j", "2")
    assert first.exit_code == 0, first.stderr
    assert "cache: 0 local hits, 0 remote hits, 2 compiled; 0 B read from" in first.stdout
    assert f"written to {url}" in first.stdout and " 0 B written" not in first.stdout

    monkeypatch.setenv("TOPKGEN_CACHE_DIR", str(tmp_path / "job2"))
    second = cli("build", "--shard", SHARD, "--out", tmp_path / "out2", "-j", "2")
    assert second.exit_code == 0, second.stderr
    line = stats_line(second.stdout)
    print(line)
    assert line.startswith("cache: 0 local hits, 2 remote hits, 0 compiled;")
    assert line.endswith(f"read from, 0 B written to {url}")
    assert tree(tmp_path / "out2") == tree(tmp_path / "out1")
    again = cli("build", "--shard", SHARD, "--out", tmp_path / "out2")  # the remote hit filled the local tier
    assert "cache: 2 local hits, 0 remote hits, 0 compiled;" in again.stdout

    # A remote cubin that fails its sha256 is not used: compiled here, and said so.
    import fsspec

    manifest = json.loads((tmp_path / "out1" / "manifest.json").read_text())
    fs, root = fsspec.core.url_to_fs(url)
    victim = f"{root}/cas/{manifest['kernels'][0]['sha256']}"
    fs.pipe_file(victim, fs.cat_file(victim)[:-4] + b"evil")
    monkeypatch.setenv("TOPKGEN_CACHE_DIR", str(tmp_path / "job3"))
    third = cli("build", "--shard", SHARD, "--out", tmp_path / "out3")
    assert "cache: 0 local hits, 1 remote hits, 1 compiled;" in third.stdout
    assert "1 of the remote's entries failed verification (sha256, " in third.stderr
    assert tree(tmp_path / "out3") == tree(tmp_path / "out1")


def test_bad_cache_url_exits_2(tmp_path, cli, monkeypatch):
    monkeypatch.setenv("TOPKGEN_CACHE_URL", "nosuchproto://bucket/x")
    result = cli("build", "--shard", SHARD, "--out", tmp_path / "out")
    assert result.exit_code == 2
    assert "TOPKGEN_CACHE_URL=nosuchproto://bucket/x: cannot open this store" in result.stderr
    monkeypatch.setenv("TOPKGEN_CACHE_URL", "bucket/x")
    assert cli("build", "--shard", SHARD, "--out", tmp_path / "out").exit_code == 2
    # A filesystem whose constructor fails its own way was an internal error (exit 70).
    monkeypatch.chdir(tmp_path)
    for url, problem in (("zip://x", "IsADirectoryError: "), ("github://x", "TypeError: ")):
        monkeypatch.setenv("TOPKGEN_CACHE_URL", url)
        for args in (("build", "--shard", SHARD, "--out", tmp_path / "out"), ("cache", "verify", "--remote",
                                                                                "--sample", "1")):
            result = cli(*args)
            assert result.exit_code == 2 and result.stderr.startswith(
                f"topkgen: error: TOPKGEN_CACHE_URL={url}: cannot open this store: {problem}"), result.stderr
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- remote: S3 (moto)

@pytest.fixture(scope="module")
def s3_server():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(s3_server):
    """A fresh bucket, the environment a CI job would have, and a boto3 client to look inside."""
    import boto3

    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_EC2_METADATA_DISABLED": "true", "AWS_ENDPOINT_URL_S3": s3_server, "NO_PROXY": "127.0.0.1"}
    client = boto3.client("s3", endpoint_url=s3_server, aws_access_key_id="testing", aws_secret_access_key="testing",
                          region_name="us-east-1")
    bucket = f"topkgen-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)

    def keys(prefix: str) -> list[str]:
        listing = client.list_objects_v2(Bucket=bucket, Prefix=f"ci/{prefix}")
        return sorted(o["Key"] for o in listing.get("Contents", []))

    return {**env, "TOPKGEN_CACHE_URL": f"s3://{bucket}/ci"}, keys


def test_s3_remote_concurrent_jobs_then_a_fresh_job_compiles_nothing(tmp_path, s3):
    env, keys = s3
    jobs = [subprocess.Popen([*TOPKGEN, "build", "--shard", SHARD, "--out", str(tmp_path / f"out{i}"), "-j", "1"],
                             env={**os.environ, **env, "TOPKGEN_CACHE_DIR": str(tmp_path / f"job{i}")},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    results = [job.communicate(timeout=300) for job in jobs]
    assert [job.returncode for job in jobs] == [0, 0], [err for _, err in results]
    assert len(keys("ac/")) == 2  # two writers, one entry per key
    assert len(keys("cas/")) == 4  # 2 cubins and their 2 sources

    fresh = topkgen("build", "--shard", SHARD, "--out", tmp_path / "out2",
                    env={**env, "TOPKGEN_CACHE_DIR": str(tmp_path / "job2")})
    line = stats_line(fresh.stdout)
    print(line)
    assert line.startswith("cache: 0 local hits, 2 remote hits, 0 compiled;")
    assert line.endswith(f"read from, 0 B written to {env['TOPKGEN_CACHE_URL']}")
    assert tree(tmp_path / "out2") == tree(tmp_path / "out0") == tree(tmp_path / "out1")


def test_s3_read_only_job_writes_nothing(tmp_path, s3):
    env, keys = s3
    proc = topkgen("build", "--shard", "2/29", "--out", tmp_path / "out",
                   env={**env, "TOPKGEN_CACHE_DIR": str(tmp_path / "job"), "TOPKGEN_CACHE_READONLY": "1"})
    assert "cache: 0 local hits, 0 remote hits, 2 compiled; 0 B read from, 0 B written to" in proc.stdout
    assert proc.stdout.rstrip().endswith("(read-only)")
    assert keys("") == []


def test_s3_create_if_absent_keeps_the_first_writer(s3, monkeypatch):
    env, keys = s3
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    store = cache.RemoteStore(env["TOPKGEN_CACHE_URL"])
    assert store.create("ac/x.json", b"first") is True
    assert store.create("ac/x.json", b"second") is False
    assert store.get("ac/x.json") == b"first"
    assert store.names("ac") == ["x.json"]


# ----------------------------------------------------------------------------- seeding and verify

def test_import_a_bundle_then_a_rebuild_compiles_nothing(tmp_path, full_bundle):
    env = {"TOPKGEN_CACHE_DIR": str(tmp_path / "cache")}
    proc = topkgen("cache", "import", full_bundle, env=env)
    assert proc.stdout.startswith(f"imported {full_bundle}: 58 entries added, 0 already present, 0 skipped, of 58")
    assert "toolchain differs" not in proc.stdout
    build = topkgen("build", "--out", tmp_path / "out", "-j", "2", env=env)
    assert "cache: 58 local hits, 0 remote hits, 0 compiled;" in build.stdout
    assert tree(tmp_path / "out") == tree(full_bundle)
    again = topkgen("cache", "import", full_bundle, env=env)
    assert "0 entries added, 58 already present" in again.stdout


def test_import_refuses_a_tampered_bundle_and_writes_nothing(tmp_path, full_bundle):
    bad = tmp_path / "bad"
    shutil.copytree(full_bundle, bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["kernels"][3]["cache_key"] = "0" * 64
    (bad / "manifest.json").write_text(json.dumps(manifest))
    env = {"TOPKGEN_CACHE_DIR": str(tmp_path / "cache")}
    proc = topkgen("cache", "import", bad, env=env, check=False)
    assert proc.returncode == 2
    assert f"kernel {manifest['kernels'][3]['name']}: cache_key is not the key of its source" in proc.stderr
    assert not (tmp_path / "cache").exists()

    shutil.rmtree(bad)
    shutil.copytree(full_bundle, bad)
    cubin = bad / manifest["kernels"][0]["cubin"]
    data = cubin.read_bytes()
    cubin.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    proc = topkgen("cache", "import", bad, env=env, check=False)
    assert proc.returncode == 2 and "does not match its sha256" in proc.stderr
    assert not (tmp_path / "cache").exists()


def test_import_refuses_a_cubin_copied_over_another_kernels(tmp_path, full_bundle):
    """The deterministic kernel's cubin under the fast kernel's name, sha256 and size fixed:
    imported, it would poison the cache (a later build ships it as the fast kernel). Only
    the cubin's symbol table tells, and import checks it as the loaders do."""
    bad = tmp_path / "bad"
    shutil.copytree(full_bundle, bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    fast = next(e for e in manifest["kernels"] if e["name"] == "topk_radix_dyn_k64_fast_f32_sm_90")
    det = next(e for e in manifest["kernels"] if e["name"] == "topk_radix_dyn_k64_det_f32_sm_90")
    shutil.copy(bad / det["cubin"], bad / fast["cubin"])
    fast["sha256"], fast["size_bytes"] = det["sha256"], det["size_bytes"]
    (bad / "manifest.json").write_text(json.dumps(manifest))
    env = {"TOPKGEN_CACHE_DIR": str(tmp_path / "cache")}
    proc = topkgen("cache", "import", bad, env=env, check=False)
    assert proc.returncode == 2
    assert proc.stderr == (f"topkgen: error: {bad}/manifest.json: kernels[{manifest['kernels'].index(fast)}].symbol: "
                           f"{fast['cubin']} defines no function '{fast['name']}'\n")
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("field", ["registers", "stack_bytes"])
def test_import_refuses_resources_its_cubin_contradicts(tmp_path, full_bundle, field):
    """An entry's resources are served to builds as ptxas's own (budgets are held against
    them, manifests ship them); import took the manifest's on trust. The register count and
    stack frame are what a cubin records (.nv.info), and are checked; the rest (spills, static
    shared memory, barriers) a cubin does not record, as `cache import --help` says."""
    bad = tmp_path / "bad"
    shutil.copytree(full_bundle, bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    kernel = manifest["kernels"][5]
    true_value = kernel["resources"][field]
    kernel["resources"][field] = true_value + 8  # within every budget check: only the cubin tells
    (bad / "manifest.json").write_text(json.dumps(manifest))
    proc = topkgen("cache", "import", bad, env={"TOPKGEN_CACHE_DIR": str(tmp_path / "cache")}, check=False)
    assert (proc.returncode, proc.stderr) == (2, f"topkgen: error: {bad}: kernel {kernel['name']}: resources.{field} "
                                                 f"is {true_value + 8}, but {kernel['cubin']} records {true_value}\n")
    assert not (tmp_path / "cache").exists()
    assert "spill counts, static shared memory and barriers" in " ".join(topkgen("cache", "import", "--help", env={}).stdout.split())


def _import(bundle: str, cache_dir: str, barrier, queue) -> None:
    from topkgen.build import cache_admin

    os.environ["TOPKGEN_CACHE_DIR"] = cache_dir
    os.environ.pop("TOPKGEN_CACHE_URL", None)
    barrier.wait()
    queue.put(cache_admin.import_bundle(Path(bundle)).added)


def test_concurrent_imports_count_each_entry_added_once(tmp_path, full_bundle):
    """Two imports into one empty cache reported 48 + 58 entries added of 58: each counted
    what was present before it wrote. An entry is added by the process that created it."""
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_import, args=(str(full_bundle), str(tmp_path / "cache"), barrier, queue))
             for _ in range(2)]
    for p in procs:
        p.start()
    added = [queue.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(60)
    assert sum(added) == 58, added
    assert len(os.listdir(tmp_path / "cache" / cache.LOCAL_DIR / "ac")) == 58


def test_verify_recompiles_a_sample_and_finds_a_wrong_entry(tmp_path):
    env = {"TOPKGEN_CACHE_DIR": str(tmp_path / "cache")}
    topkgen("build", "--arch", "sm_90", "--shard", "1/15", "--out", tmp_path / "out", env=env)  # 2 kernels
    proc = topkgen("cache", "verify", "--sample", "50", "--seed", "7", env=env)
    assert proc.stdout.startswith(f"verified 1 of 2 entries in {tmp_path / 'cache' / cache.LOCAL_DIR} (50%, seed 7): "
                                  f"1 identical, 0 wrong, 0 skipped")

    # One record now names the other kernel's cubin (present and intact): only a recompile tells.
    local = cache.LocalStore(tmp_path / "cache" / cache.LOCAL_DIR)
    names = local.names("ac")
    records = [json.loads(local.get(f"ac/{n}")) for n in names]
    records[0]["cubin_sha256"] = records[1]["cubin_sha256"]
    local.replace(f"ac/{names[0]}", cache.record_bytes(records[0]))
    proc = topkgen("cache", "verify", "--sample", "100", env=env, check=False)
    assert proc.returncode == 1
    assert "1 identical, 1 wrong" in proc.stdout
    assert f"{records[0]['key'][:16]} {records[0]['name']} (sm_90): recompiled cubin differs" in proc.stdout
    assert topkgen("cache", "verify", "--sample", "0", env=env, check=False).returncode == 2


@pytest.mark.parametrize("remote", [False, True], ids=["local", "file-url"])
@pytest.mark.parametrize("made", [False, True], ids=["absent", "empty"])
def test_verify_of_a_cache_that_holds_nothing_is_refused_and_creates_nothing(tmp_path, remote, made):
    """A misspelt cache location verified "0 of 0 entries", exit 0 (a scheduled check passed that
    checked nothing), and the local one created the directory it was asked to read."""
    where = tmp_path / "typo"
    if made:
        (where / cache.LOCAL_DIR).mkdir(parents=True)
    env = {"TOPKGEN_CACHE_DIR": str(tmp_path / "cache" if remote else where)}
    if remote:
        env["TOPKGEN_CACHE_URL"] = f"file://{where}"
    proc = topkgen("cache", "verify", "--sample", "100", *(["--remote"] if remote else []), env=env, check=False)
    label = f"file://{where}" if remote else where / cache.LOCAL_DIR
    setting = "TOPKGEN_CACHE_URL" if remote else "TOPKGEN_CACHE_DIR"
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert proc.stderr == (f"topkgen: error: {label}: no cache entries there, nothing to verify "
                           f"(is {setting} the cache's location?)\n")
    assert where.exists() == made


def test_verify_remote_during_an_outage_is_one_line_and_exit_2(tmp_path):
    """An unreachable store is the environment, not a bug (it was exit 70 and 'internal error')."""
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_EC2_METADATA_DISABLED": "true", "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:1", "AWS_MAX_ATTEMPTS": "1",
           "TOPKGEN_CACHE_URL": "s3://down/ci", "TOPKGEN_CACHE_DIR": str(tmp_path / "cache")}
    proc = topkgen("cache", "verify", "--remote", "--sample", "100", env=env, check=False)
    assert (proc.returncode, proc.stdout, proc.stderr.count("\n")) == (2, "", 1), proc.stderr
    assert proc.stderr.startswith("topkgen: error: s3://down/ci: cannot read ac/: EndpointConnectionError: ")


def test_verify_stops_with_one_line_when_the_store_fails_midway(cli, tmp_path, monkeypatch):
    """Listing worked, then a read failed (the connection dropped): the store is named, exit 2."""
    env = {"TOPKGEN_CACHE_DIR": str(tmp_path / "cache")}
    topkgen("build", "--arch", "sm_90", "--shard", "1/15", "--out", tmp_path / "out", env=env)  # 2 kernels
    monkeypatch.setenv("TOPKGEN_CACHE_DIR", env["TOPKGEN_CACHE_DIR"])

    def dropped(self, rel):
        raise ConnectionResetError(104, "Connection reset by peer")

    monkeypatch.setattr(cache.LocalStore, "get", dropped)
    result = cli("cache", "verify", "--sample", "100")
    store = tmp_path / "cache" / cache.LOCAL_DIR
    assert (result.exit_code, result.stdout) == (2, ""), result.stderr
    assert result.stderr.startswith(f"topkgen: error: {store}: cannot read ac/")
    assert result.stderr.endswith(": ConnectionResetError: [Errno 104] Connection reset by peer\n")
