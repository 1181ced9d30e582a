"""`topkgen build` of the default policy: cold build, warm local cache, a cold build that also
fills a remote cache, and a warm remote-only build (empty local cache, every kernel from the
remote), plus (where nvcc is on the machine) the same rendered sources compiled by one
`nvcc -cubin` process per kernel with the same parallelism. Medians, measured side by side
in one run. The remote is a real S3 protocol server (moto, on localhost, in this process)
when moto and s3fs are installed (`make install` installs them), else a file:// directory."""

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


def topkgen_build(out: Path, cache: Path, remote: dict[str, str] | None = None) -> str:
    env = {**os.environ, "TOPKGEN_CACHE_DIR": str(cache), **(remote or {})}
    if remote is None:
        env.pop("TOPKGEN_CACHE_URL", None)
    proc = subprocess.run([sys.executable, "-m", "topkgen", "build", "--out", str(out), "-j", str(JOBS)],
                          check=True, env=env, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    return next(line.strip() for line in proc.stdout.splitlines() if line.startswith("  cache: "))


def s3_remote(base: Path):
    """A moto S3 server in this process and the environment a CI job would point at it, or
    a file:// remote where moto is not installed. Returns (env maker, label, stop)."""
    try:
        import boto3
        from moto.server import ThreadedMotoServer
    except ImportError:
        return (lambda i: {"TOPKGEN_CACHE_URL": f"file://{base}/remote{i}"}), "file:// directory", lambda: None
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    creds = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="bench", aws_secret_access_key="bench",
                 region_name="us-east-1").create_bucket(Bucket="bench")
    env = {**creds, "AWS_ENDPOINT_URL_S3": endpoint, "AWS_EC2_METADATA_DISABLED": "true", "NO_PROXY": "127.0.0.1"}
    return (lambda i: {**env, "TOPKGEN_CACHE_URL": f"s3://bench/run{i}"}), "S3 (moto server on localhost)", server.stop


def nvcc_build(nvcc: str, sources: list[tuple[str, str, str]], work: Path) -> None:
    from topkgen.common.paths import cuda_include_dir

    def one(item: tuple[str, str, str]) -> None:
        name, arch, text = item
        src = work / f"{name}.cu"
        src.write_text(text)
        subprocess.run([nvcc, "-cubin", f"-arch={arch}", "-std=c++17", f"-I{cuda_include_dir()}", str(src),
                        "-o", str(work / f"{name}.cubin")], check=True, capture_output=True)

    with ThreadPoolExecutor(JOBS) as pool:
        list(pool.map(one, sources))


VARIANTS = ("cold", "warm local", "cold + upload", "warm remote-only")


def main() -> None:
    from topkgen import policy
    from topkgen.build import render

    pol = policy.load()
    sources = [(s.name, s.arch, render.render(s)) for a in pol.archs for s in policy.plan(pol, a)]
    nvcc = shutil.which("nvcc")
    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    lines: dict[str, str] = {}
    via_nvcc = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        remote, remote_label, stop = s3_remote(base)
        try:
            for i in range(REPEAT):
                runs = {"cold": (base / f"cache{i}", None), "warm local": (base / f"cache{i}", None),
                        "cold + upload": (base / f"upload{i}", remote(i)),
                        "warm remote-only": (base / f"fresh{i}", remote(i))}  # empty local, full remote
                for variant, (cache, env) in runs.items():  # in this order: each warm run follows its cold one
                    start = time.perf_counter()
                    lines[variant] = topkgen_build(base / f"out{i}", cache, env)
                    samples[variant].append(time.perf_counter() - start)
                if nvcc:
                    work = base / f"nvcc{i}"
                    work.mkdir()
                    via_nvcc.append(timed(lambda: nvcc_build(nvcc, sources, work)))
        finally:
            stop()
    median = {v: statistics.median(samples[v]) for v in VARIANTS}
    print(f"default policy, {len(sources)} kernels, -j {JOBS}, median of {REPEAT} runs (whole process); "
          f"remote: {remote_label}")
    for variant in VARIANTS:
        print(f"  topkgen build, {variant + ':':18s} {median[variant]:7.2f} s   {lines[variant]}")
    print(f"  warm local is {median['cold'] / median['warm local']:.1f}x and warm remote-only "
          f"{median['cold'] / median['warm remote-only']:.1f}x faster than cold")
    if via_nvcc:
        ratio = statistics.median(via_nvcc) / median["cold"]
        print(f"  nvcc -cubin per kernel:     {statistics.median(via_nvcc):7.2f} s  "
              f"(topkgen cold build is {ratio:.2f}x faster)")
    else:
        print("  nvcc not found: no nvcc comparison")


if __name__ == "__main__":
    main()
