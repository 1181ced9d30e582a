"""`topkgen explain --gpu-arch G`: which binary serves a GPU of arch G (own cubins, a lower
minor's, shipped PTX, JIT, refusal) and why, on a built bundle and on the policy's full build,
in the words of the runtime's load order (TopK(gpu_arch=G).binary)."""

from __future__ import annotations

import json

import pytest

from topkgen.runtime import TopK
from topkgen.runtime.binary import NoBinaryError, resolve_manifest
from topkgen.manifest import reading as manifests

SHAPE = ("--dtype", "float32", "--k", 40, "--n", 3000, "--deterministic")


@pytest.mark.parametrize("gpu, way", [("sm_100", "cubin"), ("sm_103", "lower-minor cubin"), ("sm_110", "jit")])
def test_explain_gpu_arch_says_what_the_runtime_takes(cli, built_bundle, gpu, way):
    result = cli("explain", "--gpu-arch", gpu, "--bundle", built_bundle, *SHAPE)
    assert result.exit_code == 0, result.stderr
    op = TopK(built_bundle, backend="emulator", gpu_arch=gpu)
    assert op.binary.way == way
    lines = result.stdout.splitlines()
    assert lines[:2] == [f"gpu:    {gpu}: {way} ({op.binary.arch})", f"binary: {op.binary.words}"]
    runtime = op.explain("float32", 40, 3000, deterministic=True)
    assert f"kernel: {runtime.kernel.name}" in lines and f"source: {runtime.source}" in lines
    assert f"why:    {runtime.reason}" in lines  # the library's words, binary clause included
    doc = json.loads(cli("explain", "--gpu-arch", gpu, "--bundle", built_bundle, *SHAPE, "--format", "json").stdout)
    assert doc["binary"] == {"gpu": gpu, "way": way, "arch": op.binary.arch, "words": op.binary.words}
    assert (doc["request"]["arch"], doc["source"]) == (op.arch, runtime.source)


def test_explain_gpu_arch_refuses_as_the_runtime_does(cli, built_bundle):
    manifest, _ = manifests.load_manifest(built_bundle)
    with pytest.raises(NoBinaryError) as err:
        resolve_manifest("sm_86", manifest, jit=True)
    result = cli("explain", "--gpu-arch", "sm_86", "--bundle", built_bundle, *SHAPE)
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == f"topkgen: error: --gpu-arch: {err.value}\n"


def test_explain_gpu_arch_on_the_policy_serves_every_fleet_arch_by_its_own_cubins(cli):
    from topkgen import policy as pol

    fleet = pol.load("policies/fleet.yaml")
    for gpu in fleet.archs:
        out = cli("explain", "--policy", "policies/fleet.yaml", "--gpu-arch", gpu, *SHAPE).stdout
        assert out.startswith(f"gpu:    {gpu}: cubin ({gpu})\n"), out
    # sm_88 is no fleet arch: the same major's lower minor, sm_87, whose kernels fit its shared memory
    out = cli("explain", "--policy", "policies/fleet.yaml", "--gpu-arch", "sm_88", *SHAPE).stdout
    assert out.startswith("gpu:    sm_88: lower-minor cubin (sm_87)\n"), out


@pytest.mark.parametrize("args, words", [
    ((), "--arch: give --arch ARCH or --gpu-arch GPU"),
    (("--arch", "sm_90", "--gpu-arch", "sm_90"), "--arch: give --arch ARCH or --gpu-arch GPU, not both"),
    (("--arch", "sm_90", "--bundle", "out"), "--bundle: only with --gpu-arch"),
    (("--gpu-arch", "86"), "--gpu-arch: expected a GPU's arch such as sm_86, got '86'"),
])
def test_explain_gpu_arch_arguments_are_one_line_errors(cli, args, words):
    result = cli("explain", *args, *SHAPE)
    assert result.exit_code == 2 and result.stderr.startswith(f"topkgen: error: {words}"), result.stderr
    assert len(result.stderr.splitlines()) == 1
