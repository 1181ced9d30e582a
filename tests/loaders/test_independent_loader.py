"""Any loader can follow the manifest: one written from the schema's descriptions alone
(tests/support/independent_loader.py, no topkgen import) agrees with topkgen.policy.select on every
decision of the boundary grid, batch sizes included, JIT on and off, AOT and JIT dtypes
alike, and sizes a split's workspace as topkgen.policy.split does."""

from __future__ import annotations

import ast
from pathlib import Path

from topkgen.policy import dispatch_table
from topkgen import policy as pol
from topkgen.policy.split import stages

from ..support.independent_loader import IndependentLoader


def test_the_independent_loader_imports_nothing_of_topkgen():
    tree = ast.parse((Path(__file__).resolve().parents[1] / "support" / "independent_loader.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported == {"__future__", "json", "pathlib"}


def test_a_loader_from_the_schema_alone_agrees_with_select(built_bundle, default_policy):
    loader = IndependentLoader(built_bundle)
    decisions, splits, sized = {True: 0, False: 0}, 0, set()
    for arch in default_policy.archs:
        for dtype in default_policy.dtypes:
            ks, ns, rs = dispatch_table.boundary_grid(default_policy, arch, dtype)
            for k in ks:
                for n in sorted({*ns, k}):
                    if n < k:
                        continue
                    for rows in [None, 0, *dispatch_table.rows_for(default_policy, arch, n, rs)]:
                        for det in (False, True):
                            for jit in (True, False):
                                try:
                                    sel = pol.select(default_policy, arch, dtype, k, n, deterministic=det, jit=jit,
                                                     rows=rows)
                                    expect = sel.kernel.name, sel.chunks
                                except pol.DispatchError:
                                    sel, expect = None, None
                                assert loader.pick(arch, dtype, k, n, det, jit, rows) == expect, \
                                    (arch, dtype, k, n, rows, det, jit)
                                decisions[jit] += 1
                                if sel is not None and rows:  # schema 6: each launch's shared memory
                                    got = loader.shared_bytes(sel.kernel.name, dtype, k, n, sel.chunks)
                                    assert got == [st.shared_bytes for st in stages(rows, n, k, True, sel.split,
                                                                                     shared=sel.kernel.shared)], \
                                        (arch, dtype, k, n, rows, sel.kernel.name)
                                    sized |= {b for b in got if b < sel.kernel.dynamic_shared_bytes}
                                if sel is not None and sel.split is not None:
                                    plan = sel.split
                                    assert loader.workspace(dtype, k, n, rows, plan.chunks) == {
                                        "chunk": plan.chunk, "values_offset": plan.values_offset,
                                        "workspace_bytes": plan.workspace_bytes}
                                    splits += 1
    print(f"independent loader == select on {decisions[True]} decisions with JIT, {decisions[False]} without; "
          f"{splits} splits sized alike, {len(sized)} distinct shared-memory sizes below a kernel's maximum")
    assert decisions[True] == decisions[False] > 4000 and splits > 1000 and len(sized) > 10
