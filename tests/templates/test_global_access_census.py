"""Every global load and store of every template comes from a counted helper
(templates/topk_memory.cuh: load_global_nc, load_global, store_global, and the split's ticket
atomics atomic_add_global and atomic_exch_global), so that the
emulator's traffic counters see all of it: a census of the PTX NVRTC emits for compute_90,
each ld.global / st.global mapped by its line information (-lineinfo, the innermost .loc)
to the helper it was inlined from. A planted raw load makes the census fail."""

from __future__ import annotations

import re

import pytest

from topkgen.emulator.instructions import instrument
from topkgen.emulator.sass import nvrtc_cubin

HELPERS = ("load_global_nc", "load_global", "store_global", "atomic_add_global", "atomic_exch_global")


def _kernels():
    """One kernel of each template, dtype and mode of the default policy's sm_90 plan, and one
    that merges a split in one launch (the policy's one_launch: its ticket atomics)."""
    from topkgen import policy

    pol = policy.load()
    picked = {}
    for dtype, k, n, det in (("float32", 256, 16384, False), ("float32", 256, 16384, True),
                             ("bfloat16", 1024, 131072, False), ("float32", 64, 2048, True),
                             ("float32", 16, 1024, True), ("bfloat16", 16, 1024, True)):
        spec = policy.select(pol, "sm_90", dtype, k, n, deterministic=det).kernel
        picked[spec.name] = spec
    assert {s.family for s in picked.values()} >= {"radix", "register"}
    merging = policy.loads(policy.default_policy_path().read_text().replace("one_launch: false", "one_launch: true"),
                           source="one_launch")
    spec = policy.select(merging, "sm_90", "float32", 256, 131072).kernel
    assert spec.merges
    return [*picked.values(), spec]


def helper_lines(source: str) -> set[int]:
    """The lines of the bodies of the counted helpers in a rendered source."""
    inst = instrument(source)
    lines = source.splitlines()
    out: set[int] = set()
    for site in inst.sites:
        if site.kind != "function":
            continue
        head = " ".join(lines[max(0, site.first_line - 3):site.first_line])
        if any(re.search(rf"\b{h}\s*\(", lines[site.first_line - 1]) or
               re.search(rf"\b{h}\s*\([^)]*\)\s*\{{", head) for h in HELPERS):
            out.update(range(site.first_line, site.last_line + 1))
    return out


def census(source: str, name: str) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(accesses from a helper, accesses from elsewhere): (instruction, source line)."""
    ptx = nvrtc_cubin(source, name, "compute_90", ["-lineinfo"], ptx=True).decode()
    own = helper_lines(source)
    counted, raw = [], []
    line = 0
    for text in ptx.splitlines():
        m = re.match(r"\s*\.loc\s+\d+\s+(\d+)", text)
        if m:
            line = int(m.group(1))
            continue
        m = re.match(r"^\s*(?:@!?%p\d+\s+)?((?:ld|st|atom|red|cp\.async|prefetch)\.global[\w.]*|"
                     r"(?:ld|st)(?:\.v\d)?\.[usbf]\d+)\s", text)
        if m:
            (counted if line in own else raw).append((m.group(1), line))
    return counted, raw


@pytest.mark.parametrize("spec", _kernels(), ids=lambda s: s.name + "_merges" * s.merges)
def test_every_global_access_is_counted(spec):
    from topkgen.build.render import render

    source = render(spec)
    assert len(helper_lines(source)) >= 3
    counted, raw = census(source, spec.name)
    assert counted, "no global access found at all: the census is broken"
    assert not raw, f"{spec.name}: global accesses outside the counted helpers: {raw[:5]}"
    kinds = {op for op, _ in counted}
    assert any(op.startswith("st.global") for op in kinds) and any(op.startswith("ld.global") for op in kinds)


def test_a_planted_raw_load_is_found():
    """A row read through a raw pointer (what `__ldg` or `*p` would do) fails the census."""
    from topkgen import policy
    from topkgen.build.render import render

    spec = policy.select(policy.load(), "sm_90", "float32", 256, 16384).kernel
    source = render(spec)
    planted = source.replace("return SHARED ? *q : WRITTEN ? load_global(q) : load_global_nc(q);", "return *q;", 1)
    assert planted != source
    _, raw = census(planted, spec.name)
    assert raw and all(op.startswith("ld.global") for op, _ in raw)
    assert {line for _, line in raw} == {source[:source.index("return SHARED ? *q")].count("\n") + 1}


def test_first_pass_row_loads_are_what_the_comment_says():
    """The streaming row loads of the first pass: topk_memory.cuh says what NVRTC emits for
    them. Today that is plain ld.global (not .nc) for the row and ld.global.nc for
    x_indices; this records it, so that a change shows."""
    from topkgen import policy
    from topkgen.build.render import render

    spec = policy.select(policy.load(), "sm_90", "float32", 256, 16384).kernel
    counted, _ = census(render(spec), spec.name)
    ops = {op for op, _ in counted}
    assert "ld.global.v4.u32" in ops
    assert "ld.global.nc.u64" in ops
