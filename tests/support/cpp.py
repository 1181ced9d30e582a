"""The C++ loader as the tests build and compile against it."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

from topkgen import policy as pol
from topkgen.policy.split import stages

ROOT = Path(__file__).resolve().parents[2]
CPP = ROOT / "build" / "cpp" / "topkgen-cpp"


def loader_flags() -> list[str]:
    """g++ flags for a program that includes loader.hpp (the headers the Makefile gives topkgen-cpp)."""
    nlohmann = Path(importlib.util.find_spec("nlohmann_json").origin).parent / "include"
    return ["-std=c++17", f"-I{ROOT}/loaders/cpp/include", "-isystem", str(nlohmann)]


def cpp_select(cpp: Path, bundle_dir: Path, shapes: list[tuple], sm_count: int | None = None) -> list[str]:
    """Shapes (arch, dtype, k, n, det, jit[, rows]); `sm_count`: plan splits for a GPU of that many SMs."""
    lines = "".join(f"{a} {d} {k} {n} {'deterministic' if det else 'fast'} {int(jit)}"
                    f"{'' if len(rest) == 0 or rest[0] is None else f' {rest[0]}'}\n"
                    for a, d, k, n, det, jit, *rest in shapes)
    extra = [] if sm_count is None else ["--sm-count", str(sm_count)]
    proc = subprocess.run([cpp, "select", bundle_dir, *extra], input=lines, capture_output=True, text=True)
    answers = proc.stdout.splitlines()
    refused = any(answer.startswith("error: ") for answer in answers)
    assert proc.returncode == (1 if refused else 0), proc.stderr  # 1: a request was refused
    return answers


def python_select(policy: pol.Policy, shape: tuple) -> str:
    """What topkgen-cpp select prints: the kernel, then (rows given) its chunks per row, the
    split's workspace bytes and candidate values' offset, and each launch's dynamic shared
    memory (topkgen.policy.split.stages, schema 6)."""
    arch, dtype, k, n, det, jit, *rest = shape
    rows = rest[0] if rest else None
    try:
        sel = pol.select(policy, arch, dtype, k, n, deterministic=det, jit=jit, rows=rows)
    except pol.DispatchError as err:
        return f"error: {err}"
    if rows is None:
        return sel.kernel.name
    plan = sel.split
    shared = ",".join(str(stage.shared_bytes) for stage in stages(rows, n, k, True, plan, shared=sel.kernel.shared))
    return (f"{sel.kernel.name} {sel.chunks} {plan.workspace_bytes if plan else 0} {plan.values_offset if plan else 0} "
            f"[{shared}]")


def cpp_binary(cpp: Path, bundle_dir: Path, gpu: str, jit: bool) -> tuple[str, str, str] | str:
    """What `topkgen-cpp binary` says serves a GPU of arch `gpu`: (way, arch, words), or the
    refusal's message."""
    proc = subprocess.run([cpp, "binary", bundle_dir, gpu, *(["--jit"] if jit else [])], capture_output=True, text=True)
    assert proc.returncode in (0, 1), proc.stderr
    line = proc.stdout.rstrip("\n")
    if proc.returncode == 1:
        assert line.startswith("error: "), line
        return line[len("error: "):]
    way, arch, words = line.split("\t")
    return way, arch, words
