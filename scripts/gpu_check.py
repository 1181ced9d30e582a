"""`make gpu-check`: the device checks, as one prepared script for the accelerator machine.

1. build the default bundle for the GPU's arch;
2. run the GPU tests (tests/runtime/test_gpu.py), after the checks of the cuda-core, cuda-bindings
   and torch APIs the backend uses (API_TESTS: the versions there are not CI's);
3. launch every AOT kernel through the C++ loader (build/cpp/topkgen-cpp, `make cpp`) and
   through the Python runtime on the same input, and compare the outputs;
4. run compute-sanitizer (memcheck, racecheck) on one kernel of each family;
5. time the kernels alone, against torch.topk (and flashinfer.top_k where importable), on
   the shapes of benchmarks/shapes.py (those of `make bench-kernels`, the seed grid at 132
   and 4096 rows) and its four data kinds; the "small batch" set is issue 14's point 6:
   rows {1, 4, 16, 64} x n {131072, 262144} x K {16, 256, 1024}, whose rows the policy
   splits across CTAs (its launches timed: one where the kernel merges (schema 7), with a
   workspace passed in, as a CUDA graph would capture them); the table's "chunks" column says how each case ran. With nvbench's Python package (cuda-bench):
   cold runs (L2 flushed), a noise threshold, throttled samples dropped. Without it: CUDA
   events around the launch alone, while a spin kernel holds the GPU so that the Python
   dispatch stays outside the window, with an L2 flush before every sample, until the
   noise threshold; batches whose SM clock fell below 90% of the highest seen are dropped.
   Raw samples go to RESULTS/gpu_check_samples.json;
6. the split crossover (issue 14): each batch of benchmarks/split_crossover.py's grid timed
   from a bundle whose policy splits every batch it can and from one whose policy splits
   none (the same kernels), into RESULTS/split_crossover.json; `python
   benchmarks/split_crossover.py RESULTS/split_crossover.json --write` puts the rows_below
   they favour into the policy;
7. `ncu` DRAM bytes per row of each shape (normal data), where ncu exists and is allowed.
Everything stops within --budget-s. Stages 3, 5 and 6 run each in a child process: a kernel
fault or a hang costs that stage alone. RESULTS gets only the few result files (on the
device machine it is $OUT, which brings back 8 at most); bundles and scratch files go to
OUT-work. Without a GPU it says so, builds for sm_90 (and the two crossover bundles),
collects the GPU tests, lists the cases it would time, says again that nothing was measured,
and exits NO_GPU_STATUS (3; 1 when those CPU-side parts fail): a check that checked nothing
must not read as passed to `make` or a script.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

import split_crossover  # noqa: E402
from shapes import DATA_KINDS, select_sets  # noqa: E402

PEAK_BYTES_PER_S = 4.8e12
IMPLS = ("topkgen", "torch", "flashinfer")
STAGES = ("tests", "cpp", "sanitizer", "bench", "crossover", "ncu")
# The stages that launch kernels in Python run each in a child process: a kernel fault (a
# sticky CUDA error poisons the whole context) or a hang then costs that stage alone, and
# the run still prints the table of what the others measured.
STAGE_PROCESSES = ("cpp", "bench", "crossover")
STAGE_GRACE_S = 20.0  # past its deadline a stage is killed (it checks the deadline between cases)
SANITIZER_SHAPES = (("register", "float32", 16, 1000), ("radix", "float32", 64, 300000),
                    ("radix", "bfloat16", 200, 1500))
SPIN_SOURCE = """extern "C" __global__ void topkgen_spin(unsigned long long cycles) {
  const long long start = clock64();
  while (clock64() - start < (long long)cycles) {}
}
"""
SPIN_CYCLES = 1_000_000  # ~0.5 ms at 2 GHz: longer than the Python dispatch of one launch
NCU_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
SANITIZER_REFUSED = "Device not supported"  # what compute-sanitizer says on machines that refuse it
T = TypeVar("T")
SAMPLES = "gpu_check_samples.json"
API_TESTS = ("tests/runtime/test_cuda_core_api.py", "tests/runtime/test_torch_api.py")
NO_GPU_STATUS = 3  # no GPU: nothing was measured, which `make gpu-check` must not report as success


@dataclass(frozen=True)
class Case:
    set: str
    rows: int
    dtype: str
    n: int
    k: int
    data: str

    @property
    def id(self) -> str:
        kind = {"90% -inf": "masked"}.get(self.data, self.data)
        return f"{self.dtype}-{self.rows}x{self.n}-k{self.k}-{kind}"

    @property
    def input_bytes(self) -> int:
        return self.rows * self.n * (4 if self.dtype == "float32" else 2)


@dataclass
class Timing:
    """The samples of one (case, implementation), in microseconds."""

    method: str
    samples: list[float] = field(default_factory=list)
    dropped: int = 0
    note: str = ""

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("GPU_CHECK_OUT", str(ROOT / "out-gpu-check")),
                        help="bundle directory (default out-gpu-check, or $GPU_CHECK_OUT)")
    parser.add_argument("--results", help="where samples and tables go (default OUT-results, beside the bundle: "
                                           "a folder inside it would make the next build refuse OUT)")
    parser.add_argument("--budget-s", type=float, default=540.0, help="stop every stage by then (default 540)")
    parser.add_argument("--timer", choices=("auto", "nvbench", "events"), default="auto",
                        help="auto: nvbench (cuda-bench) when importable, else CUDA events")
    parser.add_argument("--sets", help="comma-separated shape sets of benchmarks/shapes.py (default all)")
    parser.add_argument("--data", help=f"comma-separated data kinds (default all: {', '.join(DATA_KINDS)})".replace("%", "%%"))
    parser.add_argument("--skip", default="", help=f"comma-separated stages to skip: {', '.join(STAGES)}")
    parser.add_argument("--max-noise", type=float, default=1.0, help="relative noise to stop at, in %% (default 1)")
    parser.add_argument("--list", action="store_true", help="list the cases it would time and exit")
    parser.add_argument("--ncu-child", help=argparse.SUPPRESS)  # a case list to run once each, under ncu
    # One GPU stage in a process of its own (STAGE_PROCESSES), for its arch and until a deadline
    # on time.monotonic()'s clock (the system's monotonic clock: the same in every process).
    parser.add_argument("--stage", choices=STAGE_PROCESSES, help=argparse.SUPPRESS)
    parser.add_argument("--arch", help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args.cases = cases(args.sets, args.data)
    except ValueError as err:
        parser.error(str(err))
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if skip - set(STAGES):
        parser.error(f"--skip: unknown stage {sorted(skip - set(STAGES))[0]!r} (stages: {', '.join(STAGES)})")
    args.skip = skip
    if not 0 < args.max_noise <= 100 or args.budget_s <= 0:
        parser.error("--max-noise must be in (0, 100] and --budget-s positive")
    args.results = Path(args.results) if args.results else beside(args.out, "results")
    args.work = beside(args.out, "work")  # the crossover's policies and bundles, nvbench's and ncu's files
    return args


def beside(bundle: str, what: str) -> Path:
    """A folder next to the bundle directory (out-gpu-check-results, out-gpu-check-work):
    `topkgen build --out` refuses a directory that holds anything but a bundle, and RESULTS
    (the device machine's $OUT) brings back 8 small files at most, so that bundles and
    sample files go to the work folder."""
    out = Path(bundle)
    return out.with_name(f"{out.name}-{what}")


def cases(set_names: str | None = None, data_names: str | None = None) -> list[Case]:
    kinds = DATA_KINDS if data_names is None else tuple(d.strip() for d in data_names.split(","))
    unknown = [d for d in kinds if d not in DATA_KINDS]
    if unknown:
        raise ValueError(f"--data: unknown data kind {unknown[0]!r} (kinds: {', '.join(DATA_KINDS)})")
    try:
        sets = select_sets(set_names)
    except ValueError as err:
        raise ValueError(f"--sets: {err}") from None
    out = {}  # by id: a case two sets share (1 x 131072, K=16) is timed once, under the first
    for s in sets:
        for rows in s.gpu_rows:
            for dtype, n, k in s.shapes:
                for kind in kinds:
                    if kind in s.data:
                        case = Case(s.name, rows, dtype, n, k, kind)
                        out.setdefault(case.id, case)
    return list(out.values())


def step(title: str) -> None:
    print(f"\n=== {title}", flush=True)


def run(cmd: list[str], deadline: float | None = None, **kw) -> int:
    """A command's exit status; 124 when it outlives `deadline` (time.monotonic()), killed."""
    print("$ " + " ".join(cmd), flush=True)
    if deadline is not None:
        kw["timeout"] = max(1.0, deadline - time.monotonic())
    try:
        return subprocess.run(cmd, cwd=ROOT, **kw).returncode
    except subprocess.TimeoutExpired:
        print(f"timed out: {cmd[0]} ran past the time budget", flush=True)
        return 124


def run_captured(cmd: list[str], timeout: float = 60.0) -> tuple[int | None, str, str]:
    """(exit status, stdout, stderr) of a short command; None when it cannot be started
    (stderr says why), 124 when it outlives `timeout`."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except OSError as err:
        return None, "", str(err)
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {timeout:.0f} s"
    return proc.returncode, proc.stdout, proc.stderr


def use_toolkit_headers_if_wheels_lack_them() -> None:
    """NVRTC needs cuda_fp16.h, cuda_bf16.h and crt/ (nv/target it has built in since 13.0,
    which is as well: a CUDA 13 toolkit keeps it in include/cccl, where no -I points).
    topkgen takes them from the nvidia-cuda-runtime/-crt/-cccl wheels; a machine whose
    Python lacks the crt or cccl wheel (the accelerator machine's image has neither) can use
    the CUDA toolkit's include folder beside its nvcc instead, through TOPKGEN_CUDA_INCLUDE
    (inherited by every child)."""
    from topkgen.common.paths import cuda_include_dir, has_cuda_headers

    try:
        cuda_include_dir()
        return
    except RuntimeError as err:
        wheels_missing = str(err)
    homes = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    homes += [str(Path(nvcc).resolve().parent.parent) if nvcc else None, "/usr/local/cuda"]
    for home in filter(None, homes):
        include = Path(home) / "include"
        if has_cuda_headers(include):
            os.environ["TOPKGEN_CUDA_INCLUDE"] = str(include)
            cuda_include_dir.cache_clear()
            print(f"{wheels_missing}; using the toolkit's headers: TOPKGEN_CUDA_INCLUDE={include}", flush=True)
            return
    print(f"{wheels_missing}; no CUDA toolkit include folder has them either (set TOPKGEN_CUDA_INCLUDE)", flush=True)


def guarded(stage: str, action: Callable[..., T], *args: Any, failed: T) -> T:
    """One stage's result, or `failed` when it raises: its traceback goes to the log and the
    stages after it still run, so that a one-shot device run brings back all it can."""
    try:
        return action(*args)
    except Exception:
        print(f"STAGE FAILED: {stage}:", flush=True)
        traceback.print_exc(file=sys.stdout)
        sys.stdout.flush()
        return failed


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for case in args.cases:
            print(f"{case.set:<16} {case.id}")
        print(f"{len(args.cases)} cases x {len(IMPLS)} implementations")
        return 0
    if args.ncu_child:
        return ncu_child(args)
    if args.stage:
        return stage_child(args)
    from topkgen.runtime import gpu_unavailable

    topkgen = [sys.executable, "-m", "topkgen"]
    use_toolkit_headers_if_wheels_lack_them()
    reason = gpu_unavailable()
    if reason is not None:
        print(f"no GPU: {reason}. Running the CPU-side parts only (build for sm_90, collect the GPU tests, "
              f"list the cases).")
        step("build (sm_90)")
        status = run([*topkgen, "build", "--arch", "sm_90", "--out", args.out])
        step("GPU tests: collection only")
        status |= run([sys.executable, "-m", "pytest", "-q", "--collect-only", "tests/runtime/test_gpu.py"])
        if "crossover" not in args.skip:
            step("split crossover: the two bundles (sm_90)")
            status |= crossover_listing(args, "sm_90", topkgen)
        print(f"\nwould time {len(args.cases)} cases x {len(IMPLS)} implementations ({timer_name(args.timer)})")
        print(f"no GPU: the device checks did not run, nothing was measured (exit {1 if status else NO_GPU_STATUS})")
        return 1 if status else NO_GPU_STATUS
    started = time.monotonic()
    deadline = started + args.budget_s
    from topkgen.common.paths import cache_root
    from topkgen.runtime.cuda_backend import _CudaBackend

    arch = guarded("open the GPU through cuda.core", lambda: _CudaBackend().current_arch(), failed=None)
    if arch is None:
        return 1
    # One compile cache for every child: the GPU tests' own build (its conftest keeps an
    # explicit TOPKGEN_CACHE_DIR) then compiles nothing that this build did.
    os.environ["TOPKGEN_CACHE_DIR"] = str(cache_root())
    step(f"build ({arch})")
    if run([*topkgen, "build", "--arch", arch, "--out", args.out, "-j", str(os.cpu_count() or 2)], deadline) != 0:
        return 1
    # Each stage stops by the deadline less what the stages after it reserve (a share of the
    # budget), so that a slow sanitizer or a hanging test leaves the timings their time.
    reserve = {stage: 0 if stage in args.skip else share * args.budget_s
               for stage, share in (("bench", 0.25), ("crossover", 0.25), ("ncu", 0.15))}
    early = deadline - sum(reserve.values())
    failed = False
    if "tests" not in args.skip:
        step("GPU tests")
        failed |= run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *API_TESTS,
                       "tests/runtime/test_gpu.py"], early) != 0
    if "cpp" not in args.skip:
        step("C++ loader against the Python runtime: every AOT kernel")
        failed |= run_stage(args, "cpp", arch, early)
    if "sanitizer" not in args.skip:
        step("compute-sanitizer")
        failed |= guarded("sanitizer", sanitize, args.out, early, failed=True)
    args.results.mkdir(parents=True, exist_ok=True)
    samples = args.results / SAMPLES
    samples.unlink(missing_ok=True)  # a file from an earlier run is no result of this one
    if "bench" not in args.skip:
        step(f"kernel timings ({timer_name(args.timer)})")
        failed |= run_stage(args, "bench", arch, deadline - reserve["crossover"] - reserve["ncu"])
    timings = guarded("read the samples", read_samples, samples, failed={}) if samples.exists() else {}
    if "crossover" not in args.skip:
        step("split crossover: each batch split and unsplit (CUDA events)")
        failed |= run_stage(args, "crossover", arch, deadline - reserve["ncu"])
    chunks = chunks_per_row(args.cases, arch)
    dram = {}
    if "ncu" not in args.skip:
        step("ncu: DRAM bytes per row")
        dram = guarded("ncu", ncu_dram_per_row, args, deadline, launches_per_call(args.cases, arch), failed={})
    table = format_table(args.cases, timings, dram, chunks)
    print("\n" + table)
    (args.results / "gpu_check_table.md").write_text(table + "\n")
    print(f"\ngpu-check finished in {time.monotonic() - started:.0f} s{' with FAILURES' if failed else ''}")
    return 1 if failed else 0


def run_stage(args: argparse.Namespace, stage: str, arch: str, deadline: float) -> bool:
    """Runs a stage in a child process (STAGE_PROCESSES); True when it failed, crashed or
    had to be killed past its deadline."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *args.argv, "--stage", stage, "--arch", arch,
           "--deadline", repr(deadline)]
    rc = run(cmd, deadline + STAGE_GRACE_S)
    if rc != 0:
        print(f"STAGE FAILED: {stage} (exit {rc})", flush=True)
    return rc != 0


def stage_child(args: argparse.Namespace) -> int:
    """The body of run_stage's child: exit status 1 when the stage found a failure."""
    if args.arch is None or args.deadline is None:
        print("--stage needs --arch and --deadline", file=sys.stderr)
        return 2
    if args.stage == "cpp":
        failed = cpp_against_python(args.out, args.arch, args.deadline)
    elif args.stage == "bench":
        failed = benchmark(args, args.deadline)
    else:
        failed = measure_crossover(args, args.arch, [sys.executable, "-m", "topkgen"], args.deadline)
    return 1 if failed else 0


def timer_name(choice: str) -> str:
    if choice == "events":
        return "CUDA events"
    if nvbench_module() is not None:
        return "nvbench (cuda-bench)"
    return "CUDA events (cuda-bench is not importable)" if choice == "auto" else "nvbench, which is not importable"


def nvbench_module():
    for name in ("cuda.bench", "cuda.nvbench"):
        try:
            return __import__(name, fromlist=["register"])
        except ImportError:
            continue
    return None


def aot_launch_cases(manifest: dict, arch: str) -> list[tuple[str, str, int, int, bool]]:
    """One (kernel, dtype, k, n, deterministic) per AOT kernel of `arch`: a shape its
    dispatch rows send to it when JIT is off, with n near 3000 where the row allows."""
    cases = {}
    for dtype, by_mode in sorted(manifest["dispatch"][arch].items()):
        for mode, rows in sorted(by_mode.items()):
            for row in rows:
                name = row["aot_fallback"]
                if name is None or name in cases:
                    continue
                (k_lo, k_hi), (n_lo, n_hi) = row["k"], row["n"]
                n = min(n_hi, max(n_lo, k_lo, 3000))
                cases[name] = (name, dtype, min(k_hi, n, max(k_lo, 50)), n, mode == "deterministic")
    return [cases[e["name"]] for e in manifest["kernels"] if e["arch"] == arch]


def cpp_against_python(out: str, arch: str, deadline: float) -> bool:
    """Both loaders launch the same AOT kernel on the same rows (JIT off, so the table's
    aot_fallback serves): values bit-equal; indices equal in deterministic mode, and in
    fast mode (ties in any order) pointing at the values."""
    import tempfile

    cpp = ROOT / "build" / "cpp" / "topkgen-cpp"
    if not cpp.exists():
        # `make cpp` needs the project's .venv (nlohmann's headers come from a wheel): where
        # there is none, make would create one and pip would install from the network.
        if not (ROOT / ".venv" / ".installed").exists():
            print(f"SKIPPED: {cpp.relative_to(ROOT)} is not built and there is no .venv to build it with "
                  f"(build it with `make cpp` on a machine with one, and bring build/cpp along)")
            return False
        if run(["make", "-s", "cpp"]) != 0:
            print("could not build the C++ loader")
            return True
    import torch

    from topkgen.manifest import reading as manifests
    from topkgen.runtime import TopK

    manifest, _ = manifests.load_manifest(out)
    os.environ["TOPKGEN_DISABLE_JIT"] = "1"
    failed = False
    try:
        op = TopK(out, backend="cuda")
        with tempfile.TemporaryDirectory() as tmp:
            for name, dtype, k, n, det in aot_launch_cases(manifest, arch):
                if time.monotonic() > deadline:
                    print("time budget spent: the remaining kernels are not compared")
                    break
                tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
                x = torch.randn(5, n, device="cuda").to(tdt)
                problems = []
                if op.choose(dtype, k, n, det).kernel != name:
                    problems.append(f"the Python runtime picks {op.choose(dtype, k, n, det).kernel}")
                for largest in (True, False):
                    values, indices = op(x, k, largest=largest, deterministic=det)
                    torch.cuda.synchronize()
                    raw = x.cpu().view(torch.int16 if dtype == "bfloat16" else torch.int32)
                    Path(tmp, "x.bin").write_bytes(raw.numpy().tobytes())
                    rc, stdout, stderr = run_captured([str(cpp), "launch", out, arch, dtype, str(k), str(n), "5",
                                                       "deterministic" if det else "fast", "0", str(int(largest)),
                                                       f"{tmp}/x.bin", f"{tmp}/v.bin", f"{tmp}/i.bin"])
                    if rc in (126, 127, None):  # it does not start here (another libc, libcrypto missing)
                        print(f"topkgen-cpp does not run on this machine: {stderr.strip()}")
                        return True
                    chunks = op.choose(dtype, k, n, det, 5).chunks
                    if rc != 0 or stdout.split() != [name, str(chunks)]:
                        problems.append(f"topkgen-cpp: exit {rc} {stdout.strip()} {stderr.strip()}")
                        continue
                    cpp_values = Path(tmp, "v.bin").read_bytes()
                    cpp_indices = torch.frombuffer(bytearray(Path(tmp, "i.bin").read_bytes()), dtype=torch.int64).view(5, k)
                    ours = values.cpu().view(raw.dtype).numpy().tobytes()
                    if cpp_values != ours:
                        problems.append(f"largest={largest}: values differ")
                    if det and not torch.equal(cpp_indices, indices.cpu()):
                        problems.append(f"largest={largest}: indices differ")
                    gathered = torch.gather(x.cpu(), 1, cpp_indices).view(raw.dtype).numpy().tobytes()
                    if gathered != cpp_values:
                        problems.append(f"largest={largest}: C++ indices do not point at its values")
                print(f"{name} k={k} n={n} {'det' if det else 'fast'}: {'; '.join(problems) or 'same'}", flush=True)
                failed |= bool(problems)
    finally:
        del os.environ["TOPKGEN_DISABLE_JIT"]
    return failed


def sanitize(bundle: str, deadline: float) -> bool:
    """memcheck and racecheck, each over one kernel of each family (SANITIZER_SHAPES) in one
    process: torch's start under a sanitizer costs tens of seconds, paid once per tool."""
    tool = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not Path(tool).exists():
        print("compute-sanitizer not found: skipped")
        return False
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r});"
            "import torch; from topkgen.runtime import TopK;"
            f"op = TopK({bundle!r}, backend='cuda');"
            "t = {'float32': torch.float32, 'bfloat16': torch.bfloat16};"
            f"shapes = {[shape[1:] for shape in SANITIZER_SHAPES]!r}\n"
            "for dtype, k, n in shapes:\n"
            "    x = torch.randn(3, n, device='cuda').to(t[dtype])\n"
            "    print(op.explain(dtype, k, n).kernel.name, flush=True)\n"
            "    v, i = op(x, k); v2, i2 = op(x, k, deterministic=True); torch.cuda.synchronize()\n")
    shapes = ", ".join(f"{family} {dtype} k={k} n={n}" for family, dtype, k, n in SANITIZER_SHAPES)
    failed = False
    for check in ("memcheck", "racecheck"):
        if time.monotonic() > deadline:
            print("time budget spent: the remaining sanitizer runs are skipped")
            return failed
        cmd = [tool, "--tool", check, "--error-exitcode", "3", sys.executable, "-c", code]
        print(f"$ {tool} --tool {check} --error-exitcode 3 {sys.executable} -c ...", flush=True)
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                                  timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"{check}: ran past the time budget; the rest are skipped")
            return failed
        output = proc.stdout + proc.stderr
        print(output[-4000:], end="" if output.endswith("\n") else "\n", flush=True)
        if proc.returncode not in (0, 3) and SANITIZER_REFUSED in output:
            print(f"compute-sanitizer refused this device ({SANITIZER_REFUSED!r}): skipped, not a failure")
            return failed
        rc = proc.returncode
        print(f"{check} ({shapes}): {'clean' if rc == 0 else f'FAILED (exit {rc})'}")
        failed |= rc != 0
    return failed


# ----------------------------------------------------------------------------- split crossover

def crossover_bundles(args, arch: str, topkgen: list[str], deadline: float | None = None) -> dict[str, Path] | None:
    """Two bundles of the same kernels whose policies split every batch they can ('split')
    and none ('unsplit'); the compile cache makes the second build of each kernel free."""
    from topkgen import policy

    args.work.mkdir(parents=True, exist_ok=True)
    variants = split_crossover.variant_policies(policy.default_policy_path().read_text(), arch)
    bundles = {}
    for name, text in variants.items():
        path = args.work / f"policy-{name}.yaml"
        path.write_text(text)
        bundles[name] = args.work / f"bundle-{name}"
        if run([*topkgen, "build", "--policy", str(path), "--arch", arch, "--out", str(bundles[name]),
                "-j", str(os.cpu_count() or 2)], deadline) != 0:
            return None
    return bundles


def crossover_listing(args, arch: str, topkgen: list[str]) -> int:
    """Without a GPU: the bundles are built and the grid's chunks listed, nothing timed."""
    from topkgen.runtime import TopK

    bundles = crossover_bundles(args, arch, topkgen)
    if bundles is None:
        return 1
    ops = {name: TopK(path, arch=arch, backend="emulator") for name, path in bundles.items()}
    grid = split_crossover.GRID
    split = sum(ops["split"].choose(d, k, n, rows=r).chunks > 1 for d, n, k, r in grid)
    unsplit = sum(ops["unsplit"].choose(d, k, n, rows=r).chunks > 1 for d, n, k, r in grid)
    print(f"would time {len(grid)} batches twice: the split bundle splits {split} of them, the unsplit one {unsplit}")
    return 0


def measure_crossover(args, arch: str, topkgen: list[str], deadline: float) -> bool:
    """Issue 14's crossover: each batch of benchmarks/split_crossover.py's grid, checked
    against torch.topk and timed from both bundles; RESULTS/split_crossover.json is what
    `python benchmarks/split_crossover.py ... --write` writes into the policy."""
    import torch

    from topkgen.runtime import TopK

    bundles = crossover_bundles(args, arch, topkgen, deadline)
    if bundles is None:
        return True
    ops = {name: TopK(path, backend="cuda") for name, path in bundles.items()}
    timer = EventTimer(torch, args.max_noise)
    device = torch.cuda.get_device_name(0)
    measured: list[split_crossover.Measured] = []
    failed = False
    grid = split_crossover.GRID
    try:
        for dtype, n, k, rows in grid:
            if time.monotonic() > deadline:
                print(f"time budget spent: {len(measured)} of {len(grid)} batches measured")
                break
            case = Case("crossover", rows, dtype, n, k, "normal")
            x = make_input(torch, case)
            expect, _ = torch.topk(x, k, dim=-1)
            medians = {}
            for name, op in ops.items():
                if not torch.equal(op(x, k)[0], expect):
                    print(f"MISMATCH against torch.topk ({name} bundle): {case.id}")
                    failed = True
                medians[name] = timer(launchers(torch, op, case, x)["topkgen"], max_seconds=0.5).median
            m = crossover_measured(ops["split"], dtype, n, k, rows, medians)
            print(f"{case.id}: {m.chunks} chunks {m.split_us:.1f} us, unsplit {m.unsplit_us:.1f} us", flush=True)
            measured.append(m)
            save_crossover(args.results, arch, device, measured)  # kept if the stage is killed later
            del x
    finally:  # the crossover of what was measured, whatever stopped the loop
        if measured:
            failed |= record_crossover(args.results, arch, device, measured)
    return failed


def crossover_measured(split_op, dtype: str, n: int, k: int, rows: int,
                       medians: dict[str, float]) -> split_crossover.Measured:
    """One batch's two medians, with the chunks per row the split bundle cut it into."""
    return split_crossover.Measured(dtype, n, k, rows, split_op.choose(dtype, k, n, rows=rows).chunks,
                                    medians["split"], medians["unsplit"])


def save_crossover(results: Path, arch: str, device: str, measured: list[split_crossover.Measured]) -> None:
    """RESULTS/split_crossover.json (what `benchmarks/split_crossover.py ... --write` reads)
    and its table, split_crossover.md."""
    split_crossover.write_results(results / "split_crossover.json", arch, device, measured, len(split_crossover.GRID))
    (results / "split_crossover.md").write_text(split_crossover.table(measured) + "\n")


def record_crossover(results: Path, arch: str, device: str, measured: list[split_crossover.Measured]) -> bool:
    """save_crossover, and the crossover the batches favour; True when they favour none."""
    from topkgen import policy

    save_crossover(results, arch, device, measured)
    now = policy.load().archs[arch].split
    try:
        found = split_crossover.choose_rows_below(measured)
    except ValueError as err:
        print(f"no crossover: {err}")
        return True
    print("\n" + split_crossover.summary(arch, device, now.rows_below if now else None, found))
    return False


# ----------------------------------------------------------------------------- inputs and launches

def torch_dtype(torch, name: str):
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def make_input(torch, case: Case):
    """The case's rows on the GPU, drawn there (same kinds as benchmarks/shapes.make_rows)."""
    g = torch.Generator(device="cuda").manual_seed(case.n + case.k + DATA_KINDS.index(case.data))
    shape = (case.rows, case.n)
    if case.data == "normal":
        x = torch.randn(shape, generator=g, device="cuda")
    elif case.data == "uniform":
        x = torch.rand(shape, generator=g, device="cuda")
    elif case.data == "all-equal":
        x = torch.full(shape, 0.75, device="cuda")
    elif case.data == "tie-heavy":
        x = torch.randint(0, 16, shape, generator=g, device="cuda").float() / 4
    else:
        x = torch.randn(shape, generator=g, device="cuda")
        x[torch.rand(shape, generator=g, device="cuda") < 0.9] = float("-inf")
    return x.to(torch_dtype(torch, case.dtype))


def launchers(torch, op, case: Case, x) -> dict:
    """impl -> enqueue(stream_handle), each issuing that implementation's work on the stream.
    topkgen gets its outputs and, for split rows, its workspace allocated beforehand."""
    values = torch.empty((case.rows, case.k), dtype=x.dtype, device="cuda")
    indices = torch.empty((case.rows, case.k), dtype=torch.int64, device="cuda")
    size = op.workspace_bytes(case.dtype, case.k, case.n, case.rows)
    workspace = torch.empty(size, dtype=torch.uint8, device="cuda") if size else None

    def ours(handle: int) -> None:
        op(x, case.k, out=(values, indices), stream=handle, workspace=workspace)

    def theirs(handle: int) -> None:
        with torch.cuda.stream(torch.cuda.ExternalStream(handle)):
            torch.topk(x, case.k, dim=-1)

    out = {"topkgen": ours, "torch": theirs}
    try:
        import flashinfer

        def flash(handle: int) -> None:
            with torch.cuda.stream(torch.cuda.ExternalStream(handle)):
                flashinfer.top_k(x, case.k, sorted=True)

        out["flashinfer"] = flash
    except ImportError:
        pass
    return out


def same_values(torch, op, case: Case, x) -> bool:
    values, _ = op(x, case.k)
    expect, _ = torch.topk(x, case.k, dim=-1)
    return bool(torch.equal(values, expect))


# ----------------------------------------------------------------------------- timing

def benchmark(args: argparse.Namespace, deadline: float) -> bool:
    """Checks every case against torch.topk, then times them; True when a case failed. The
    samples file (RESULTS/gpu_check_samples.json, which the table is made from) is rewritten
    after every case, so that a stage killed midway leaves what it timed."""
    import torch

    from topkgen.runtime import TopK

    op = TopK(args.out, backend="cuda")
    use_nvbench = args.timer == "nvbench" or (args.timer == "auto" and nvbench_module() is not None)
    if args.timer == "nvbench" and nvbench_module() is None:
        print("cuda-bench is not importable: falling back to CUDA events")
        use_nvbench = False
    mismatches: list[str] = []
    timings: dict[tuple[str, str], Timing] = {}

    def save() -> None:
        write_samples(args.results / SAMPLES, args.cases, timings, mismatches)

    for case in args.cases:  # correctness first: a wrong kernel's time means nothing
        if not same_values(torch, op, case, make_input(torch, case)):
            mismatches.append(case.id)
            print(f"MISMATCH against torch.topk: {case.id}")
    save()
    if use_nvbench:
        timings.update(time_nvbench(args, torch, op, deadline))
        save()
    else:
        time_events(args, torch, op, deadline, timings, save)
    return bool(mismatches)


def write_samples(path: Path, all_cases: list[Case], timings: dict[tuple[str, str], Timing],
                  mismatches: list[str]) -> None:
    raw = {f"{cid}|{impl}": asdict(t) for (cid, impl), t in timings.items()}
    text = json.dumps({"unit": "us", "cases": [asdict(c) | {"id": c.id} for c in all_cases], "timings": raw,
                       "mismatches": mismatches}, indent=1) + "\n"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # a reader never sees half a file, whenever the writer is killed


def read_samples(path: Path) -> dict[tuple[str, str], Timing]:
    """The timings write_samples wrote, by (case id, implementation)."""
    raw = json.loads(path.read_text())["timings"]
    return {tuple(key.split("|", 1)): Timing(**timing) for key, timing in raw.items()}


class Spinner:
    """A one-thread kernel that spins for SPIN_CYCLES, so that the GPU is busy while Python
    enqueues the timed work behind it."""

    def __init__(self, arch: str) -> None:
        import numpy as np

        from topkgen.build.compile import compile_kernel
        from topkgen.runtime.cuda_backend import _cuda_core

        self.core = _cuda_core()
        compiled = compile_kernel(SPIN_SOURCE, "topkgen_spin", arch)
        self.kernel = self.core.ObjectCode.from_cubin(compiled.cubin).get_kernel(compiled.symbol)
        self.config = self.core.LaunchConfig(grid=1, block=1)
        self.cycles = np.uint64(SPIN_CYCLES)

    def __call__(self, handle: int) -> None:
        self.core.launch(self.core.Stream.from_handle(handle), self.config, self.kernel, self.cycles)


def relative_error(samples: list[float]) -> float:
    """Standard error of the mean over the mean: the noise the stopping rule looks at."""
    if len(samples) < 2:
        return float("inf")
    return statistics.stdev(samples) / len(samples) ** 0.5 / statistics.mean(samples)


def pci_bus_id(device_index: int) -> str:
    """The PCI bus id ("0000:17:00.0") of the CUDA device `device_index` (CUDA's numbering,
    which CUDA_VISIBLE_DEVICES reorders and filters), the one name CUDA and NVML share:
    NVML's own index 0 is the machine's first GPU, which need not be the benchmark's."""
    from topkgen.runtime.cuda_backend import _cuda_core

    return _cuda_core().Device(device_index).pci_bus_id


def sm_clock_mhz(torch) -> float | None:
    """The SM clock of the GPU the benchmark runs on (torch's current device) now, through
    NVML: torch's (nvidia-ml-py, which torch 2.11 does not require), else cuda-bindings' own
    NVML module (13.x wheels carry one), which finds the device by its PCI bus id; None
    without either, and the log says once that throttled batches are then kept."""
    try:
        return float(torch.cuda.clock_rate())
    except Exception as err:
        torch_err = err
    try:
        from cuda.bindings import nvml

        nvml.init_v2()
        handle = nvml.device_get_handle_by_pci_bus_id_v2(pci_bus_id(torch.cuda.current_device()))
        return float(nvml.device_get_clock_info(handle, nvml.ClockType.SM))
    except Exception as err:
        if not getattr(sm_clock_mhz, "told", False):
            sm_clock_mhz.told = True
            print(f"no SM clock (torch: {torch_err}; cuda.bindings.nvml: {err}): throttled batches are not dropped",
                  flush=True)
        return None


class EventTimer:
    """CUDA events around one enqueue at a time: a spin kernel ahead of it keeps Python's
    dispatch out of the window, and the L2 is flushed before every sample."""

    def __init__(self, torch, max_noise: float) -> None:
        from topkgen.runtime.cuda_backend import _CudaBackend

        self.torch, self.max_noise = torch, max_noise
        self.spin = Spinner(_CudaBackend().current_arch())
        l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size  # the flushed GPU's
        self.flush = torch.empty(2 * l2, dtype=torch.uint8, device="cuda")
        self.stream = torch.cuda.Stream()

    def __call__(self, enqueue, min_samples: int = 20, max_samples: int = 200, max_seconds: float = 1.5) -> Timing:
        """Batches of 10 samples until the noise is below max_noise, or max_samples, or
        max_seconds; a batch whose SM clock fell below 90% of the highest seen is dropped."""
        torch, stream = self.torch, self.stream
        timing = Timing("events")
        started, top_clock = time.monotonic(), 0.0
        while True:
            pairs = []
            with torch.cuda.stream(stream):
                for _ in range(10):
                    self.flush.zero_()
                    self.spin(stream.cuda_stream)
                    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    begin.record(stream)
                    enqueue(stream.cuda_stream)
                    end.record(stream)
                    pairs.append((begin, end))
            stream.synchronize()
            batch = [begin.elapsed_time(end) * 1e3 for begin, end in pairs]
            clock = sm_clock_mhz(torch)
            top_clock = max(top_clock, clock or 0.0)
            if clock is not None and clock < 0.9 * top_clock:
                timing.dropped += len(batch)  # throttled
            else:
                timing.samples += batch
            n = len(timing.samples)
            if n >= max_samples or time.monotonic() - started > max_seconds or (
                    n >= min_samples and relative_error(timing.samples) < self.max_noise / 100):
                return timing


def time_events(args, torch, op, deadline: float, timings: dict[tuple[str, str], Timing],
                save: Callable[[], None]) -> None:
    timer = EventTimer(torch, args.max_noise)
    for case in args.cases:
        x = make_input(torch, case)
        for impl, enqueue in launchers(torch, op, case, x).items():
            if time.monotonic() > deadline:
                timings[(case.id, impl)] = Timing("events", note="time budget spent")
                continue
            timings[(case.id, impl)] = timer(enqueue)
        del x
        save()


def time_nvbench(args, torch, op, deadline: float) -> dict[tuple[str, str], Timing]:
    bench = nvbench_module()
    by_id = {c.id: c for c in args.cases}
    current: dict[str, object] = {}

    def topk_bench(state) -> None:
        case, impl = by_id[state.get_string("case")], state.get_string("impl")
        if time.monotonic() > deadline:
            state.skip("time budget spent")
            return
        if current.get("id") != case.id:  # one input at a time on the GPU
            current.clear()
            current["x"] = make_input(torch, case)
            current["id"] = case.id
        enqueue = launchers(torch, op, case, current["x"]).get(impl)
        if enqueue is None:
            state.skip(f"{impl} is not importable")
            return
        state.add_global_memory_reads(case.input_bytes)
        state.set_throttle_threshold(0.75)
        state.exec(lambda launch: enqueue(launch.get_stream().addressof()), batched=False)

    b = bench.register(topk_bench)
    b.add_string_axis("case", [c.id for c in args.cases])
    b.add_string_axis("impl", list(IMPLS))
    args.work.mkdir(parents=True, exist_ok=True)
    path = args.work / "nvbench.json"  # and its folder of sample files
    bench.run_all_benchmarks(["gpu_check", "--jsonbin", str(path), "--max-noise", str(args.max_noise),
                              "--min-time", "0.05", "--timeout", "2"])
    return read_nvbench(path)


def read_nvbench(path: Path) -> dict[tuple[str, str], Timing]:
    """Timings from nvbench's JSON and its sample sidecar files (seconds, float32)."""
    import numpy as np

    doc = json.loads(path.read_text())
    out: dict[tuple[str, str], Timing] = {}
    for bench in doc.get("benchmarks", []):
        for state in bench.get("states", []):
            axes = {a["name"]: a["value"] for a in state.get("axis_values", [])}
            key = (axes.get("case"), axes.get("impl"))
            if state.get("is_skipped"):
                out[key] = Timing("nvbench", note=state.get("skip_reason", "skipped"))
                continue
            timing = Timing("nvbench")
            summaries = {s.get("tag"): {d["name"]: d["value"] for d in s.get("data", [])}
                         for s in state.get("summaries", [])}
            bulk = summaries.get("nv/json/bin:nv/cold/sample_times", {})
            if "filename" in bulk:  # relative to the JSON file's folder unless absolute
                times = np.fromfile(path.parent / bulk["filename"], dtype="<f4", count=int(bulk["size"]))
                timing.samples = [float(t) * 1e6 for t in times]
            else:
                for tag in ("nv/cold/time/gpu/median", "nv/cold/time/gpu/mean"):
                    if tag in summaries:
                        timing.samples = [float(summaries[tag]["value"]) * 1e6]
                        timing.note = f"{tag.rsplit('/', 1)[1]} only (no sample file)"
                        break
            out[key] = timing
    return out


# ----------------------------------------------------------------------------- ncu

def ncu_tool() -> str | None:
    found = shutil.which("ncu")
    if found:
        return found
    return "/usr/local/cuda/bin/ncu" if Path("/usr/local/cuda/bin/ncu").exists() else None


def ncu_cases(all_cases: list[Case]) -> list[Case]:
    """One case per shape and batch: normal data."""
    return [c for c in all_cases if c.data == "normal"]


def _served(all_cases: list[Case], arch: str) -> dict[str, tuple[Case, Any]]:
    """Each case with how the default policy (the bundle's) serves it (its Selection)."""
    from topkgen import policy

    loaded = policy.load()
    return {c.id: (c, policy.select(loaded, arch, c.dtype, c.k, c.n, rows=c.rows)) for c in all_cases}


def chunks_per_row(all_cases: list[Case], arch: str) -> dict[str, int]:
    """How the default policy (the bundle's) runs each case: chunks per row, 1 unsplit."""
    return {cid: sel.chunks for cid, (_, sel) in _served(all_cases, arch).items()}


def launches_per_call(all_cases: list[Case], arch: str) -> dict[str, int]:
    """The launches the runtime makes for each case, as topkgen.policy.split.stages plans
    them: one unsplit, a split's two, or its one where the kernel merges (schema 7)."""
    from topkgen.policy.split import stages

    return {cid: len(stages(c.rows, c.n, c.k, True, sel.split)) for cid, (c, sel) in _served(all_cases, arch).items()}


def ncu_dram_per_row(args, deadline: float, per_call: dict[str, int]) -> dict[str, tuple[float, float]]:
    tool = ncu_tool()
    if tool is None:
        print("ncu not found: skipped")
        return {}
    chosen = ncu_cases(args.cases)
    args.work.mkdir(parents=True, exist_ok=True)
    listing = args.work / "ncu_cases.json"
    listing.write_text(json.dumps([asdict(c) for c in chosen]))
    log = args.results / "ncu.csv"
    cmd = [tool, "--clock-control", "none", "--metrics", ",".join(NCU_METRICS), "--csv", "--log-file", str(log),
           "--kernel-name", "regex:^topk_", sys.executable, str(Path(__file__).resolve()), "--out", args.out,
           "--ncu-child", str(listing)]
    try:
        rc = run(cmd, timeout=max(10.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        print("ncu ran out of the time budget: no DRAM figures")
        return {}
    if rc != 0 or not log.exists():
        print(f"ncu failed or was refused (exit {rc}): no DRAM figures")
        return {}
    per_launch = parse_ncu_csv(log.read_text())
    launches = [per_call[c.id] for c in chosen]
    if len(per_launch) != sum(launches):
        print(f"ncu reported {len(per_launch)} topk launches for {sum(launches)} expected: no DRAM figures")
        return {}
    out, at = {}, 0
    for c, count in zip(chosen, launches):
        read, write = (sum(values) for values in zip(*per_launch[at:at + count]))
        out[c.id] = (read / c.rows, write / c.rows)
        at += count
    return out


def ncu_child(args) -> int:
    """Runs each listed case once through the runtime: the launches ncu profiles, in order."""
    import torch

    from topkgen.runtime import TopK

    op = TopK(args.out, backend="cuda")
    for item in json.loads(Path(args.ncu_child).read_text()):
        case = Case(**item)
        x = make_input(torch, case)
        op(x, case.k)
        torch.cuda.synchronize()
    return 0


_UNITS = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def parse_ncu_csv(text: str) -> list[tuple[float, float]]:
    """(DRAM bytes read, written) per profiled launch, in launch order, from `ncu --csv`."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    launches: dict[int, dict[str, float]] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        if row.get("Metric Name") not in NCU_METRICS:
            continue
        value = float(row["Metric Value"].replace(",", "")) * _UNITS.get(row.get("Metric Unit", "byte"), 1)
        launches.setdefault(int(row["ID"]), {})[row["Metric Name"]] = value
    return [(m.get(NCU_METRICS[0], 0.0), m.get(NCU_METRICS[1], 0.0)) for _, m in sorted(launches.items())]


# ----------------------------------------------------------------------------- table

def format_table(all_cases: list[Case], timings: dict[tuple[str, str], Timing],
                 dram: dict[str, tuple[float, float]], chunks: dict[str, int] | None = None) -> str:
    """Medians side by side per case: topkgen (and the chunks per row its policy split each
    row into), torch.topk, flashinfer.top_k, the speedup over torch, the fraction of 4.8 TB/s
    that reading the input once reaches, and ncu's DRAM bytes read per row against the row's
    size."""
    chunks = chunks or {}
    head = ("| set | dtype | rows | N | K | data | chunks | topkgen us | torch us | flashinfer us | vs torch "
            "| of 4.8 TB/s | samples (dropped) | DRAM read/row (x row) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for c in all_cases:
        ours, torch_t, flash = (timings.get((c.id, impl)) for impl in IMPLS)

        def us(t: Timing | None) -> str:
            return f"{t.median:.1f}" if t is not None and t.median is not None else "n/a"

        speedup = (f"{torch_t.median / ours.median:.2f}x" if ours and torch_t and ours.median and torch_t.median
                   else "n/a")
        peak = f"{c.input_bytes / (ours.median * 1e-6) / PEAK_BYTES_PER_S:.1%}" if ours and ours.median else "n/a"
        counts = f"{len(ours.samples)} ({ours.dropped})" if ours else "n/a"
        row_bytes = c.input_bytes / c.rows
        read = f"{dram[c.id][0]:.0f} ({dram[c.id][0] / row_bytes:.2f}x)" if c.id in dram else "n/a"
        lines.append(f"| {c.set} | {c.dtype} | {c.rows} | {c.n} | {c.k} | {c.data} | {chunks.get(c.id, 'n/a')} "
                     f"| {us(ours)} | {us(torch_t)} "
                     f"| {us(flash)} | {speedup} | {peak} | {counts} | {read} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
