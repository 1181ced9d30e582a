"""`make gpu-check`: the device checks, as one script for the accelerator machine.

1. build the default bundle for the GPU's arch;
2. run the GPU tests (tests/test_gpu.py);
3. launch every AOT kernel through the C++ loader (build/cpp/topkgen-cpp, `make cpp`) and
   through the Python runtime on the same input, and compare the outputs;
4. run compute-sanitizer (memcheck, racecheck) on one kernel of each family;
5. benchmark against torch.topk with CUDA events over rows {1, 132, 1024, 4096} x
   n {256, 1024, 2048, 8192, 32768, 131072, 262144} x k {16, 64, 256, 1024} (k <= n),
   float32 and bfloat16: median time, speedup over torch.topk, and the fraction of the
   H200's 4.8 TB/s that reading the input reaches.
Without a GPU it says so, builds for sm_90 and collects the GPU tests, and exits 0.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(os.environ.get("GPU_CHECK_OUT", ROOT / "out-gpu-check"))
PEAK_BYTES_PER_S = 4.8e12
ROWS = (1, 132, 1024, 4096)
NS = (256, 1024, 2048, 8192, 32768, 131072, 262144)
KS = (16, 64, 256, 1024)
SANITIZER_SHAPES = (("register", "float32", 16, 1000), ("radix", "float32", 64, 300000),
                    ("radix", "bfloat16", 200, 1500))


def step(title: str) -> None:
    print(f"\n=== {title}", flush=True)


def run(cmd: list[str], **kw) -> int:
    print("$ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=ROOT, **kw).returncode


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from topkgen.runtime import gpu_unavailable

    reason = gpu_unavailable()
    topkgen = [sys.executable, "-m", "topkgen.cli"]
    if reason is not None:
        print(f"no GPU: {reason}. Running the CPU-side parts only (build for sm_90, collect the GPU tests).")
        step("build (sm_90)")
        status = run([*topkgen, "build", "--arch", "sm_90", "--out", str(OUT)])
        step("GPU tests: collection only")
        status |= run([sys.executable, "-m", "pytest", "-q", "--collect-only", "tests/test_gpu.py"])
        return status
    from topkgen.runtime import _CudaBackend

    arch = _CudaBackend().current_arch()
    started = time.time()
    step(f"build ({arch})")
    if run([*topkgen, "build", "--arch", arch, "--out", str(OUT)]) != 0:
        return 1
    step("GPU tests")
    failed = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_gpu.py"]) != 0
    step("C++ loader against the Python runtime: every AOT kernel")
    failed |= cpp_against_python(arch)
    step("compute-sanitizer")
    failed |= sanitize(arch)
    step("benchmark against torch.topk")
    benchmark()
    print(f"\ngpu-check finished in {time.time() - started:.0f} s{' with FAILURES' if failed else ''}")
    return 1 if failed else 0


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


def cpp_against_python(arch: str) -> bool:
    """Both loaders launch the same AOT kernel on the same rows (JIT off, so the table's
    aot_fallback serves): values bit-equal; indices equal in deterministic mode, and in
    fast mode (ties in any order) pointing at the values."""
    import tempfile

    import torch

    from topkgen import bundle
    from topkgen.runtime import TopK

    cpp = ROOT / "build" / "cpp" / "topkgen-cpp"
    if not cpp.exists() and run(["make", "-s", "cpp"]) != 0:
        print("could not build the C++ loader")
        return True
    manifest, _ = bundle.load_manifest(OUT)
    os.environ["TOPKGEN_DISABLE_JIT"] = "1"
    failed = False
    try:
        op = TopK(OUT, backend="cuda")
        with tempfile.TemporaryDirectory() as tmp:
            for name, dtype, k, n, det in aot_launch_cases(manifest, arch):
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
                    proc = subprocess.run([str(cpp), "launch", str(OUT), arch, dtype, str(k), str(n), "5",
                                           "deterministic" if det else "fast", "0", str(int(largest)),
                                           f"{tmp}/x.bin", f"{tmp}/v.bin", f"{tmp}/i.bin"], capture_output=True, text=True)
                    if proc.returncode != 0 or proc.stdout.strip() != name:
                        problems.append(f"topkgen-cpp: exit {proc.returncode} {proc.stdout.strip()} {proc.stderr.strip()}")
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


def sanitize(arch: str) -> bool:
    tool = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not Path(tool).exists():
        print("compute-sanitizer not found: skipped")
        return False
    failed = False
    for family, dtype, k, n in SANITIZER_SHAPES:
        code = (f"import sys; sys.path.insert(0, {str(ROOT)!r});"
                "import torch; from topkgen.runtime import TopK;"
                f"op = TopK({str(OUT)!r}, backend='cuda');"
                f"t = {{'float32': torch.float32, 'bfloat16': torch.bfloat16}}[{dtype!r}];"
                f"x = torch.randn(3, {n}, device='cuda').to(t);"
                f"print(op.explain({dtype!r}, {k}, {n}).kernel.name);"
                f"v, i = op(x, {k}); v2, i2 = op(x, {k}, deterministic=True); torch.cuda.synchronize()")
        for check in ("memcheck", "racecheck"):
            rc = run([tool, "--tool", check, "--error-exitcode", "3", sys.executable, "-c", code])
            print(f"{check} {family} {dtype} k={k} n={n}: {'clean' if rc == 0 else f'FAILED (exit {rc})'}")
            failed |= rc != 0
    return failed


def benchmark() -> None:
    import torch

    from topkgen.runtime import TopK

    op = TopK(OUT, backend="cuda")
    print(f"{'dtype':<9}{'rows':>6}{'n':>8}{'k':>6}  {'kernel':<40}{'src':>4}{'topkgen us':>12}{'torch us':>10}"
          f"{'speedup':>9}{'of 4.8TB/s':>11}")
    for dtype, tdt in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        for rows in ROWS:
            for n in NS:
                x = torch.randn(rows, n, device="cuda").to(tdt)
                for k in KS:
                    if k > n:
                        continue
                    sel = op.explain(dtype, k, n)
                    ours = _median_ms(lambda: op(x, k))
                    theirs = _median_ms(lambda: torch.topk(x, k, dim=-1))
                    fraction = rows * n * x.element_size() / (ours / 1e3) / PEAK_BYTES_PER_S
                    print(f"{dtype:<9}{rows:>6}{n:>8}{k:>6}  {sel.kernel.name:<40}{sel.source:>4}"
                          f"{ours * 1e3:>12.1f}{theirs * 1e3:>10.1f}{theirs / ours:>8.2f}x{fraction:>10.1%}",
                          flush=True)
                del x


def _median_ms(fn, repeat: int = 15) -> float:
    import torch

    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


if __name__ == "__main__":
    sys.exit(main())
