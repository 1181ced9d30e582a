"""A user's own policy, from README.md's "Writing a policy", through every command: it plans,
builds (real NVRTC), explains and runs (the emulator); the build's output in a pipe and on a
terminal; `run`'s printed rows and its bfloat16 convention; the gap error's fix; and one
convention for every JSON document topkgen writes."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import jsonschema
import ml_dtypes
import numpy as np
import pytest
import yaml

from topkgen import policy as pol
from topkgen.common.schema import load_schema

from ..conftest import ROOT
from ..support.commands import ENV, TOPKGEN, on_terminal
from ..support.topk_cases import check_topk, make_rows



def readme_policy() -> str:
    """The commented minimal policy of README.md's "Writing a policy" section."""
    section = (ROOT / "README.md").read_text().split("## Writing a policy", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```yaml\n(.*?)```", section, re.S).group(1)


@pytest.fixture(scope="module")
def mine(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("mine") / "mine.yaml"
    path.write_text(readme_policy())
    return path


@pytest.fixture(scope="module")
def mine_bundle(mine) -> Path:
    out = mine.parent / "bundle"
    proc = subprocess.run([*TOPKGEN, "build", "--policy", mine, "--out", out], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


def test_the_readme_policy_plans_builds_explains_and_runs(cli, mine, mine_bundle, tmp_path):
    policy = pol.load(mine)
    assert policy.archs["sm_90"].capability == (9, 0)  # from the name: the policy leaves it out
    assert [s.name for s in pol.plan(policy, "sm_90")] == [
        "topk_radix_dyn_k64_fast_f32_sm_90", "topk_radix_dyn_k64_det_f32_sm_90",
        "topk_radix_dyn_k256_fast_f32_sm_90", "topk_radix_dyn_k256_det_f32_sm_90"]
    manifest = json.loads((mine_bundle / "manifest.json").read_text())
    assert len(manifest["kernels"]) == 4 and all((mine_bundle / k["cubin"]).is_file() for k in manifest["kernels"])
    jit = json.loads(cli("explain", "--policy", mine, "--arch", "sm_90", "--dtype", "fp32", "--k", 300, "--n", 5000,
                         "--format", "json").stdout)
    assert (jit["rule"], jit["source"], jit["kernel"]) == ("jit_rest", "jit", "topk_radix_dyn_k1024_fast_f32_sm_90")
    # What --no-jit leaves unserved names that option (it read "--no kernel serves ...").
    result = cli("explain", "--policy", mine, "--arch", "sm_90", "--dtype", "fp32", "--k", 300, "--n", 5000, "--no-jit")
    assert (result.exit_code, result.stderr) == (2, "topkgen: error: --no-jit: no kernel serves arch=sm_90 "
                                                    "dtype=float32 k=300 n=5000 mode=fast without JIT\n")
    x = make_rows("float32", 6, 700, seed=12)
    np.save(tmp_path / "x.npy", x)
    for k, source in ((64, "aot"), (300, "jit")):  # the bundle's cubin's source, and the JIT-only rule's
        result = cli("run", "--bundle", mine_bundle, "--backend", "emulator", "--arch", "sm_90", "--k", k,
                     "--deterministic", tmp_path / "x.npy", "-o", tmp_path / f"top{k}.npz")
        assert result.exit_code == 0, result.stderr
        assert result.stdout.rstrip().endswith(f"({source})")
        out = np.load(tmp_path / f"top{k}.npz")
        check_topk(x, out["values"], out["indices"], k, True, True, "float32")


def test_the_gap_error_states_the_rule_and_its_fix_works(mine, tmp_path):
    text = readme_policy()
    start, end = text.index("  # Every k from 1 to 1024"), text.index("dispatch_order:")
    gap = text[:start] + text[end:].replace("[radix_k64_k256, jit_rest]", "[radix_k64_k256]")
    with pytest.raises(pol.PolicyError) as err:
        pol.loads(gap, "gap.yaml")
    message = str(err.value)
    assert "nothing serves arch=sm_90 dtype=float32 mode=fast k=257 n=257..2147483647" in message
    assert pol.COVERAGE_RULE in message
    fix = yaml.safe_load(re.search(r"dispatch_order: (\{name: jit_rest.*\}) \(it serves", message).group(1))
    doc = yaml.safe_load(gap)
    doc["rules"].append({**fix, "reason": "the rest"})
    doc["dispatch_order"].append(fix["name"])
    fixed = pol.loads(yaml.safe_dump(doc), "fixed.yaml")  # the fix the message gives is enough
    assert pol.select(fixed, "sm_90", "float32", 300, 5000).rule == "jit_rest"


def test_keys_a_policy_does_not_use_may_be_left_out(tmp_path):
    register_only = """\
version: 1
name: regs
archs:
  sm_100: {warps_per_block: 4}
dtypes: {aot: [float32]}
families:
  register: {budget: {max_registers: 255, spills: false}}
rules:
  - {name: small, family: register, work: ladder, k: [16], ladder: [64], modes: [fast]}
aot_covers_all: false
dispatch_order: [small]
"""
    with pytest.raises(pol.PolicyError, match="the rules leave a gap"):  # loads up to the coverage check
        pol.loads(register_only, "regs.yaml")
    radix_without_threads = readme_policy().replace("    threads: 256", "    # threads: 256")
    with pytest.raises(pol.PolicyError) as err:
        pol.loads(radix_without_threads, "mine.yaml")
    assert str(err.value).startswith("mine.yaml:5:3: archs.sm_90: missing key 'threads': the policy declares "
                                     "radix kernels, which need it")
    wrong = readme_policy().replace("  sm_90:", "  sm_90:\n    capability: [9, 1]")
    with pytest.raises(pol.PolicyError, match=r"archs\.sm_90\.capability: sm_90 has capability \[9, 0\], not \[9, 1\]"):
        pol.loads(wrong, "mine.yaml")


def _stream_lines(proc: subprocess.Popen) -> tuple[str, bool]:
    """The first line, and whether the process was still running when it arrived."""
    first = proc.stdout.readline()
    return first, proc.poll() is None


def test_build_output_in_a_pipe_and_on_a_terminal(mine, tmp_path):
    env = {**ENV, "TOPKGEN_CACHE_DIR": str(tmp_path / "cold-cache")}
    cold = subprocess.Popen([*TOPKGEN, "build", "--policy", mine, "--out", tmp_path / "b", "-j", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    first, running = _stream_lines(cold)
    rest, errors = cold.communicate()
    assert cold.returncode == 0, errors
    assert running, "the first kernel's line came only when the build ended: not flushed as it goes"
    lines = (first + rest).splitlines()
    names = [s.name for s in pol.plan(pol.load(mine), "sm_90")]  # -j 1: in plan order
    assert [re.sub(r" compiled [0-9.]+ s$", " compiled", line) for line in lines[:4]] == \
        [f"[{i}/4] {name} compiled" for i, name in enumerate(names, 1)]
    assert re.fullmatch(r"wrote \S+/b/manifest\.json in [0-9.]+ s: 4 kernels \(sm_90 4\), [0-9.]+ KiB of cubin, "
                        r"NVRTC [0-9.]+", lines[4]), lines[4]
    assert lines[5] == "  cache: 0 local hits, 0 remote hits, 4 compiled; no remote (TOPKGEN_CACHE_URL unset)"
    assert len(lines) == 6  # one summary, not two

    warm = subprocess.run([*TOPKGEN, "build", "--policy", mine, "--out", tmp_path / "b"], capture_output=True,
                          text=True, env=env)
    assert warm.returncode == 0, warm.stderr
    assert sorted(line.split()[-1] for line in warm.stdout.splitlines()[:4]) == ["cached"] * 4
    assert "  cache: 4 local hits, 0 remote hits, 0 compiled;" in warm.stdout

    status, shown = on_terminal("build", "--policy", mine, "--out", tmp_path / "b", env=env)
    assert status == 0, shown
    assert "building  [" in shown and "4/4  0 compiled, 4 cached" in shown
    assert "[1/4]" not in shown  # the bar, not the lines


def test_run_prints_rows_without_o_and_keeps_the_bfloat16_convention(cli, mine, tmp_path):
    text = readme_policy().replace("  aot: [float32]", "  aot: [float32]\n  jit: [bfloat16]")
    path = tmp_path / "bf16.yaml"
    path.write_text(text)
    bundle = tmp_path / "bundle"
    assert subprocess.run([*TOPKGEN, "build", "--policy", path, "--out", bundle], capture_output=True).returncode == 0
    x = make_rows("bfloat16", 12, 300, seed=3)
    args = ["run", "--bundle", bundle, "--backend", "emulator", "--arch", "sm_90", "--k", 10, "--deterministic"]

    np.save(tmp_path / "records.npy", x)  # numpy's form of ml_dtypes.bfloat16: 2-byte records ('<V2')
    result = cli(*args, tmp_path / "records.npy", "-o", tmp_path / "records.npz")
    assert result.exit_code == 0, result.stderr
    out = np.load(tmp_path / "records.npz")
    assert out["values"].dtype == np.dtype("V2")  # as it came, not uint16
    check_topk(x, out["values"].view(ml_dtypes.bfloat16), out["indices"], 10, True, True, "bfloat16")

    np.save(tmp_path / "bits.npy", x.view(np.uint16))  # raw bits
    result = cli(*args, tmp_path / "bits.npy", "-o", tmp_path / "bits.npz")
    assert result.exit_code == 0, result.stderr
    assert np.load(tmp_path / "bits.npz")["values"].dtype == np.uint16
    np.testing.assert_array_equal(np.load(tmp_path / "bits.npz")["values"], out["values"].view(np.uint16))

    shown = cli(*args, tmp_path / "records.npy")
    assert shown.exit_code == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == (f"{tmp_path / 'records.npy'}: largest 10 of 12 row(s) of 300 bfloat16 by "
                        "topk_radix_dyn_k64_det_bf16_sm_90 (jit)")
    values = out["values"].view(ml_dtypes.bfloat16).astype(np.float32)
    first = " ".join(f"{v:.6g}[{i}]" for v, i in zip(values[0, :8], out["indices"][0, :8]))
    assert lines[1] == f"  row 0: {first} ... 2 more"
    assert len(lines) == 12 and lines[-1] == "  ... 2 more rows; -o OUT.npz saves them all"

    np.save(tmp_path / "cube.npy", x.reshape(3, 4, 300))  # rows labelled by their leading indices
    shown = cli(*args, tmp_path / "cube.npy")
    assert shown.exit_code == 0, shown.stderr
    assert shown.stdout.splitlines()[1].startswith("  row [0, 0]: ")
    assert shown.stdout.splitlines()[6].startswith("  row [1, 1]: ")
    np.save(tmp_path / "complex.npy", np.zeros((2, 300), np.complex64))  # what the input cannot be names the file
    refused = cli(*args, tmp_path / "complex.npy")
    assert refused.exit_code == 2
    assert f"{tmp_path / 'complex.npy'}: dtype complex64 is not one topkgen ranks" in refused.stderr


def test_run_without_a_gpu_suggests_the_emulator(cli, mine_bundle, tmp_path):
    from topkgen.runtime import gpu_unavailable

    if gpu_unavailable() is None:
        pytest.skip("a GPU is here")
    np.save(tmp_path / "x.npy", np.zeros((2, 100), np.float32))
    result = cli("run", "--bundle", mine_bundle, "--k", 3, tmp_path / "x.npy")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("topkgen: error: backend 'cuda': no usable GPU")
    assert result.stderr.rstrip().endswith("without a GPU, run the same kernels on the CPU: --backend emulator "
                                           "--arch sm_90")


# ----------------------------------------------------------------------------- machine output

def _no_format_version(doc) -> bool:
    if isinstance(doc, dict):
        return "format_version" not in doc and all(_no_format_version(v) for v in doc.values())
    return not isinstance(doc, list) or all(_no_format_version(v) for v in doc)


def test_every_json_document_has_schema_version_and_validates_against_its_schema(cli, mine, mine_bundle):
    def run_json(*args) -> dict:
        result = cli(*args, "--format", "json")
        assert result.exit_code in (0, 1), result.stderr
        return json.loads(result.stdout)

    documents = {
        "plan.schema.json": run_json("plan", "--policy", mine),
        "explain.schema.json": run_json("explain", "--policy", mine, "--arch", "sm_90", "--dtype", "fp32",
                                        "--k", 5, "--n", 100),
        "show.schema.json": run_json("show", mine_bundle, "--dispatch"),
        "diff.schema.json": run_json("diff", mine, mine_bundle),
        "manifest.schema.json": json.loads((mine_bundle / "manifest.json").read_text()),
    }
    for name, doc in documents.items():
        schema = load_schema(name)
        version = schema["properties"]["schema_version"]["const"]
        assert doc["schema_version"] == version, name
        # the schema names its version in $id and title too (diff's said 4 when its const was 5)
        assert schema["$id"].endswith(f"-{version}.json") and schema["title"].endswith(f"schema_version {version}"), \
            (name, schema["$id"], schema["title"])
        assert _no_format_version(doc), name
        jsonschema.validate(doc, schema)
    explained = documents["explain.schema.json"]
    assert explained["request"] == {"arch": "sm_90", "dtype": "float32", "k": 5, "n": 100, "rows": None, "mode": "fast",
                                   "jit": True}
    plan_kernel = {"$defs": load_schema("plan.schema.json")["$defs"], "$ref": "#/$defs/kernel"}
    jsonschema.validate(explained["spec"], plan_kernel)
    manifest_defs = load_schema("manifest.schema.json")["$defs"]
    shown = documents["show.schema.json"]
    for entry in shown["kernels"]:
        jsonschema.validate(entry, {"$defs": manifest_defs, "$ref": "#/$defs/kernel"})
    for entry in shown["jit_kernels"]:
        jsonschema.validate(entry, {"$defs": manifest_defs, "$ref": "#/$defs/jit_kernel"})


def test_topk_explain_prints_exactly_what_the_cli_prints(cli, mine, mine_bundle, monkeypatch):
    from topkgen.runtime import TopK

    op = TopK(mine_bundle, arch="sm_90", backend="emulator")
    for k, n, det in ((5, 100, False), (300, 5000, True)):
        answer = op.explain("float32", k, n, det)
        args = ["explain", "--policy", mine, "--arch", "sm_90", "--dtype", "float32", "--k", k, "--n", n]
        assert str(answer) + "\n" == cli(*args, *(["--deterministic"] if det else [])).stdout
    monkeypatch.setenv("TOPKGEN_DISABLE_JIT", "1")
    answer = TopK(mine_bundle, arch="sm_90", backend="emulator").explain("float32", 5, 100)
    assert str(answer) + "\n" == cli("explain", "--policy", mine, "--arch", "sm_90", "--dtype", "float32",
                                     "--k", 5, "--n", 100, "--no-jit").stdout


def test_every_shipped_schema_describes_every_property():
    missing = []
    for path in sorted((ROOT / "topkgen" / "schemas").glob("*.schema.json")):
        schema = json.loads(path.read_text())
        jsonschema.Draft202012Validator.check_schema(schema)
        missing += [f"{path.name}: {where}" for where in undescribed(schema)]
    assert missing == []


def undescribed(schema: dict) -> list[str]:
    """Properties with no description of their own or of the definition they $ref."""
    defs, missing = schema.get("$defs", {}), []

    def described(node: dict) -> bool:
        return "description" in node or ("$ref" in node and "description" in defs[node["$ref"].split("/")[-1]])

    def walk(node, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.get("properties", {}).items():
                if not described(value):
                    missing.append(f"{path}.{key}")
            for key, value in node.items():
                walk(value, f"{path}.{key}")
        elif isinstance(node, list):
            for item in node:
                walk(item, path)

    walk(schema, "")
    return missing


def test_plan_says_when_it_used_the_packaged_default_policy(cli, mine):
    assert cli("plan").stdout.splitlines()[0].startswith("policy: the packaged default policy (topk, sha256 ")
    # the path as typed: two policies in different folders do not look alike
    assert cli("plan", "--policy", mine).stdout.splitlines()[0].startswith(f"policy: {mine} (mine, sha256 ")
