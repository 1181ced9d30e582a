"""`topkgen plan` and `topkgen explain` as users run them."""

from __future__ import annotations

import json

from ..conftest import LEGACY_POLICY


def test_plan_json_totals_default(cli):
    doc = json.loads(cli("plan", "--format", "json").stdout)
    assert doc["totals"] == {"per_arch": {"sm_90": 29, "sm_100": 29}, "all": 58}
    assert {t["rule"] for t in doc["jit_only"]} == {"reg_exact_k16_n2048", "reg_exact_k32_n256",
                                                    "reg_exact_k16_n1024_sm100", "radix_k2048_k4096"}
    assert all(t["reason"] for t in doc["jit_only"])
    assert doc["policy"]["path"] == "policies/topk.yaml"


def test_plan_json_totals_legacy(cli):
    doc = json.loads(cli("plan", "--policy", LEGACY_POLICY, "--format", "json").stdout)
    assert doc["totals"] == {"per_arch": {"sm_90": 48, "sm_100": 48}, "all": 96}


def test_plan_table_lists_kernels_totals_and_tiers(cli):
    out = cli("plan", "--arch", "sm_100").stdout
    assert "sm_100: 29 kernels" in out and "sm_90:" not in out
    assert "topk_radix_dyn_k1024_det_bf16_sm_100" in out
    assert "total: 29 kernels (sm_100 29)" in out
    assert "reg_exact_k16_n1024_sm100" in out and "10.91%" in out


def test_explain_answers_for_the_exception_shapes(cli):
    def explain(*args):
        result = cli("explain", *args, "--format", "json")
        assert result.exit_code == 0, result.stderr
        return json.loads(result.stdout)

    for arch in ("sm_90", "sm_100"):
        assert explain("--arch", arch, "--dtype", "float32", "--k", 16, "--n", 2048)["source"] == "jit"
        assert explain("--arch", arch, "--dtype", "bfloat16", "--k", 32, "--n", 256)["source"] == "jit"
    sm100 = explain("--arch", "sm_100", "--dtype", "float32", "--k", 16, "--n", 1024)
    sm90 = explain("--arch", "sm_90", "--dtype", "float32", "--k", 16, "--n", 1024)
    assert (sm100["rule"], sm100["source"]) == ("reg_exact_k16_n1024_sm100", "jit")
    assert (sm90["rule"], sm90["source"]) == ("reg_ladder", "aot")
    no_jit = explain("--arch", "sm_100", "--dtype", "float32", "--k", 16, "--n", 1024, "--no-jit")
    assert (no_jit["rule"], no_jit["source"]) == ("reg_ladder", "aot")
    half = explain("--arch", "sm_90", "--dtype", "float16", "--k", 100, "--n", 5000, "--deterministic")
    assert half["source"] == "jit" and half["spec"]["mode"] == "deterministic"


def test_explain_text(cli):
    out = cli("explain", "--arch", "sm_90", "--dtype", "float32", "--k", 16, "--n", 2048).stdout
    assert "kernel: topk_register_n2048_k16_det_f32_sm_90" in out
    assert "source: jit" in out and "72%" in out
