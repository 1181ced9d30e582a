"""Hypothesis strategies over the policy schema's space, shared by the property test
(tests/policy/test_policy_space.py) and the fuzzer (tests/support/fuzz.py).

`policy_documents` draws whole policies: archs with every block size, warps per block, tail
policy and iteration count, shared-memory row size and loads in flight the schema allows (and, rarely, values it refuses), dtypes, and
rules of every family and work rung (register ladders and exact tiers, radix fixed_vec,
exact and dynamic), K rungs, k_min, modes, JIT-only tiers, dispatch orders. Most drawn
policies are complete (a radix dynamic rule with K=1024 last), so most are accepted.
"""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import strategies as st

ARCHS = {"sm_75": [7, 5], "sm_80": [8, 0], "sm_86": [8, 6], "sm_89": [8, 9], "sm_90": [9, 0],
         "sm_100": [10, 0], "sm_120": [12, 0]}
DTYPES = ("float32", "bfloat16", "float16")
K_RUNGS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
REGISTER_K = (1, 2, 4, 8, 16, 32)
LADDER = (32, 64, 128, 256, 512, 1024, 2048)
N_MAX = 2**31 - 1


def _sorted_subset(values: tuple, min_size: int = 1, max_size: int = 3):
    return st.lists(st.sampled_from(values), min_size=min_size, max_size=max_size, unique=True).map(sorted)


@st.composite
def arch_tuning(draw, name: str) -> dict[str, Any]:
    tail = draw(st.sampled_from(["fixed", "runtime"]))
    tuning: dict[str, Any] = {
        "capability": ARCHS[name],
        # 96 is outside the schema: drawn rarely, to see it refused with its reason.
        "threads": draw(st.sampled_from([128, 256, 512, 1024] * 4 + [96])),
        "warps_per_block": draw(st.integers(1, 32)),
        "vector_tail": {"policy": tail, **({"max_iterations": draw(st.integers(1, 16))} if tail == "fixed" else {})},
    }
    if draw(st.booleans()):  # radix: a row resident in shared memory, or candidates there (rarely not x16)
        tuning["shared_row_bytes"] = draw(st.sampled_from([0, 1024, 4096, 16384, 98304] * 4 + [1000]))
    if draw(st.booleans()):
        tuning["loads_in_flight"] = draw(st.integers(1, 8))
    if draw(st.integers(0, 3)) == 0:
        tuning["loads_in_flight_by_k"] = {k: draw(st.integers(1, 8)) for k in draw(_sorted_subset(K_RUNGS, 1, 2))}
    if draw(st.integers(0, 3)) == 0:  # K <= 1024 on >= 128 threads: within 8 candidates a thread
        tuning["threads_by_k"] = {k: draw(st.sampled_from([128, 256, 512, 1024])) for k in draw(_sorted_subset(K_RUNGS, 1, 2))}
    if draw(st.booleans()):
        tuning["min_ctas_per_sm"] = {k: draw(st.integers(1, 4)) for k in draw(_sorted_subset(K_RUNGS, 1, 2))}
    return tuning


@st.composite
def _modes(draw) -> dict[str, Any]:
    modes = draw(st.sampled_from([["fast"], ["deterministic"], ["fast", "deterministic"]]))
    serves = ["fast", "deterministic"] if modes == ["deterministic"] and draw(st.booleans()) else modes
    return {"modes": modes, "serves": serves}


@st.composite
def _rule(draw, name: str, archs: list[str]) -> dict[str, Any]:
    kind = draw(st.sampled_from(["register_ladder", "register_exact", "radix_fixed_vec", "radix_exact",
                                 "radix_dynamic"]))
    family, work = kind.split("_", 1)
    rule: dict[str, Any] = {"name": name, "family": family, "work": work}
    if family == "register":
        rule["k"] = draw(_sorted_subset(REGISTER_K, 1, 2))
    else:
        rule["k"] = draw(_sorted_subset(K_RUNGS, 1, 3))
    if draw(st.booleans()):
        rule["k_min"] = draw(st.integers(1, rule["k"][0]))
    if work == "ladder":
        rule["ladder"] = draw(_sorted_subset(tuple(r for r in LADDER if r >= rule["k"][-1]), 1, 4))
    elif work == "exact" and family == "register":
        rule["n"] = {"exact": draw(st.lists(st.integers(max(1, rule["k"][-1] // 32 + (rule["k"][-1] % 32 > 0)), 64)
                                            .map(lambda m: 32 * m), min_size=1, max_size=2, unique=True))}
    elif work == "exact":
        rule["n"] = {"exact": draw(st.lists(st.integers(rule["k"][-1], 6000), min_size=1, max_size=2, unique=True))}
    elif work == "fixed_vec":
        rule["vector_iterations"] = draw(st.integers(1, 8))
    else:
        low = draw(st.integers(1, 5000))
        rule["n"] = {"min": low, "max": draw(st.integers(low, N_MAX))}
    if draw(st.integers(0, 3)) == 0 and len(archs) > 1:
        rule["archs"] = [draw(st.sampled_from(archs))]
    rule.update(draw(_modes()))
    if draw(st.integers(0, 3)) == 0:
        rule["aot"] = False
        rule["reason"] = "a JIT-only tier drawn by the property test"
    return rule


@st.composite
def policy_documents(draw) -> dict[str, Any]:
    """A policy as plain data (dump it with `policy_text`)."""
    archs = draw(st.lists(st.sampled_from(sorted(ARCHS)), min_size=1, max_size=2, unique=True))
    dtypes = draw(st.lists(st.sampled_from(DTYPES), min_size=1, max_size=3, unique=True))
    split = draw(st.integers(1, len(dtypes)))
    rules = [draw(_rule(f"rule_{i}", archs)) for i in range(draw(st.integers(0, 3)))]
    if draw(st.integers(0, 19)):  # usually a catch-all, so the policy serves every shape
        both = draw(st.booleans())
        rules.append({"name": "catch_all", "family": "radix", "work": "dynamic",
                      "k": sorted({1024, *draw(_sorted_subset(K_RUNGS, 0, 1))}), "n": {"min": 1, "max": N_MAX},
                      "modes": ["fast", "deterministic"] if both else ["deterministic"],
                      "serves": ["fast", "deterministic"]})
    if not rules:
        rules.append(draw(_rule("rule_only", archs)))
    order = [r["name"] for r in rules]
    if draw(st.integers(0, 4)) == 0:
        order = draw(st.permutations(order))
    doc: dict[str, Any] = {
        "version": 1,
        "name": "drawn",
        "archs": {a: draw(arch_tuning(a)) for a in archs},
        "dtypes": {"aot": dtypes[:split], **({"jit": dtypes[split:]} if dtypes[split:] else {})},
        "families": {"register": {"template": "register_select.cu.j2",
                                  "budget": {"max_registers": 255, "spills": False}},
                     "radix": {"template": "radix_select.cu.j2", "budget": {"max_registers": 96, "spills": False}}},
        "rules": rules,
        "dispatch_order": list(order),
    }
    if draw(st.booleans()):
        doc["aot_covers_all"] = draw(st.booleans())
    return doc


class _NoAliases(yaml.SafeDumper):
    """Policies may not hold anchors or aliases; write shared values out each time."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def policy_text(doc: dict[str, Any]) -> str:
    return yaml.dump(doc, Dumper=_NoAliases, sort_keys=False)
