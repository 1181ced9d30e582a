"""Bad policies: one clear message with file:line:column and key path, exit status 2."""

from __future__ import annotations

import re

import pytest

from ..conftest import DEFAULT_POLICY

BASE = DEFAULT_POLICY.read_text()


def _variant(old: str, new: str, count: int = 1) -> str:
    assert old in BASE, old
    return BASE.replace(old, new, count)


def _line_of(text: str) -> int:
    """The line of the default policy that holds `text` (where an error in it is reported)."""
    return BASE[:BASE.index(text)].count("\n") + 1


CASES = {
    "malformed_yaml": (_variant("archs:\n  sm_90:", "archs:\n  sm_90: [\n"), r":\d+:\d+: malformed YAML"),
    "unknown_key": (_variant("    threads: 256              #", "    thread: 256              #"),
                    r":10:5: archs\.sm_90\.thread: unknown key 'thread'"),
    "wrong_type": (_variant("    warps_per_block: 4        #", "    warps_per_block: four     #"),
                   rf":{_line_of('    warps_per_block: 4        #')}:22: archs\.sm_90\.warps_per_block: expected integer, "
                   r"got 'four'"),
    "bad_identifier": (_variant("- name: reg_ladder", "- name: Reg-Ladder"),
                       r"rules\[3\]\.name: 'Reg-Ladder' does not match the pattern"),
    "number_out_of_range": (_variant("n: {min: 1, max: 2147483647}", "n: {min: 1, max: 4294967296}"),
                            r"rules\[6\]\.n\.max: 4294967296 is greater than the maximum 2147483647"),
    "k_not_a_rung": (_variant("k: [64, 128, 256, 512, 1024]", "k: [64, 128, 256, 512, 8192]"),
                     r"rules\[6\]\.k\[4\]: 8192 is not one of"),
    "duplicate_kernel_names": (_variant("\n# With JIT disabled",
                                        "  - name: radix_dynamic_again\n    family: radix\n    work: dynamic\n"
                                        "    k: [64]\n    n: {min: 1, max: 10}\n    modes: [fast]\n"
                                        "\n# With JIT disabled"
                                        ).replace("  - radix_dynamic\n", "  - radix_dynamic\n  - radix_dynamic_again\n"),
                               r"rules\[8\]\.name: duplicate kernel name 'topk_radix_dyn_k64_fast_f32_sm_90'"),
    "ambiguous_dispatch_missing_rule": (_variant("  - radix_k512_bounded\n", ""),
                                        r"rules\[5\]\.name: rule 'radix_k512_bounded' has no place in dispatch_order"),
    "dispatch_lists_rule_twice": (_variant("  - radix_dynamic\n", "  - radix_dynamic\n  - reg_ladder\n"),
                                  r"dispatch_order\[7\]: rule 'reg_ladder' is listed twice"),
    "gap": (_variant("n: {min: 1, max: 2147483647}", "n: {min: 1, max: 100000}"),
            r"dispatch_order: the rules leave a gap: nothing serves arch=sm_90 dtype=float32 mode=fast "
            r"k=1 n=100001\.\.2147483647"),
    "gap_without_jit": (_variant("    aot: false\n    reason: \"on B200", "    aot: true\n    reason: \"on B200"),
                        r"rules\[2\]\.reason: 'reason' is for JIT-only rules"),
    "unsupported_arch": (_variant("  sm_100:\n    capability: [10, 0]", "  sm_101:\n    capability: [10, 1]"),
                         r"archs\.sm_101: bad key: 'sm_101' is not one of"),
    "capability_mismatch": (_variant("capability: [10, 0]", "capability: [9, 0]"),
                            r"archs\.sm_100\.capability: sm_100 has capability \[10, 0\], not \[9, 0\]"),
    "duplicate_yaml_key": (_variant("    warps_per_block: 4        #", "    threads: 128\n    warps_per_block: 4        #"),
                           rf":{_line_of('    warps_per_block: 4        #')}:5: archs\.sm_90\.threads: duplicate key 'threads'"),
    "jit_rule_without_reason": (_variant('    reason: "on B200 the shared K=16 ladder is 10.91% slower than an exact '
                                         'N=1024 register kernel"\n', ""),
                                r"rules\[2\]: a JIT-only rule \(aot: false\) needs a 'reason'"),
    "unknown_rule_in_order": (_variant("  - radix_dynamic\n", "  - radix_dynamic\n  - radix_typo\n"),
                              r"dispatch_order\[7\]: unknown rule 'radix_typo'"),
    "empty_file": ("", r":1:1: the policy file is empty"),
    # Planned 0 kernels, then build failed on its own manifest (an internal error, exit 70).
    "no_dtype": (_variant("  aot: [float32, bfloat16]    # compiled into the bundle\n"
                          "  jit: [float16]              # served by JIT from the same rules\n", "  aot: []\n"),
                 rf":{_line_of('  aot: [float32, bfloat16]')}:8: dtypes\.aot: the policy serves no dtype: list one in "
                 r"dtypes\.aot"),
    "shared_row_bytes_not_a_vector_multiple": (_variant("shared_row_bytes: 98304   #", "shared_row_bytes: 98300   #"),
                                               r"archs\.sm_90\.shared_row_bytes: 98300 is not a multiple of 16"),
    "shared_row_bytes_without_room": (_variant("shared_row_bytes: 98304   #", "shared_row_bytes: 230000   #"),
                                      r"archs\.sm_90\.shared_row_bytes: 230000 bytes leave no room for the radix "
                                      r"kernels' 16896 bytes of static shared memory within sm_90's 232448 per block"),
    "loads_in_flight_out_of_range": (_variant("loads_in_flight: 4        #", "loads_in_flight: 16       #"),
                                     r"archs\.sm_90\.loads_in_flight: 16 is greater than the maximum 8"),
    # --policy out/manifest.json said "dispatch: unknown key 'dispatch' (allowed: ...)"
    "a_bundle_manifest": ('{"archs": ["sm_90"], "dispatch": {}, "kernels": [], "schema_version": 3}\n',
                          r":1:1: a bundle's manifest, not a policy: topkgen show reads a bundle, and the policy it "
                          r"was built from is the manifest's policy\.text$"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_policy_is_rejected_with_position(cli, tmp_path, case):
    text, pattern = CASES[case]
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    result = cli("plan", "--policy", path)
    assert result.exit_code == 2
    assert result.stdout == ""  # nothing written
    message = result.stderr.strip()
    assert message.count("\n") == 0, message
    assert message.startswith(f"topkgen: error: {path}:"), message
    assert re.search(pattern, message), message


def test_missing_policy_file(cli, tmp_path):
    result = cli("plan", "--policy", tmp_path / "nope.yaml")
    assert result.exit_code == 2 and "nope.yaml: cannot read policy" in result.stderr


def test_unknown_arch_argument(cli):
    result = cli("plan", "--arch", "sm_80")
    assert result.exit_code == 2 and "--arch sm_80: not in the packaged default policy" in result.stderr


def test_explain_rejects_bad_arguments(cli):
    result = cli("explain", "--arch", "sm_90", "--dtype", "float32", "--k", "20", "--n", "10")
    assert result.exit_code == 2 and "--k: must be <= n" in result.stderr
    result = cli("explain", "--arch", "sm_90,sm_100", "--dtype", "float32", "--k", "20", "--n", "100")
    assert result.exit_code == 2 and "--arch sm_90,sm_100: takes one arch here (known: sm_90, sm_100)" in result.stderr
