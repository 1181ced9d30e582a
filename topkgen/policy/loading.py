"""The top-k kernel policy: load and validate it, plan the kernel set, and dispatch.

This module is the single source of truth shared by the AOT build, the runtime, the JIT
path, `explain` and `diff`. `select` is the only place where dispatch is decided.
It imports the standard library and PyYAML only, so other build systems can use it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from topkgen.common import reader
from topkgen.common.schema import SchemaViolation, load_schema, validate
from topkgen.policy.coverage import _check_dispatch_grid, _check_total_dispatch
from topkgen.policy.model import (
    FAMILY_ARCH_KEYS, FAMILY_TEMPLATES, MAX_KERNELS, MAX_POLICY_BYTES, MAX_SORT_CANDIDATES_PER_THREAD, MODES,
    RADIX_STATIC_SHARED_BYTES,
    radix_static_shared_bytes, REGISTER_MAX_K, REGISTER_MAX_N, SHARED_BYTES_PER_BLOCK, THREADS_PER_SM_BY_ARCH,
    VECTOR_BYTES, WORK_BY_FAMILY, ARCH_SPECIFIC_FROM,
    ArchTuning, Family, Policy, PolicyError, Rule, SplitTuning, _Locator, default_policy_path)
from topkgen.policy.planning import arch_capability, block_shape, kernels_of_rule


def load(path: str | Path | None = None) -> Policy:
    """Load and validate a policy file (the default policy when path is None)."""
    path = Path(path) if path is not None else default_policy_path()
    return loads(read_file(path), source=str(path))


def read_file(path: str | Path, source: str | None = None) -> bytes:
    """A policy file's bytes (a pipe's too), read no further than a policy may be long;
    `source` names it in errors (default: the path)."""
    try:
        return reader.read_bytes(path, limit=MAX_POLICY_BYTES, what="policy")
    except reader.ReadError as err:
        raise PolicyError(err.message, source=err.source if source is None else source) from None


def loads(text: str | bytes, source: str = "<policy>") -> Policy:
    """Parse, validate and build a policy from YAML text (UTF-8 bytes, or str); `source`
    names it in errors. The policy keeps the text and the sha256 of the same bytes."""
    try:
        raw = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    except UnicodeEncodeError as err:
        raise PolicyError(f"not UTF-8: {reader.printable(err.reason)} at character {err.start}", source=source) from None
    if len(raw) > MAX_POLICY_BYTES:
        raise PolicyError(f"the policy is larger than {MAX_POLICY_BYTES} bytes", source=source)
    try:
        decoded = reader.decode(raw, source)
        document = reader.parse_yaml(decoded, source)
    except reader.ReadError as err:
        raise PolicyError(err.message, source=err.source, line=err.line, column=err.column, key=err.key) from None
    if document.value is None:
        raise PolicyError("the policy file is empty", source=source, line=1, column=1)
    doc = document.value
    if isinstance(doc, dict) and {"schema_version", "kernels", "dispatch"} <= doc.keys():  # not "unknown key dispatch"
        raise PolicyError("a bundle's manifest, not a policy: topkgen show reads a bundle, and the policy it was built "
                          "from is the manifest's policy.text", source=source, line=1, column=1)
    located = _Locator(source, document)
    try:
        validate(doc, load_schema("policy.schema.json"))
    except SchemaViolation as err:
        raise located.error(err.path, err.message, err.at_key) from None
    policy = _build(doc, located, source, hashlib.sha256(raw).hexdigest(), decoded)
    _check_kernel_names(policy, located)
    _check_total_dispatch(policy, located)
    _check_dispatch_grid(policy, located)
    return policy


def _by_k(mapping: dict) -> dict[int, int]:
    """A per-K-rung map as YAML gives it (keys the schema checked are digits) with int keys."""
    return {int(k): v for k, v in mapping.items()}


def _build(doc: dict, loc: _Locator, source: str, sha: str, text: str) -> Policy:
    """A schema-valid document -> a Policy, every cross-key check made on the way.

    Kept whole: it reads the document top to bottom (families, archs, dtypes, rules, then the
    checks over all of them), the order in which a policy file's author reads its errors."""
    families = {}
    for name, f in doc["families"].items():
        template = f.get("template", FAMILY_TEMPLATES[name])
        if template != FAMILY_TEMPLATES[name]:
            raise loc.error(("families", name, "template"),
                            f"{name} kernels render from {FAMILY_TEMPLATES[name]}, not {template}")
        families[name] = Family(name, template, f["budget"]["max_registers"], f["budget"]["spills"])

    archs: dict[str, ArchTuning] = {}
    for name, t in doc["archs"].items():
        expected = arch_capability(name)
        if "capability" in t and tuple(t["capability"]) != expected:
            raise loc.error(("archs", name, "capability"),
                            f"{name} has capability {list(expected)}, not {t['capability']} (leave it out: "
                            f"the name says it)")
        for family in families:
            for key in FAMILY_ARCH_KEYS[family]:
                if key not in t:
                    raise loc.error(("archs", name), f"missing key '{key}': the policy declares {family} "
                                                     f"kernels, which need it", at_key=True)
        tail = t.get("vector_tail", {"policy": "runtime"})
        if tail["policy"] == "fixed" and "max_iterations" not in tail:
            raise loc.error(("archs", name, "vector_tail"), "policy 'fixed' needs max_iterations")
        if tail["policy"] == "runtime" and "max_iterations" in tail:
            raise loc.error(("archs", name, "vector_tail", "max_iterations"),
                            "max_iterations only applies to policy 'fixed'")
        ctas = _by_k(t.get("min_ctas_per_sm", {}))
        shared = t.get("shared_row_bytes", 0)
        if shared % VECTOR_BYTES:
            raise loc.error(("archs", name, "shared_row_bytes"), f"{shared} is not a multiple of {VECTOR_BYTES}")
        if name not in SHARED_BYTES_PER_BLOCK:
            raise loc.error(("archs", name), f"topkgen does not know {name}'s shared memory per block "
                                                  f"(it knows {', '.join(SHARED_BYTES_PER_BLOCK)})", at_key=True)
        room = SHARED_BYTES_PER_BLOCK[name] - RADIX_STATIC_SHARED_BYTES
        if shared > room:
            raise loc.error(("archs", name, "shared_row_bytes"),
                            f"{shared} bytes leave no room for the radix kernels' {RADIX_STATIC_SHARED_BYTES} bytes "
                            f"of static shared memory within {name}'s {SHARED_BYTES_PER_BLOCK[name]} per block "
                            f"(at most {room})")
        loads_by_k = _by_k(t.get("loads_in_flight_by_k", {}))
        threads_by_k = _by_k(t.get("threads_by_k", {}))
        buffer_by_k = _by_k(t.get("shared_buffer_per_k_by_k", {}))
        for k, threads in threads_by_k.items():
            if k > threads * MAX_SORT_CANDIDATES_PER_THREAD:
                raise loc.error(("archs", name, "threads_by_k", str(k)),
                                f"{threads} threads would each sort {k // threads} of K={k}'s candidates in "
                                f"registers; at most {MAX_SORT_CANDIDATES_PER_THREAD} (give K={k} at least "
                                f"{k // MAX_SORT_CANDIDATES_PER_THREAD} threads)")
        split = None
        if "split" in t:
            if "radix" not in families:
                raise loc.error(("archs", name, "split"), "split rows run on radix kernels, and the policy "
                                                          "declares none (add the radix family, or remove split)")
            fields = dict(t["split"])
            fields["rows_below_by_k"] = _by_k(fields.get("rows_below_by_k", {}))
            split = SplitTuning(**fields)
        if t.get("arch_specific") and expected < ARCH_SPECIFIC_FROM:
            raise loc.error(("archs", name, "arch_specific"), f"{name} has no arch-specific target (NVRTC compiles "
                                                              f"sm_XYa for sm_90 and later only)")
        if t.get("arch_specific") and t.get("ship_ptx"):
            raise loc.error(("archs", name, "ship_ptx"), f"{name}'s cubins are arch-specific ({name}a): their PTX "
                                                        f"would run on {name} only, which the cubins serve already "
                                                        f"(drop ship_ptx or arch_specific)")
        archs[name] = ArchTuning(name, expected, t.get("threads"), t.get("warps_per_block"),
                                 tail["policy"], tail.get("max_iterations"), ctas, shared,
                                 t.get("loads_in_flight", 1), loads_by_k, split,
                                 bool(t.get("ship_ptx", False)), bool(t.get("arch_specific", False)),
                                 t.get("shared_buffer_per_k"), threads_by_k, buffer_by_k)

    aot = tuple(doc["dtypes"]["aot"])
    jit = tuple(doc["dtypes"].get("jit", []))
    for i, d in enumerate(jit):
        if d in aot:
            raise loc.error(("dtypes", "jit", i), f"{d} is already an AOT dtype")
    if not aot and not jit:  # nothing to serve: build failed on its own manifest (an internal error)
        raise loc.error(("dtypes", "aot"), "the policy serves no dtype: list one in dtypes.aot (compiled into the "
                                           "bundle) or dtypes.jit (compiled on first use)")

    declared: set[str] = set()
    for i, r in enumerate(doc["rules"]):
        if r["name"] in declared:
            raise loc.error(("rules", i, "name"), f"duplicate rule name '{r['name']}'")
        declared.add(r["name"])
    place: dict[str, int] = {}
    for i, name in enumerate(doc["dispatch_order"]):
        if name not in declared:
            raise loc.error(("dispatch_order", i), f"unknown rule '{name}'")
        if name in place:
            raise loc.error(("dispatch_order", i), f"rule '{name}' is listed twice")
        place[name] = i
    rules = []
    for i, r in enumerate(doc["rules"]):
        if r["name"] not in place:
            raise loc.error(("rules", i, "name"),
                            f"rule '{r['name']}' has no place in dispatch_order, so dispatch would be ambiguous")
        rules.append(_build_rule(r, i, place[r["name"]], archs, aot + jit, families, loc))
    _check_kernel_count(rules, loc)
    rules.sort(key=lambda r: r.position)
    _check_occupancy(archs, rules, loc)
    return Policy(source, sha, text, doc["name"], archs, aot, jit, families, tuple(rules),
                  doc.get("aot_covers_all", False))


def _check_kernel_count(rules: list[Rule], loc: _Locator) -> None:
    total = 0
    for rule in rules:
        total += (len(rule.archs) * len(rule.dtypes) * len(rule.k_rungs) * len(rule.modes)
                  * (len(rule.n_exact) if rule.work == "exact" else 1))
        if total > MAX_KERNELS:
            raise loc.error(("rules", rule.doc_index), f"the rules up to this one declare {total} kernels "
                                                       f"over all archs, dtypes and modes; at most {MAX_KERNELS}")


def _check_occupancy(archs: dict[str, ArchTuning], rules: list[Rule], loc: _Locator) -> None:
    """min_ctas_per_sm CTAs of each kernel that gets them must fit on one SM, at the block
    size of that kernel's own family."""
    for rule in rules:
        for arch in rule.archs:
            tuning = archs[arch]
            for k in rule.k_rungs:
                ctas = tuning.min_ctas_per_sm.get(k)
                threads = block_shape(rule.family, tuning, k)[0]
                most = THREADS_PER_SM_BY_ARCH[arch]
                if ctas is not None and ctas * threads > most:
                    raise loc.error(("archs", arch, "min_ctas_per_sm", str(k)),
                                    f"{ctas} CTAs of {threads} threads (the {rule.family} kernels of rule "
                                    f"'{rule.name}', K={k}) exceed {arch}'s {most} threads per SM")
                shared = tuning.shared_row_bytes + radix_static_shared_bytes(k)
                if rule.family == "radix" and shared > SHARED_BYTES_PER_BLOCK[arch]:
                    raise loc.error(("rules", rule.doc_index, "k"),
                                    f"the radix kernels of K={k} on {arch} need {shared} bytes of shared memory "
                                    f"(shared_row_bytes {tuning.shared_row_bytes} and "
                                    f"{radix_static_shared_bytes(k)} static), more than its "
                                    f"{SHARED_BYTES_PER_BLOCK[arch]} per block: lower shared_row_bytes")


def _build_rule(r: dict, i: int, position: int, archs: dict, dtypes: tuple, families: dict,
                loc: _Locator) -> Rule:
    at = ("rules", i)
    fam, work = r["family"], r["work"]
    if fam not in families:
        raise loc.error(at + ("family",), f"family '{fam}' is not declared under families")
    if work not in WORK_BY_FAMILY[fam]:
        raise loc.error(at + ("work",), f"family '{fam}' has no work rung '{work}' "
                                         f"(allowed: {', '.join(WORK_BY_FAMILY[fam])})")
    for j, a in enumerate(r.get("archs", [])):
        if a not in archs:
            raise loc.error(at + ("archs", j), f"arch '{a}' is not declared under archs")
    for j, d in enumerate(r.get("dtypes", [])):
        if d not in dtypes:
            raise loc.error(at + ("dtypes", j), f"dtype '{d}' is not declared under dtypes")
    k_rungs = tuple(sorted(r["k"]))
    k_min = r.get("k_min", 1)
    if k_min > k_rungs[0]:
        raise loc.error(at + ("k_min",), f"k_min {k_min} is above the smallest K rung {k_rungs[0]}")

    n = r.get("n", {})
    needs = {"ladder": "ladder", "fixed_vec": "vector_iterations"}
    for key, owner in (("ladder", "ladder"), ("vector_iterations", "fixed_vec")):
        if key in r and work != owner:
            raise loc.error(at + (key,), f"'{key}' only applies to work '{owner}'")
    if work in needs and needs[work] not in r:
        raise loc.error(at, f"work '{work}' needs '{needs[work]}'")
    if work in ("ladder", "fixed_vec") and n:
        raise loc.error(at + ("n",), f"the N window of work '{work}' follows from its "
                                     f"{'ladder' if work == 'ladder' else 'vector iterations'}; remove 'n'")
    if work == "exact" and (set(n) != {"exact"}):
        raise loc.error(at + ("n",), "work 'exact' needs n: {exact: [...]} and nothing else")
    if work == "dynamic" and (set(n) != {"min", "max"}):
        raise loc.error(at + ("n",), "work 'dynamic' needs n: {min: ..., max: ...} and nothing else")
    if work == "dynamic" and n["min"] > n["max"]:
        raise loc.error(at + ("n", "min"), f"n.min {n['min']} is above n.max {n['max']}")
    ladder = tuple(sorted(r.get("ladder", ())))
    if fam == "register":
        if k_rungs[-1] > REGISTER_MAX_K:
            raise loc.error(at + ("k",), f"register kernels support K <= {REGISTER_MAX_K}")
        for j, value in enumerate(n.get("exact", [])):
            if value % 32 or value > REGISTER_MAX_N:
                raise loc.error(at + ("n", "exact", j),
                                f"register exact N must be a multiple of 32 and <= {REGISTER_MAX_N}")
        if ladder and ladder[0] < k_rungs[-1]:
            raise loc.error(at + ("ladder",), f"the smallest ladder rung {ladder[0]} is below K {k_rungs[-1]}")

    modes = tuple(m for m in MODES if m in r["modes"])
    serves = tuple(m for m in MODES if m in r.get("serves", r["modes"]))
    for m in serves:
        if m not in modes and not (m == "fast" and modes == ("deterministic",)):
            raise loc.error(at + ("serves",), f"a rule built for {list(modes)} cannot serve '{m}'")
    for m in modes:
        if m not in serves:
            raise loc.error(at + ("serves",), f"mode '{m}' is built but not served")
    is_aot = r.get("aot", True)
    if not is_aot and "reason" not in r:
        raise loc.error(at, "a JIT-only rule (aot: false) needs a 'reason'")
    if is_aot and "reason" in r:
        raise loc.error(at + ("reason",), "'reason' is for JIT-only rules (aot: false)")
    return Rule(
        name=r["name"], family=fam, work=work,
        archs=tuple(a for a in archs if a in r.get("archs", archs)),
        dtypes=tuple(d for d in dtypes if d in r.get("dtypes", dtypes)),
        k_rungs=k_rungs, k_min=k_min,
        n_min=n.get("min"), n_max=n.get("max"), n_exact=tuple(sorted(n.get("exact", ()))),
        ladder=ladder, vector_iterations=r.get("vector_iterations"),
        modes=modes, serves=serves, aot=is_aot, reason=r.get("reason"), position=position, doc_index=i,
    )


def _check_kernel_names(policy: Policy, loc: _Locator) -> None:
    """Kernel names are identities (AOT lookup and JIT cache key): two rules must never
    declare the same one."""
    seen: dict[str, Rule] = {}
    for arch in policy.archs:
        for rule in policy.rules:
            for dtype in policy.dtypes:
                for spec in kernels_of_rule(policy, rule, arch, dtype):
                    other = seen.setdefault(spec.name, rule)
                    if other is not rule:
                        raise loc.error(("rules", rule.doc_index, "name"),
                                        f"duplicate kernel name '{spec.name}': rule '{other.name}' declares it too")
