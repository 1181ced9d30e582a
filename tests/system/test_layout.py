"""The package's layout holds: stages import one way (no cycle, no import of a later stage),
topkgen.policy loads with the standard library and PyYAML alone, and modules stay a size a
reader can hold. The import graph is read from the source (every import statement, those
inside functions too), so a lazy import that closes a cycle is caught as well."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "topkgen"
# The pipeline, in order: a module may import its own stage and the stages before it.
STAGES = ("common", "policy", "manifest", "build", "emulator", "runtime", "diff", "cli")
TOP_LEVEL = {"topkgen": "common", "topkgen.explain": "policy", "topkgen.__main__": "cli"}
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
KEPT_WHOLE = "Kept whole"  # what a longer function's docstring says, with why


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    found = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Each module's imports of other topkgen modules. `from pkg import name` is an import of
    the submodule pkg.name where there is one, else of pkg itself (its __init__)."""
    mods = modules(root)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for target in targets:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def stage_of(module: str) -> str:
    if module in TOP_LEVEL:
        return TOP_LEVEL[module]
    stage = module.split(".")[1]
    assert stage in STAGES, f"{module}: topkgen/{stage}/ is no stage of the pipeline {STAGES}"
    return stage


def backward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} ({stage_of(m)}) imports {t} ({stage_of(t)})" for m, ts in graph.items() for t in ts
                  if STAGES.index(stage_of(t)) > STAGES.index(stage_of(m)))


def test_no_import_cycle_anywhere_in_the_package():
    assert cycles(import_graph()) == []


def test_each_stage_imports_only_itself_and_the_stages_before_it():
    assert backward_imports(import_graph()) == []


def test_the_graph_checks_see_a_cycle_and_a_backward_import(tmp_path):
    """The checks can fail: a planted lazy import that closes a cycle, and a policy module
    that imports the runtime, are both named."""
    root = tmp_path / "topkgen"
    for pkg in ("policy", "runtime"):
        (root / pkg).mkdir(parents=True)
        (root / pkg / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "policy" / "a.py").write_text("from topkgen.policy import b\n")
    (root / "policy" / "b.py").write_text("def f():\n    from topkgen.policy.a import g\n")
    (root / "runtime" / "c.py").write_text("")
    (root / "policy" / "d.py").write_text("from topkgen.runtime import c\n")
    graph = import_graph(root)
    assert cycles(graph) == [["topkgen.policy.a", "topkgen.policy.b"]]
    assert backward_imports(graph) == ["topkgen.policy.d (policy) imports topkgen.runtime.c (runtime)"]


POLICY_ALONE = """
import importlib.abc, sys
allowed = set(sys.stdlib_module_names) | {"yaml", "_yaml", "topkgen"}

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] not in allowed:
            raise ImportError(f"topkgen.policy imported {name}")
        return None

sys.meta_path.insert(0, Refuse())
import topkgen.policy as p
policy = p.load()
assert len(p.plan(policy, "sm_90")) > 0
print(p.select(policy, "sm_90", "float32", 64, 4096).kernel.name)
print(sorted(m for m in ("numpy", "jinja2", "click", "cuda", "torch", "ml_dtypes") if m in sys.modules))
"""


def test_the_policy_loads_plans_and_selects_with_pyyaml_alone():
    proc = subprocess.run([sys.executable, "-c", POLICY_ALONE], capture_output=True, text=True,
                          cwd=PACKAGE.parent)
    assert proc.returncode == 0, proc.stderr
    kernel, loaded = proc.stdout.splitlines()
    assert kernel.startswith("topk_")
    assert loaded == "[]"


def test_the_pyyaml_alone_check_refuses_another_import():
    planted = POLICY_ALONE.replace("import topkgen.policy as p", "import numpy\nimport topkgen.policy as p")
    proc = subprocess.run([sys.executable, "-c", planted], capture_output=True, text=True, cwd=PACKAGE.parent)
    assert proc.returncode != 0 and "imported numpy" in proc.stderr


@pytest.mark.parametrize("name", sorted(modules()))
def test_no_module_is_over_500_lines(name):
    lines = len(modules()[name].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_MODULE_LINES, f"{name}: {lines} lines"


def long_functions(root: Path = PACKAGE) -> list[tuple[str, str, int, bool]]:
    found = []
    for name, path in modules(root).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append((name, node.name, length, KEPT_WHOLE in (ast.get_docstring(node) or "")))
    return sorted(found)


def test_a_function_over_80_lines_says_why_it_is_kept_whole():
    assert [f for f in long_functions() if not f[3]] == []
