"""A first-order H200 time model for one-CTA-per-row top-k kernels, fed by what the emulator
counts. It is the model of the kernel performance review (shared/tools/kernel_perf_model.py,
``design``), with its per-pass and per-sort-stage costs replaced by the counted barriers.
Estimates, not measurements: every constant below is an assumption no H200 has confirmed.

Per-CTA latency = steps x max(HBM latency, the SM's atomic time per step) + re-reads x their
latency (L1, L2 or HBM by residency) + barriers x a barrier's cost + a fixed cost; the time of
a launch is the largest of the HBM, L2, latency, atomic and issue bounds, plus the launch itself.
The issue bound (issue 27) is the warp instructions the launch issues (counted from the
kernel's SASS and the emulator, topkgen/emulator/instructions.py) over SMs x issue rate x
clock, at ISSUE_RATE warp-instructions per clock per SM (4: the SM's four schedulers, a
ceiling); `issue_seconds(..., rate=2)` gives the bound at a more typical 2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SMS, CLOCK_HZ = 132, 1.755e9
HBM_BYTES_PER_S, L2_BYTES_PER_S = 4.3e12, 7.0e12
HBM_LATENCY_S, L2_LATENCY_S = 0.6e-6, 0.25e-6
LAUNCH_S, CTA_FIXED_S = 2.5e-6, 0.6e-6
L2_FIT_BYTES, L1_FIT_BYTES = 40e6, 200e3
ISSUE_RATE = 4  # warp instructions per clock per SM the estimate assumes (the ceiling)
REGISTERS_PER_SM, THREADS_PER_SM, SHARED_PER_SM, MAX_CTAS_PER_SM = 65536, 2048, 228 * 1024, 32


@dataclass(frozen=True)
class KernelFacts:
    """What the model needs of a kernel: from its spec, its ptxas resources and the counters."""

    threads: int
    ctas_per_sm: int
    bytes_in_flight: int            # per CTA: threads x 16 B x independent loads per thread
    reads_per_element: float        # global bytes loaded / input bytes
    atomic_wavefronts_per_element: float  # first-pass atomic instructions x bank lanes / elements
    barriers_per_row: float
    warp_instructions_per_row: float = 0.0  # issued per row (per CTA's part), counted; 0: unknown


def ctas_per_sm(threads: int, registers: int, static_shared: int, dynamic_shared: int = 0) -> int:
    """Occupancy on sm_90: registers in 256-register warp units, threads, shared memory
    (1 KB reserved per CTA)."""
    warp_registers = math.ceil(max(1, registers) * 32 / 256) * 256
    by_registers = REGISTERS_PER_SM // (warp_registers * math.ceil(threads / 32))
    by_shared = SHARED_PER_SM // (static_shared + dynamic_shared + 1024)
    return max(0, min(by_registers, THREADS_PER_SM // threads, by_shared, MAX_CTAS_PER_SM))


def issue_seconds(rows: int, f: KernelFacts, rate: float = ISSUE_RATE) -> float:
    """The issue bound: every warp instruction of `rows` rows over SMS x rate x clock."""
    return rows * f.warp_instructions_per_row / (SMS * rate * CLOCK_HZ)


def estimate_seconds(rows: int, n: int, k: int, itemsize: int, f: KernelFacts) -> tuple[float, str]:
    """(seconds, the bound that decides it) for `rows` rows of n elements, one CTA per row."""
    occ = max(1, f.ctas_per_sm)
    body_steps = math.ceil(n * itemsize / f.bytes_in_flight)
    resident_rows = min(rows, occ * SMS)
    active = max(1, min(occ, math.ceil(rows / SMS)))  # CTAs sharing an SM's atomic unit
    step_bytes = min(f.bytes_in_flight, n * itemsize)
    atomic_step = active * (step_bytes / itemsize) * f.atomic_wavefronts_per_element / CLOCK_HZ
    step = max(HBM_LATENCY_S, atomic_step)
    fits_l2 = resident_rows * n * itemsize <= L2_FIT_BYTES
    fits_l1 = active * n * itemsize <= L1_FIT_BYTES
    reread = (max(0.03e-6, active * step_bytes / 128 / CLOCK_HZ) if fits_l1
              else L2_LATENCY_S if fits_l2 else HBM_LATENCY_S)
    barrier = 0.1e-6 if f.threads >= 1024 else 0.06e-6
    per_cta = (body_steps * step + max(0.0, f.reads_per_element - 1) * body_steps * reread
               + f.barriers_per_row * barrier + CTA_FIXED_S)
    in_bytes, out_bytes = rows * n * itemsize, rows * k * (itemsize + 8)
    bounds = {
        "HBM": (in_bytes * (1 if fits_l2 else max(1.0, f.reads_per_element)) + out_bytes) / HBM_BYTES_PER_S,
        "L2": in_bytes * f.reads_per_element / L2_BYTES_PER_S,
        "latency": math.ceil(rows / (occ * SMS)) * per_cta,
        "atomics": max(1.0, rows / SMS) * n * f.atomic_wavefronts_per_element / CLOCK_HZ,
        # a row's instructions issue on one SM: a batch of fewer rows than SMs still takes one row's
        "issue": max(rows, SMS) * f.warp_instructions_per_row / (SMS * ISSUE_RATE * CLOCK_HZ),
    }
    bound = max(bounds, key=bounds.get)
    return LAUNCH_S + bounds[bound], bound
