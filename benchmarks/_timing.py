"""Timing helpers shared by the benchmarks: medians over repeated runs, measured side by side."""

from __future__ import annotations

import statistics
import subprocess
import time
from typing import Callable, Sequence


def median_seconds(fn: Callable[[], object], repeat: int = 7, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def median_process_seconds(cmd: Sequence[str], repeat: int = 11, cwd: str | None = None,
                           ok: set[int] = frozenset({0})) -> float:
    """Median wall time of a whole process (start-up included)."""

    def run() -> None:
        code = subprocess.run(cmd, stdout=subprocess.DEVNULL, cwd=cwd).returncode
        if code not in ok:
            raise RuntimeError(f"{' '.join(cmd)} exited {code}")

    return median_seconds(run, repeat=repeat, warmup=2)
