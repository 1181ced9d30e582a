"""`topkgen build`: real NVRTC compiles, real cubins, atomic and repeatable bundles."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from topkgen.build import bundle
from topkgen.manifest import reading as manifests
from topkgen import policy as pol
from topkgen.build.compile import CompileError, compile_kernel, options
from topkgen.manifest.checks import elf_sm
from topkgen.build.render import render
from topkgen.manifest.params import MERGE_PARAMS, PARAMS
from topkgen.common.schema import load_schema

from ..conftest import DEFAULT_POLICY, LEGACY_POLICY, ROOT
from ..support.commands import TOPKGEN, tree
from ..support.tiny import TINY_POLICY



def run(*args, cache: Path, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "TOPKGEN_CACHE_DIR": str(cache)}
    proc = subprocess.run([*TOPKGEN, *map(str, args)], capture_output=True, text=True, env=env)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def default_bundle(tmp_path_factory):
    """The default bundle, its cache first filled with the cubins `make build` compiled where
    the checkout has them (out/: an entry of other source is never hit), so that the suite
    compiles the 58 kernels once, in test_two_clean_builds_are_byte_identical, and that test
    sets a compile of its own process beside one of another (two full compiles here took
    about 550 s of a cold 1986 s `make test`)."""
    base = tmp_path_factory.mktemp("default")
    if (ROOT / "out" / "manifest.json").is_file():
        run("cache", "import", ROOT / "out", cache=base / "cache", check=False)
    proc = run("build", "--out", base / "out", "-j", "2", cache=base / "cache")
    return base, proc


def test_default_bundle_has_58_cubins_for_sm90_and_sm100(default_bundle):
    base, proc = default_bundle
    out = base / "out"
    assert "58 kernels (sm_90 29, sm_100 29)" in proc.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    jsonschema.validate(manifest, load_schema("manifest.schema.json"))
    assert len(manifest["kernels"]) == 58
    for arch, sm in (("sm_90", 90), ("sm_100", 100)):
        cubins = sorted((out / arch).glob("*.cubin"))
        assert len(cubins) == 29
        for path in cubins:
            assert elf_sm(path.read_bytes()) == sm, path.name
    files = manifests.read_files(out, manifest)
    for entry in manifest["kernels"]:
        data = files[entry["name"]]
        assert entry["size_bytes"] == len(data)
        assert entry["symbol"] == entry["name"]
        assert entry["resources"]["registers"] > 0
        assert [p["name"] for p in entry["params"]] == list(PARAMS[entry["family"]])
        ctypes = {p["name"]: p["ctype"] for p in entry["params"]}
        assert [ctypes["x"], ctypes["values"], ctypes["indices"]] == {
            "float32": ["const float*", "float*", "long long*"],
            "bfloat16": ["const __nv_bfloat16*", "__nv_bfloat16*", "long long*"]}[entry["dtype"]]
    for entry in manifest["kernels"]:  # radix rows up to 96 KB are read once into dynamic shared memory
        rows = {"dynamic": 2**31 - 1, "fixed_vec": entry["n_window"]["max"]}.get(entry["work"])
        dynamic = entry["launch"]["dynamic_shared_bytes"]
        if entry["family"] == "register":
            assert dynamic == 0
        else:
            size = {"float32": 4, "bfloat16": 2}[entry["dtype"]]
            assert dynamic == min(98304, -(-(rows + 16 // size - 1) * size // 16) * 16), entry["name"]
            assert dynamic + entry["resources"]["static_shared_bytes"] <= 232448
            # threads_by_k: every radix rung on 128 threads with 8 loads in flight
            vectors = int(entry["work_rung"].split("=")[1]) if entry["work"] == "fixed_vec" else 8
            assert entry["loads_in_flight"] == min(8, vectors)
            assert entry["launch"]["threads_per_block"] == 128
    assert {t["rule"] for t in manifest["jit_only"]} == {"reg_exact_k16_n2048", "reg_exact_k32_n256",
                                                        "reg_exact_k16_n1024_sm100", "radix_k2048_k4096"}
    text = (out / "manifest.json").read_text()
    assert str(base) not in text and os.sep + "work" not in text  # no absolute paths


def test_jit_kernels_ship_their_rendered_source_and_exact_options(default_bundle):
    base, _ = default_bundle
    out = base / "out"
    manifest, _ = manifests.load_manifest(out)
    policy = pol.load(DEFAULT_POLICY)
    for arch in ("sm_90", "sm_100"):
        specs = {s.name: s for s in pol.jit_plan(policy, arch)}
        shipped = {e["name"]: e for e in manifest["jit_kernels"] if e["arch"] == arch}
        assert set(shipped) == set(specs) and len(shipped) == {"sm_90": 38, "sm_100": 41}[arch]  # 20/23, K=2048/4096 12, large k 6
        assert sorted(p.name for p in (out / "jit" / arch).iterdir()) == sorted(f"{n}.cu" for n in specs)
        for name, entry in shipped.items():
            assert (out / entry["source"]).read_text() == render(specs[name])
            assert entry["nvrtc_options"] == [o for o in options(arch) if not o.startswith("-I")]
            assert entry["serves"] == list(specs[name].serves)
    # what a loader with NVRTC does with one of them: the shipped options plus its include dir
    entry = next(e for e in manifest["jit_kernels"] if e["name"] == "topk_register_n256_k32_det_bf16_sm_100")
    compiled = compile_kernel((out / entry["source"]).read_text(), entry["name"], "sm_100", use_cache=False)
    assert elf_sm(compiled.cubin) == 100 and compiled.symbol == entry["symbol"]


def test_the_readme_gives_loaders_each_familys_parameters_in_the_manifests_order(default_bundle):
    """A loader passes arguments in `params` order; README listed the radix kernels'
    x_indices, chunk and row_stride after largest, as if appended (x_indices is second). The
    kernels that merge a split in one launch (schema 7, a policy's one_launch; not the
    default's) take the merge's parameters after those."""
    base, _ = default_bundle
    manifest, _ = manifests.load_manifest(base / "out")
    readme = " ".join((ROOT / "README.md").read_text().split())
    listed = re.search(r"\(register kernels: (.+?); radix kernels: (.+?\)); those that merge a split: (.+?\))\)", readme)
    assert listed, "README no longer lists each family's parameters"
    register, radix, merging = (tuple(re.sub(r" \([a-z]+\)", "", names).split(", ")) for names in listed.groups())
    for family, names in (("register", register), ("radix", radix)):
        (order,) = {tuple(p["name"] for p in e["params"]) for e in manifest["kernels"] if e["family"] == family}
        assert names == order, names
    assert merging == MERGE_PARAMS, merging


def test_two_clean_builds_are_byte_identical(default_bundle, tmp_path):
    """A clean build (an empty cache) against the default bundle, whose cubins `make build`
    compiled in other processes where the checkout has them; also when the archs are named in
    another order than the policy's (the manifest listed them, and their JIT sources, in the
    order given)."""
    base, _ = default_bundle
    run("build", "--out", tmp_path / "out", "-j", "2", "--arch", "sm_100,sm_90", cache=tmp_path / "cache")
    first, second = tree(base / "out"), tree(tmp_path / "out")
    assert second == first, differing_cubins(base / "out", tmp_path / "out", first, second)


def differing_cubins(first: Path, second: Path, first_tree: dict, second_tree: dict) -> str:
    """What the log needs when two clean builds differ: for each cubin that does, both builds'
    sha256 and size, the SASS opcodes whose counts differ, and what three fresh compiles of
    its source give (the first four such cubins: a change of ours may move all 58). NVRTC
    wrote another cubin for one source now and then in a process that had compiled before
    (stops 65 and 66; benchmarks/nvrtc_history.py), until each compile had a process of its own."""
    from collections import Counter

    from topkgen.emulator.sass import disassemble

    policy = pol.load(DEFAULT_POLICY)
    specs = {spec.name: spec for arch in policy.archs for spec in pol.plan(policy, arch)}
    differ = [path for path in sorted(set(first_tree) | set(second_tree))
              if path.endswith(".cubin") and first_tree.get(path) != second_tree.get(path)]
    lines = []
    for path in differ[:4]:
        if path not in first_tree or path not in second_tree:
            lines.append(f"{path}: only in the {'first' if path in first_tree else 'second'} build")
            continue
        a, b = (first / path).read_bytes(), (second / path).read_bytes()
        ops_a, ops_b = (Counter(i.opcode.split(".")[0] for i in disassemble(c, lineinfo=False)) for c in (a, b))
        moved = {op: ops_b[op] - ops_a[op] for op in sorted(ops_a | ops_b) if ops_a[op] != ops_b[op]}
        spec = specs[Path(path).stem]
        source = render(spec)
        fresh = Counter(first_tree[path][:12] if c == a else second_tree[path][:12] if c == b else "neither"
                        for c in (compile_kernel(source, spec.name, spec.arch, use_cache=False).cubin
                                  for _ in range(3)))
        lines.append(f"{path}: {first_tree[path][:12]} ({len(a)} B) then {second_tree[path][:12]} ({len(b)} B); "
                     f"opcode counts second - first: {moved}; 3 fresh compiles: {dict(fresh)}")
    if len(differ) > 4:
        lines.append(f"and {len(differ) - 4} more cubins differ")
    return "\n".join(lines) or "no cubin differs"


def test_differing_cubins_names_the_cubin_its_opcodes_and_what_fresh_compiles_give(default_bundle, tmp_path):
    """The message test_two_clean_builds_are_byte_identical fails with: a copy of the default
    bundle with one cubin swapped for another kernel's and that one removed."""
    base, _ = default_bundle
    first = tree(base / "out")
    shutil.copytree(base / "out", tmp_path / "out")
    swapped = "sm_90/topk_register_ladder_k16_det_f32_sm_90.cubin"
    gone = "sm_90/topk_register_ladder_k16_det_bf16_sm_90.cubin"
    other = (tmp_path / "out" / gone).read_bytes()
    (tmp_path / "out" / swapped).write_bytes(other)
    (tmp_path / "out" / gone).unlink()
    second = tree(tmp_path / "out")
    message = differing_cubins(base / "out", tmp_path / "out", first, second)
    assert message.split("\n")[0] == f"{gone}: only in the first build", message
    message = message.split("\n", 1)[1]
    assert message.count("\n") == 0 and message.startswith(f"{swapped}: {first[swapped][:12]} ("), message
    assert f"then {second[swapped][:12]} ({len(other)} B)" in message, message
    assert re.search(r"opcode counts second - first: \{'\w+': -?\d+", message), message
    assert message.endswith(f"3 fresh compiles: {{'{first[swapped][:12]}': 3}}"), message


def test_a_bundle_built_through_the_library_does_not_depend_on_the_order_of_its_archs(tmp_path):
    """bundle.build wrote the archs, and their kernels, in the order it was given them (only
    the CLI put them in the policy's order); an arch named twice was built once, and one
    that is not in the policy is refused by name."""

    two_archs = TINY_POLICY.replace("archs:\n", "archs:\n  sm_100:\n    capability: [10, 0]\n    threads: 256\n"
                                    "    warps_per_block: 4\n    vector_tail: {policy: fixed, max_iterations: 4}\n")
    (tmp_path / "two.yaml").write_text(two_archs)
    policy = pol.load(tmp_path / "two.yaml")
    assert list(policy.archs) == ["sm_100", "sm_90"]
    for name, archs in (("given", ["sm_90", "sm_100", "sm_90"]), ("policy", ["sm_100", "sm_90"])):
        result = bundle.build(policy, archs, tmp_path / name, jobs=2)
        assert result.manifest["archs"] == ["sm_100", "sm_90"]
    assert tree(tmp_path / "given") == tree(tmp_path / "policy")
    with pytest.raises(pol.DispatchError, match="arch: 'sm_80' is not in the policy"):
        bundle.build(policy, ["sm_90", "sm_80"], tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_warm_rebuild_compiles_nothing_and_a_corrupt_entry_is_recompiled(default_bundle):
    base, _ = default_bundle
    before = tree(base / "out")
    proc = run("build", "--out", base / "out", cache=base / "cache")
    assert "cache: 58 local hits, 0 remote hits, 0 compiled" in proc.stdout
    store = base / "cache" / "nvrtc-store"
    record = json.loads(sorted((store / "ac").iterdir())[0].read_text())
    victim = store / "cas" / record["cubin_sha256"]
    victim.write_bytes(victim.read_bytes()[:-7] + b"garbage")
    proc = run("build", "--out", base / "out", cache=base / "cache")
    assert "cache: 57 local hits, 0 remote hits, 1 compiled" in proc.stdout
    assert tree(base / "out") == before


def test_over_budget_fails_and_leaves_the_previous_bundle(default_bundle, tmp_path):
    base, _ = default_bundle
    out = tmp_path / "out"
    run("build", "--arch", "sm_90", "--out", out, cache=base / "cache")
    before = tree(out)
    tight = tmp_path / "tight.yaml"
    tight.write_text(DEFAULT_POLICY.read_text().replace("budget: {max_registers: 255, spills: false}",
                                                        "budget: {max_registers: 64, spills: false}"))
    proc = run("build", "--policy", tight, "--arch", "sm_90", "--out", out, cache=base / "cache", check=False)
    assert proc.returncode == 1
    assert "kernel topk_register_ladder_k16_det_f32_sm_90 is over its resource budget:" in proc.stderr
    assert "registers > budget 64" in proc.stderr
    assert tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out.tmp")) == []
    proc = run("build", "--policy", tight, "--arch", "sm_90", "--out", out, "--allow-over-budget",
               cache=base / "cache")
    assert "warning: kernel topk_register_ladder_k16_det_f32_sm_90 is over its resource budget" in proc.stderr
    assert json.loads((out / "manifest.json").read_text())["policy"]["path"] == "tight.yaml"


@pytest.mark.parametrize("mode", ["fast", "deterministic"])
def test_k1024_block_size_is_policy_data_and_both_build_within_budget(mode):
    """threads_by_k sets the K=1024 rung's block: the default's 128 threads at 5 CTAs per SM
    with eight 16-byte loads in flight; without the entry, max(K, threads) = 1024 threads, here
    at one CTA per SM (64 registers) with four. Both compile within the family's budget."""
    from topkgen import policy as pol
    from topkgen.build.render import render

    default = DEFAULT_POLICY.read_text()
    without = default.replace("      1024: 128               #", "                              #", 1)
    without = without.replace("      1024: 5\n", "      1024: 1\n", 1)
    without = without.replace("512: 8, 1024: 8}  #", "512: 8}  #", 1)
    sm_100 = "threads_by_k: {64: 128, 128: 128, 256: 128, 512: 128, 1024: 128, 2048: 256}"
    assert without.count(sm_100) == 1  # sm_100's, left as it is
    for text, threads, ctas, loads in ((default, 128, 5, 8), (without, 1024, 1, 4)):
        spec = pol.select(pol.loads(text), "sm_90", "float32", 1024, 200_000,
                          deterministic=mode == "deterministic").kernel
        assert (spec.threads, spec.min_ctas_per_sm, spec.loads_in_flight) == (threads, ctas, loads)
        source = render(spec)
        assert f"__launch_bounds__({threads}, {ctas})" in source
        assert bundle.over_budget(spec, compile_kernel(source, spec.name, spec.arch)) is None


def test_killed_build_leaves_the_previous_bundle(default_bundle, tmp_path):
    base, _ = default_bundle
    out = tmp_path / "out"
    run("build", "--arch", "sm_100", "--out", out, cache=base / "cache")
    before = tree(out)
    env = {**os.environ, "TOPKGEN_CACHE_DIR": str(tmp_path / "cold")}
    proc = subprocess.Popen([*TOPKGEN, "build", "--arch", "sm_90", "--out", str(out), "-j", "1"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(2.0)  # mid-way through compiling: a cold sm_90 build takes several seconds
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert tree(out) == before


def _kill_during_the_final_write(args: list[str], out: Path, env: dict) -> None:
    """SIGKILL a build once its staging directory exists beside `out` (the window is short:
    a warm sm_90 build writes 29 cubins there; a build that finished first is run again)."""
    for _ in range(5):
        proc = subprocess.Popen([*TOPKGEN, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while proc.poll() is None and not list(out.parent.glob(f".{out.name}.tmp-{proc.pid}-*")):
            pass
        proc.send_signal(signal.SIGKILL)
        if proc.wait() == -signal.SIGKILL:
            return
    pytest.fail("every build finished before its staging directory was seen")


def test_a_build_killed_while_writing_leaves_a_staging_directory_that_the_next_build_removes(default_bundle,
                                                                                            tmp_path):
    """SIGKILL cannot be caught: the staging directory of a build killed during its final write
    stayed beside --out for good, a hidden copy of the bundle per kill. The next build of that
    --out removes it, and only it: a live writer's staging directory is left alone."""
    base, _ = default_bundle
    out = tmp_path / "out"
    args = ["build", "--arch", "sm_90", "--out", str(out)]
    run(*args, cache=base / "cache")
    before = tree(out)
    _kill_during_the_final_write(args, out, {**os.environ, "TOPKGEN_CACHE_DIR": str(base / "cache")})
    # and its lock file, empty, which the next build takes and removes too
    assert sorted(p.name.split("-")[0] for p in tmp_path.iterdir() if p.name != "out") == [".out.lock", ".out.tmp"]
    assert tree(out) == before
    # Live writers' (an older topkgen's, or one that skips the lock): one whose pid is alive,
    # and one whose pid is not alive here (another pid namespace) but holds its flock.
    alive = tmp_path / f".out.tmp-{os.getpid()}-0123abcd"
    gone = subprocess.Popen(["true"])
    gone.wait()
    held = tmp_path / f".out.tmp-{gone.pid}-4567abcd"
    for live in (alive, held):
        live.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys\n"
                               f"fcntl.flock(os.open({str(held)!r}, os.O_RDONLY), fcntl.LOCK_EX)\n"
                               "print(flush=True); sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        holder.stdout.readline()  # it holds the flock
        run(*args, cache=base / "cache")
    finally:
        holder.communicate()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out", alive.name, held.name])
    assert tree(out) == before


def test_concurrent_builds_into_one_directory(default_bundle, tmp_path):
    base, _ = default_bundle
    out = tmp_path / "out"
    env = {**os.environ, "TOPKGEN_CACHE_DIR": str(base / "cache")}
    procs = [subprocess.Popen([*TOPKGEN, "build", "--arch", arch, "--out", str(out)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for arch in ("sm_90", "sm_100")]
    assert [p.wait() for p in procs] == [0, 0]
    manifest, root = manifests.load_manifest(out)
    assert len(manifest["kernels"]) == 29
    assert len(manifests.read_files(root, manifest)) == 29 + {"sm_90": 38, "sm_100": 41}[manifest["archs"][0]]
    arch = manifest["archs"][0]
    assert sorted(p.name for p in out.iterdir()) == sorted(["manifest.json", arch, "jit"])
    assert sorted(p.name for p in (out / "jit").iterdir()) == [arch]


# A build that stops inside the destination's lock, just before it stages its bundle, until
# its stdin closes.
_STOP_BEFORE_STAGING = """\
import sys
from topkgen.build import bundle
from topkgen.manifest import reading as manifests
stage = bundle._write_atomically
def stopped(*args):
    print("locked", flush=True)
    sys.stdin.read()
    stage(*args)
bundle._write_atomically = stopped
from topkgen.cli.launch import main
sys.argv[0] = "topkgen"
main()
"""


def _waits_on_a_flock(pid: int) -> bool:
    """/proc/locks lists a process blocked in flock() as `N: -> FLOCK ADVISORY WRITE <pid> ...`."""
    return any(line.split()[1:3] == ["->", "FLOCK"] and line.split()[5] == str(pid)
               for line in Path("/proc/locks").read_text().splitlines())


def test_builds_into_one_directory_with_different_caches_wait_for_each_other(tmp_path):
    """The destination's lock lived in the compile cache: two builds of one --out with
    different caches (TOPKGEN_CACHE_DIR per CI job, say) took different locks and staged and
    swapped at once. The lock lives beside the destination now: the second waits until the
    first has swapped its bundle in, then swaps its own; nothing else is left beside it."""

    policy = tmp_path / "tiny.yaml"
    policy.write_text(TINY_POLICY)
    out = tmp_path / "dest" / "out"
    args = ["build", "--policy", str(policy), "--out", str(out)]
    first = subprocess.Popen([sys.executable, "-c", _STOP_BEFORE_STAGING, *args], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ)
    second = None
    try:
        assert "locked\n" in iter(first.stdout.readline, ""), first.communicate()[1]  # after its progress lines
        second = subprocess.Popen([*TOPKGEN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "TOPKGEN_CACHE_DIR": str(tmp_path / "another-cache")})
        deadline = time.monotonic() + 120
        while second.poll() is None and not _waits_on_a_flock(second.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert second.poll() is None, f"it wrote {out} while another build held it: {second.communicate()}"
        assert _waits_on_a_flock(second.pid)
        assert not out.exists()
        first.stdin.close()
        assert first.wait(timeout=60) == 0, first.communicate()[1]
        done = second.communicate(timeout=60)
        assert second.returncode == 0, done[1]
        assert "0 local hits, 0 remote hits, 2 compiled" in done[0]  # its own cache: it did the work itself
    finally:
        for proc in (first, second):
            if proc is not None:
                proc.kill()
                proc.wait()
    manifest, root = manifests.load_manifest(out)
    assert len(manifests.read_files(root, manifest)) == 2 + 2  # and the large-k path's two JIT sources
    assert [p.name for p in out.parent.iterdir()] == ["out"]  # no staging directory, no lock file


def test_ctrl_c_while_waiting_for_the_destinations_lock_stops_the_build_at_once(tmp_path):
    """A build that compiled (NVRTC's first compile leaves Python's SIGINT and SIGTERM
    handlers with SA_RESTART) and then waits for another build's lock on --out took a
    Ctrl-C only once the other build let go: flock() was restarted after the signal. It
    stops at once now (130, one line), and the other build goes on to write its bundle."""

    policy = tmp_path / "tiny.yaml"
    policy.write_text(TINY_POLICY)
    out = tmp_path / "out"
    args = ["build", "--policy", str(policy), "--out", str(out)]
    first = subprocess.Popen([sys.executable, "-c", _STOP_BEFORE_STAGING, *args], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ)
    second = None
    try:
        assert "locked\n" in iter(first.stdout.readline, ""), first.communicate()[1]
        second = subprocess.Popen([*TOPKGEN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "TOPKGEN_CACHE_DIR": str(tmp_path / "another-cache")},
                                  preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.monotonic() + 120
        while second.poll() is None and not _waits_on_a_flock(second.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _waits_on_a_flock(second.pid), second.communicate()
        second.send_signal(signal.SIGINT)
        try:
            stderr = second.communicate(timeout=10)[1]
        except subprocess.TimeoutExpired:
            pytest.fail("the build went on waiting for the lock after a Ctrl-C")
        assert (second.returncode, stderr) == (130, "topkgen: interrupted\n")
        first.stdin.close()
        assert first.wait(timeout=60) == 0, first.communicate()[1]
    finally:
        for proc in (first, second):
            if proc is not None:
                proc.kill()
                proc.wait()
    assert manifests.load_manifest(out)[0]["policy"]["name"] == "tiny"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["another-cache", "out", "tiny.yaml"]


def test_compile_error_names_the_kernel_and_shows_the_log():
    with pytest.raises(CompileError, match=r"kernel topk_broken \(sm_90\) failed to compile:\n.*undeclared"):
        compile_kernel('extern "C" __global__ void topk_broken() { undeclared_thing = 1; }', "topk_broken", "sm_90",
                       use_cache=False)


def test_each_compile_runs_in_a_process_of_its_own_and_its_death_is_a_compile_error():
    """NVRTC varied its cubin with what its process had compiled before (compile._nvrtc), so
    every compile has a fresh process: here the one under way is found among this process's
    children, killed, and reported as one line naming the kernel and the status."""
    import threading

    spec = next(s for s in pol.plan(pol.load(None), "sm_90") if s.family == "radix")  # seconds to find it in
    source, errors = render(spec), []

    def compile_it() -> None:
        try:
            compile_kernel(source, spec.name, spec.arch, use_cache=False)
        except CompileError as err:
            errors.append(str(err))

    worker = threading.Thread(target=compile_it)
    worker.start()
    child = None
    deadline = time.monotonic() + 60
    while child is None and time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except (OSError, ValueError):
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid() and b"nvrtc_child.py" in cmdline:
                child = int(entry.name)
        time.sleep(0.01)
    assert child is not None, "no child process of this one ran nvrtc_child.py"
    os.kill(child, signal.SIGKILL)
    worker.join()
    assert errors == [f"kernel {spec.name} (sm_90): the NVRTC process ended with status -9"]


def test_legacy_grid_builds_96_kernels(tmp_path):
    """On the suite's cache (make test seeds it from make build-legacy's bundle, whose cubins
    `cache import` checks): this test is about the grid's plan and bundle, not NVRTC."""
    proc = run("build", "--policy", LEGACY_POLICY, "--out", tmp_path / "legacy", "-j", "2",
               cache=Path(os.environ["TOPKGEN_CACHE_DIR"]))
    assert "96 kernels (sm_90 48, sm_100 48)" in proc.stdout


def test_bad_arguments_exit_2(tmp_path):
    proc = run("build", "--arch", "sm_80", "--out", tmp_path / "x", cache=tmp_path, check=False)
    assert proc.returncode == 2 and "--arch sm_80" in proc.stderr
    assert not (tmp_path / "x").exists()


def test_the_manifest_names_the_policy_alike_from_any_working_directory(default_bundle, tmp_path):
    """policy.path is relative to the git work tree that holds the file (else its name),
    never to the working directory: the same inputs give the same manifest wherever topkgen
    runs, and shards built in different folders merge."""
    base, _ = default_bundle
    repo = tmp_path / "repo"
    (repo / "policies" / "mine").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    policy = repo / "policies" / "mine" / "topk.yaml"
    policy.write_text(DEFAULT_POLICY.read_text())
    outside = tmp_path / "elsewhere" / "copy.yaml"
    outside.parent.mkdir()
    outside.write_text(DEFAULT_POLICY.read_text())
    manifests = {}
    for label, path in (("in a repo", policy), ("outside", outside)):
        for cwd in (tmp_path, path.parent, Path("/")):
            out = tmp_path / f"out-{len(manifests)}"
            subprocess.run([sys.executable, "-m", "topkgen", "build", "--policy", str(path), "--arch", "sm_90",
                            "--out", str(out)], cwd=cwd, check=True, capture_output=True,
                           env={**os.environ, "TOPKGEN_CACHE_DIR": str(base / "cache"),
                                "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
            manifests.setdefault(label, set()).add((out / "manifest.json").read_bytes())
    assert [len(found) for found in manifests.values()] == [1, 1]
    assert json.loads(next(iter(manifests["in a repo"])))["policy"]["path"] == "policies/mine/topk.yaml"
    assert json.loads(next(iter(manifests["outside"])))["policy"]["path"] == "copy.yaml"


def _installed_copy(root: Path, layout: str) -> tuple[Path, Path]:
    """topkgen copied to `root` as a source archive unpacks it (no .git) or as a wheel installs
    it (policies inside the package); returns the PYTHONPATH and the shipped legacy policy."""
    import shutil

    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "topkgen", root / "topkgen", ignore=skip)
    data = root if layout == "source archive" else root / "topkgen"
    for folder in ("policies", "templates"):
        shutil.copytree(ROOT / folder, data / folder, ignore=skip)
    if layout == "source archive":
        shutil.copy(ROOT / "pyproject.toml", root)
    return root, data / "policies" / "legacy" / "exact_n_grid.yaml"


def test_a_shipped_policy_is_named_alike_however_topkgen_is_installed(tmp_path):
    """The legacy policy was policies/legacy/exact_n_grid.yaml in a git checkout but
    exact_n_grid.yaml from a source archive or a wheel (no .git above it): the same policy,
    another manifest. A policy that ships with topkgen is named by its place among them."""
    named = {}
    for layout in ("checkout", "source archive", "wheel"):
        pythonpath, policy = ((ROOT, LEGACY_POLICY) if layout == "checkout"
                              else _installed_copy(tmp_path / layout.replace(" ", "-"), layout))
        proc = subprocess.run([*TOPKGEN, "plan", "--policy", str(policy), "--format", "json"], cwd=tmp_path,
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(pythonpath)})
        assert proc.returncode == 0, proc.stderr
        named[layout] = json.loads(proc.stdout)["policy"]["path"]  # as policy_record writes it into a manifest
    assert named == dict.fromkeys(named, "policies/legacy/exact_n_grid.yaml")


@pytest.mark.parametrize("content,message", [
    ("{{ no_such_value }}\n", "templates/: cannot render kernel topk_radix_"),
    ("{% if %}\n", "templates/radix_select.cu.j2:1: Expected an expression"),
])
def test_an_installed_template_that_does_not_render_is_an_input_error(tmp_path, monkeypatch, content, message):
    """A checkout whose templates were edited into an error: build says which file (and
    line), exit 2, rather than an internal error."""
    import shutil

    from topkgen.common import errors
    from topkgen.build import render as rendering

    templates = tmp_path / "templates"
    shutil.copytree(rendering.template_dir(), templates)
    (templates / "radix_select.cu.j2").write_text(content)
    monkeypatch.setattr(rendering, "template_dir", lambda: templates)
    rendering._environment.cache_clear()
    try:
        spec = next(s for s in pol.plan(pol.load(), "sm_90") if s.family == "radix")
        with pytest.raises(errors.InputError) as err:
            rendering.render(spec)
        assert message in str(err.value) and "another version" not in str(err.value)
    finally:
        rendering._environment.cache_clear()
