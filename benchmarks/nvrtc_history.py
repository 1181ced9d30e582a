"""Does NVRTC write one cubin for one source? One kernel of the default policy compiled N times
in this process, one compile after another (as a build's worker thread compiled before each
compile had a process of its own), then N times each in a fresh process (topkgen.build.compile,
as builds compile now); each way's distinct cubins with their counts.

    .venv/bin/python benchmarks/nvrtc_history.py KERNEL [--times N] [--policy FILE]

NVRTC's variation is rare (a few in a hundred compiles for the kernels where it was seen), so N
must be large for a clean result to say much; run it beside a load (make test) as the suite did.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topkgen import policy as pol  # noqa: E402
from topkgen.build import compile as nvrtc_compile  # noqa: E402
from topkgen.build.nvrtc_child import compile_one  # noqa: E402
from topkgen.build.render import render  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kernel", help="a kernel the policy plans, e.g. topk_radix_dyn_k256_fast_f32_sm_90")
    ap.add_argument("--times", type=int, default=40)
    ap.add_argument("--policy", type=Path)
    a = ap.parse_args(argv)
    policy = pol.load(a.policy)
    specs = {spec.name: spec for arch in policy.archs for spec in pol.plan(policy, arch)}
    if a.kernel not in specs or a.times < 1:
        ap.error(f"{a.kernel}: not a kernel of the policy's plan" if a.kernel not in specs else "--times must be >= 1")
    spec = specs[a.kernel]
    source, options = render(spec), nvrtc_compile.options(spec.arch)

    def digest(cubin: bytes) -> str:
        return hashlib.sha256(cubin).hexdigest()[:12]

    one_process: Counter[str] = Counter()
    for _ in range(a.times):
        reply = compile_one(source, spec.name, options)
        one_process[digest(base64.b64decode(reply["cubin"]))] += 1
    fresh: Counter[str] = Counter(digest(nvrtc_compile._nvrtc(source, spec.name, spec.arch)[1]) for _ in range(a.times))
    print(f"{spec.name}, {a.times} compiles each way: distinct cubins (sha256) and their counts")
    print(f"  in one process:            {dict(one_process.most_common())}")
    print(f"  each in a process of its own: {dict(fresh.most_common())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
