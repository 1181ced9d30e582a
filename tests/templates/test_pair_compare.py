"""pair_not_below (templates/topk_common.cuh): on sm_90 and later a stream tests a word of two
16-bit keys with one `set.geu.u32.bf16x2` (`__hgeu2_mask`; `set.leu` for smallest), which the
CPU emulator runs as the CUDA header's host code. The kernel's SASS is shown to hold those
HSET2s in both directions, and those of the collect from a resident row's copy (in the order
of keys: `set.le` for smallest, which a NaN fails); sm_80, which has no bfloat16 form, compiles
the compare of a key at a time (test_counters.py runs that form on the emulator)."""

from __future__ import annotations

from topkgen import policy
from topkgen.build.render import render
from topkgen.emulator.sass import disassemble, nvrtc_cubin

from ..conftest import ROOT


def _hset2(arch: str, policy_file=None) -> dict[str, int]:
    loaded = policy.load(policy_file) if policy_file else policy.load()
    spec = policy.select(loaded, arch, "bfloat16", 1024, 131072).kernel
    sass = disassemble(nvrtc_cubin(render(spec), spec.name, arch, []))
    texts = [i.text for i in sass if i.opcode.startswith("HSET2")]
    return {cmp: sum(f".{cmp}." in t for t in texts) for cmp in ("GEU", "LEU", "LE")}


def test_sm_90_tests_two_bfloat16_keys_an_instruction_in_both_directions():
    counts = _hset2("sm_90")
    # a staged group of 4 pieces of 4 words, in the stream's copy per direction (GEU, LEU), and
    # a step of the collect's in each direction (GEU, LE)
    assert counts["GEU"] >= 32 and counts["LEU"] >= 16 and counts["LE"] >= 16, counts


def test_sm_80_compares_a_key_at_a_time():
    assert _hset2("sm_80", ROOT / "policies" / "fleet.yaml") == {"GEU": 0, "LEU": 0, "LE": 0}
