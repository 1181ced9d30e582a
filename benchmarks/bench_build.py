"""`topkgen build` of the default policy: cold build, warm rebuild, and (where nvcc is on the
machine) the same rendered sources compiled by one `nvcc -cubin` process per kernel with
the same parallelism. Medians, measured side by side in one run."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JOBS = int(os.environ.get("JOBS", "2"))
REPEAT = int(os.environ.get("REPEAT", "3"))


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def topkgen_build(out: Path, cache: Path) -> None:
    env = {**os.environ, "TOPKGEN_CACHE_DIR": str(cache)}
    subprocess.run([sys.executable, "-m", "topkgen.cli", "build", "--out", str(out), "-j", str(JOBS)],
                   check=True, env=env, stdout=subprocess.DEVNULL, cwd=ROOT)


def nvcc_build(nvcc: str, sources: list[tuple[str, str, str]], work: Path) -> None:
    from topkgen.paths import cuda_include_dir

    def one(item: tuple[str, str, str]) -> None:
        name, arch, text = item
        src = work / f"{name}.cu"
        src.write_text(text)
        subprocess.run([nvcc, "-cubin", f"-arch={arch}", "-std=c++17", f"-I{cuda_include_dir()}", str(src),
                        "-o", str(work / f"{name}.cubin")], check=True, capture_output=True)

    with ThreadPoolExecutor(JOBS) as pool:
        list(pool.map(one, sources))


def main() -> None:
    from topkgen import policy, render

    pol = policy.load()
    sources = [(s.name, s.arch, render.render(s)) for a in pol.archs for s in policy.plan(pol, a)]
    nvcc = shutil.which("nvcc")
    cold, warm, via_nvcc = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        for i in range(REPEAT):
            cache, out = base / f"cache{i}", base / f"out{i}"
            cold.append(timed(lambda: topkgen_build(out, cache)))
            warm.append(timed(lambda: topkgen_build(out, cache)))
            if nvcc:
                work = base / f"nvcc{i}"
                work.mkdir()
                via_nvcc.append(timed(lambda: nvcc_build(nvcc, sources, work)))
    print(f"default policy, {len(sources)} kernels, -j {JOBS}, median of {REPEAT} runs (whole process)")
    print(f"  topkgen build, cold cache:  {statistics.median(cold):7.2f} s")
    print(f"  topkgen build, warm cache:  {statistics.median(warm):7.2f} s")
    if via_nvcc:
        ratio = statistics.median(via_nvcc) / statistics.median(cold)
        print(f"  nvcc -cubin per kernel:     {statistics.median(via_nvcc):7.2f} s  "
              f"(topkgen cold build is {ratio:.2f}x faster)")
    else:
        print("  nvcc not found: no nvcc comparison")


if __name__ == "__main__":
    main()
