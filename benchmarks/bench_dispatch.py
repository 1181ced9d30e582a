"""`make bench-dispatch`: the cost of one dispatch decision, side by side in one run:
topkgen.policy.select (rule evaluation), the Python table lookup (the runtime's per-call
path) and the C++ loader's lookup, over the same 1,000 random shapes of the default bundle."""

from __future__ import annotations

import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CPP = ROOT / "build" / "cpp" / "topkgen-cpp"
REPEAT, LOOPS = 21, 5

from topkgen import policy as pol  # noqa: E402
from topkgen.runtime import TopK  # noqa: E402


def shapes(policy: pol.Policy, count: int = 1000) -> list[tuple]:
    rng = random.Random(1)
    out = []
    for _ in range(count):
        k = rng.randint(1, pol.K_COVERED)
        n = rng.choice([rng.randint(k, max(k, 4200)), min(pol.N_MAX, int(k * 2 ** rng.uniform(0, 24)))])
        out.append((rng.choice(list(policy.archs)), rng.choice(policy.dtypes), k, n, rng.random() < 0.5))
    return out


def per_call_ns(fn, items) -> float:
    """Median over REPEAT runs of (LOOPS passes over items) / calls, in nanoseconds."""
    samples = []
    for _ in range(REPEAT):
        start = time.perf_counter_ns()
        for _ in range(LOOPS):
            for item in items:
                fn(item)
        samples.append((time.perf_counter_ns() - start) / (LOOPS * len(items)))
    return statistics.median(samples)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bundle"
        subprocess.run([sys.executable, "-m", "topkgen", "build", "--out", str(out), "-j", "2"], check=True,
                       stdout=subprocess.DEVNULL)
        policy = pol.load()
        work = shapes(policy)
        ops = {arch: TopK(out, arch=arch, backend="emulator") for arch in policy.archs}
        tables = {arch: op._table for arch, op in ops.items()}
        select_ns = per_call_ns(lambda s: pol.select(policy, s[0], s[1], s[2], s[3], deterministic=s[4]), work)
        table_ns = per_call_ns(lambda s: tables[s[0]].lookup(s[1], s[2], s[3], s[4], True), work)
        choose_ns = per_call_ns(lambda s: ops[s[0]].choose(s[1], s[2], s[3], s[4]), work)
        lines = "".join(f"{a} {d} {k} {n} {'deterministic' if det else 'fast'} 1\n" for a, d, k, n, det in work)
        proc = subprocess.run([str(CPP), "bench", str(out)], input=lines, capture_output=True, text=True, check=True)
        cpp_ns = float(proc.stdout.split()[0])
    print(f"one dispatch decision, median of {REPEAT} runs over the same {len(work)} random shapes "
          f"(2 archs, 3 dtypes, both modes, JIT available):")
    rows = [("topkgen.policy.select (evaluates the rules)", select_ns),
            ("Python: ArchTable.lookup (the manifest's table)", table_ns),
            ("Python: TopK.choose (the runtime's per-call path)", choose_ns),
            ("C++: topkgen::Bundle::select (loaders/cpp, -O2)", cpp_ns)]
    for label, ns in rows:
        ratio = "" if ns == select_ns else f"  {select_ns / ns:6.1f}x faster than select"
        print(f"  {label:<52} {ns / 1000:8.3f} us{ratio}")


if __name__ == "__main__":
    main()
