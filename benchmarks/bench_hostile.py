"""Each refusal of issue 33's hostile inputs, timed, with the peak memory of the refusing
process: every one should take under 2 s and 2 GiB on a 2-core machine. A benchmark, not a
test: `make bench-hostile` prints one line per case and exits 1 if any is over.

Builds the tiny test policy's bundle through TOPKGEN_CACHE_DIR (or ~/.cache/topkgen) first."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.system.test_hostile_cache2 import _bomb  # noqa: E402
from tests.support.tiny import TINY_POLICY  # noqa: E402

TOPKGEN = [sys.executable, "-m", "topkgen"]
CPP = str(ROOT / "build" / "cpp" / "topkgen-cpp")
SECONDS, BYTES = 2.0, 2 << 30


def measure(argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> tuple[float, int, int, str]:
    """Wall seconds, peak RSS bytes, exit status and the first line of stderr."""
    with tempfile.NamedTemporaryFile("r") as report:  # GNU time: the child's own peak, not this process's at fork
        start = time.perf_counter()
        proc = subprocess.run(["/usr/bin/time", "-o", report.name, "-f", "%M", *argv], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                              cwd=cwd)
        seconds = time.perf_counter() - start
        peak = int(report.read().split()[-1]) * 1024
    err = proc.stderr.decode(errors="replace")
    first = next((ln for ln in err.splitlines() if not ln.startswith("Command exited")), "")
    return seconds, peak, proc.returncode, first


def main() -> int:
    over = 0
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "tiny.yaml").write_text(TINY_POLICY)
        subprocess.run([*TOPKGEN, "build", "--policy", str(tmp / "tiny.yaml"), "--out", str(tmp / "tiny")], check=True,
                       capture_output=True)
        manifest = json.loads((tmp / "tiny" / "manifest.json").read_text())
        kernel = manifest["kernels"][0]
        cases: list[tuple[str, list[str], dict[str, str]]] = []

        for how in ("headers", "symbols"):  # 5: ELF bombs
            bundle = tmp / f"bomb-{how}"
            shutil.copytree(tmp / "tiny", bundle)
            doc = json.loads((bundle / "manifest.json").read_text())
            data = _bomb((bundle / kernel["cubin"]).read_bytes(), how)
            (bundle / kernel["cubin"]).write_bytes(data)
            doc["kernels"][0].update(sha256=hashlib.sha256(data).hexdigest(), size_bytes=len(data))
            (bundle / "manifest.json").write_text(json.dumps(doc))
            cases += [(f"ELF bomb ({how}): show", [*TOPKGEN, "show", str(bundle)], {}),
                      (f"ELF bomb ({how}): cache import", [*TOPKGEN, "cache", "import", str(bundle)],
                       {"TOPKGEN_CACHE_DIR": str(tmp / f"cache-{how}")}),
                      (f"ELF bomb ({how}): topkgen-cpp verify", [CPP, "verify", str(bundle)], {})]

        near = (64 << 20) - 64  # 6: manifests just under the cap
        for name, text in (("[0,0,...]", lambda: "[" + "0," * ((near - 2) // 2) + "0]"),
                           ("[[],[],...]", lambda: "[" + "[]," * ((near - 2) // 3) + "[]]"),
                           ("{ blanks }", lambda: "{" + " " * (near - 2) + "}"),
                           ("4M zeros", lambda: "[" + "0," * ((1 << 22) - 8) + "0]")):
            bundle = tmp / f"manifest-{len(cases)}"
            bundle.mkdir()
            (bundle / "manifest.json").write_text(text())
            cases += [(f"manifest {name}: show", [*TOPKGEN, "show", str(bundle)], {}),
                      (f"manifest {name}: topkgen-cpp verify", [CPP, "verify", str(bundle)], {})]
        line = "- {arch: sm_90, dtype: float32, k: 8, n: 4096}\n"
        (tmp / "shapes15.yaml").write_text(line * ((15 << 20) // len(line)))
        (tmp / "shapes1.yaml").write_text(line * ((1 << 20) // len(line) - 1) + "- {arch: sm_90, k: 8}\n")
        policy = str(ROOT / "policies" / "topk.yaml")
        cases += [("--shapes 15 MiB YAML", [*TOPKGEN, "diff", policy, policy, "--shapes", str(tmp / "shapes15.yaml")], {}),
                  ("--shapes 1 MiB YAML, error at the end",
                   [*TOPKGEN, "diff", policy, policy, "--shapes", str(tmp / "shapes1.yaml")], {})]

        lying = tmp / "lying-cache"  # 2: a record that lies
        subprocess.run([*TOPKGEN, "cache", "import", str(tmp / "tiny")], check=True, capture_output=True,
                       env={**os.environ, "TOPKGEN_CACHE_DIR": str(lying)})
        record_path = lying / "nvrtc-store" / "ac" / f"{kernel['cache_key']}.json"
        record = json.loads(record_path.read_text())
        record["resources"]["registers"] = 1
        record_path.write_text(json.dumps(record))
        cases.append(("cache record claiming 1 register: build",
                      [*TOPKGEN, "build", "--policy", str(tmp / "tiny.yaml"), "--out", str(tmp / "o1")],
                      {"TOPKGEN_CACHE_DIR": str(lying)}))
        linked = tmp / "linked-cache"  # 4: a symlinked cache folder
        (linked / "nvrtc-store").mkdir(parents=True)
        (tmp / "elsewhere").mkdir()
        (linked / "nvrtc-store" / "cas").symlink_to(tmp / "elsewhere")
        cases.append(("cache nvrtc-store/cas a symlink: build",
                      [*TOPKGEN, "build", "--policy", str(tmp / "tiny.yaml"), "--out", str(tmp / "o2")],
                      {"TOPKGEN_CACHE_DIR": str(linked)}))
        repo = tmp / "repo"  # 8: a FIFO as the working tree's policy
        (repo / "policies").mkdir(parents=True)
        shutil.copy(policy, repo / "policies" / "topk.yaml")
        for git in (["init", "-q"], ["add", "."], ["-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "p"]):
            subprocess.run(["git", "-C", str(repo), *git], check=True, capture_output=True)
        (repo / "policies" / "topk.yaml").unlink()
        os.mkfifo(repo / "policies" / "topk.yaml")
        cases.append(("diff HEAD, working-tree policy a FIFO", [*TOPKGEN, "diff", "HEAD"], {"_cwd": str(repo)}))

        branch = tmp / "branch"  # 7: a branch under review whose templates hang or crash a renderer
        shutil.copytree(ROOT / "policies", branch / "policies")
        shutil.copytree(ROOT / "templates", branch / "templates")
        for git in (["init", "-q"], ["add", "-A"], ["-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "base"]):
            subprocess.run(["git", "-C", str(branch), *git], check=True, capture_output=True)
        base = subprocess.run(["git", "-C", str(branch), "rev-parse", "HEAD"], check=True, capture_output=True,
                              text=True).stdout.strip()
        for name, text in (("nested range loops", "{% for a in range(4000) %}{% for b in range(4000) %}"
                                                  "{% for c in range(4000) %}{% endfor %}{% endfor %}{% endfor %}"),
                           ("'x' * 10**10", "{{ 'x' * 10000000000 }}"), ("2 ** 10**11", "{{ 2 ** 100000000000 }}"),
                           ("lipsum(10**8)", "{{ lipsum(100000000) }}"), ("a format width of 2 GB",
                                                                         "{{ '%02000000000d' % 1 }}"),
                           ("a recursive macro", "{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}"),
                           ("a self-include", "{% include 'radix_select.cu.j2' %}")):
            (branch / "templates" / "radix_select.cu.j2").write_text(text)
            for git in (["add", "-A"], ["-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", name]):
                subprocess.run(["git", "-C", str(branch), *git], check=True, capture_output=True)
            rev = subprocess.run(["git", "-C", str(branch), "rev-parse", "HEAD"], check=True, capture_output=True,
                                 text=True).stdout.strip()
            cases.append((f"diff of a template with {name}", [*TOPKGEN, "diff", base, rev, "--stat"],
                          {"_cwd": str(branch)}))
        for i in range(300):
            (branch / "templates" / f"junk{i}.cuh").write_bytes(b"/" * (64 << 10))
        for git in (["add", "-A"], ["-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "many"]):
            subprocess.run(["git", "-C", str(branch), *git], check=True, capture_output=True)
        cases.append(("diff of a revision of 300 template files", [*TOPKGEN, "diff", base, "HEAD", "--stat"],
                      {"_cwd": str(branch)}))

        print(f"{'case':58} {'seconds':>8} {'peak MiB':>9} exit  first line")
        for name, argv, env in cases:
            cwd = env.pop("_cwd", None)
            seconds, peak, code, first = measure(argv, env, Path(cwd) if cwd else None)
            bad = seconds >= SECONDS or peak >= BYTES or code != 2
            over += bad
            print(f"{name:58} {seconds:8.2f} {peak / (1 << 20):9.0f} {code:4}  {'OVER ' if bad else ''}{first[:110]}")
    print(f"{len(cases) - over} of {len(cases)} refusals under {SECONDS:.0f} s and {BYTES >> 30} GiB, exit 2")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
