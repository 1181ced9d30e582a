"""`make bench-kernels`: what each kernel the default policy dispatches moves, counted on the
CPU emulator (exact), per kernel family and shape, for four kinds of data; and a first-order
H200 time estimate fed by those counts (a model, labelled as such, not a measurement).

Shapes: the seed grid (N 2048-16384, K 64-256), LLM sampling rows (N 131072 and 262144,
K 16-1024), rows of 131072 with K 256 and 1024, float32 and bfloat16, the register ladder's
rung, and LLM vocabularies (32000 and 50257 at K=50: rows the stream reads once). The
emulator runs a few rows of each (the counts are per row); the model takes the batch a shape
set stands for. The "small batch" set (1, 4, 16 and 64 rows of
131072 and 262144, K 16-1024) is planned per batch: the policy splits those rows across
CTAs, and its table gives the CTAs per row, stage 1's global reads per element, what the
merge reads, and the model for both launches (or, where the policy's split asks for
one_launch, the one: stage 1, then the merge on the last CTA of each row, the two launches'
counts less a launch) beside one CTA per row. Columns:
  reads/elem    global bytes loaded / input bytes (the k output values re-read included)
  atom/elem     shared atomics (lanes) per input element, all passes
  lanes p1      bank lanes of the first-pass histogram: mean and max over warp atomic
                instructions (the phase a kernel labels "histogram, first pass"; the whole
                launch when it labels none)
  bar/row       __syncthreads per row
  model us      H200 estimate for the set's batch (benchmarks/h200_model.py)
--json FILE saves the rows; --baseline FILE (such a file) adds the ratios against it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from h200_model import HBM_BYTES_PER_S, LAUNCH_S, KernelFacts, ctas_per_sm, estimate_seconds, issue_seconds  # noqa: E402
from shapes import DATA_KINDS, SETS, make_rows, select_sets  # noqa: E402

ARCH = "sm_90"
FIRST_PASS = "histogram, first pass"


@dataclass(frozen=True)
class Row:
    set: str
    model_rows: int
    dtype: str
    n: int
    k: int
    data: str
    family: str
    kernel: str
    reads_per_element: float
    atomics_per_element: float
    first_pass_lanes_mean: float
    first_pass_lanes_max: int
    barriers_per_row: float
    model_us: float | None
    model_bound: str
    # issue 27: warp instructions (SASS x emulator, topkgen/emulator/instructions.py)
    warp_instructions_per_key: float = 0.0
    warp_instructions_per_row: float = 0.0
    ctas_per_sm: int = 0
    issue_us_at_4: float = 0.0
    issue_us_at_2: float = 0.0
    hbm_floor_us: float = 0.0
    # issue 27: bank lanes of the launch's shared atomics by kind: {kind: [instructions, mean, max]}
    bank_lanes_by_kind: dict = field(default_factory=dict)

    def key(self) -> str:
        return f"{self.set}|{self.dtype}|{self.n}|{self.k}|{self.data}"


class Kernels:
    """Emulator modules and ptxas resources of the kernels the policy selects, built once."""

    def __init__(self) -> None:
        from topkgen import policy

        self.policy = policy.load()
        self._modules: dict[str, object] = {}
        self._counters: dict[str, object] = {}
        self._ctas: dict[str, int] = {}

    def select(self, dtype: str, k: int, n: int):
        from topkgen import policy

        return policy.select(self.policy, ARCH, dtype, k, n).kernel

    def counter(self, spec):
        """The kernel's warp-instruction counter: its SASS, and the instrumented source."""
        from topkgen.emulator.instructions import Counter
        from topkgen.build.render import render

        if spec.name not in self._counters:
            self._counters[spec.name] = Counter(render(spec), spec.name, ARCH)
        return self._counters[spec.name]

    def module(self, spec):
        if spec.name not in self._modules:
            self._modules[spec.name] = self.counter(spec).module()
        return self._modules[spec.name]

    def ctas_per_sm(self, spec, shared_bytes: int) -> int:
        """CTAs per SM of the kernel's launches with `shared_bytes` of dynamic shared memory
        (the launch's, split.SharedMemory), with its real registers."""
        from topkgen.build.compile import compile_kernel
        from topkgen.build.render import render

        if spec.name not in self._ctas:
            self._ctas[spec.name] = compile_kernel(render(spec), spec.name, spec.arch).resources
        r = self._ctas[spec.name]
        return ctas_per_sm(spec.threads, r.registers, r.static_shared_bytes, shared_bytes)


def run_counted(kernels: Kernels, spec, rows: int, dtype: str, n: int, k: int, kind: str, who: str = "bench-kernels"):
    """`rows` rows of `kind` data (the seed bench-kernels gives them) through spec's instrumented
    module, the largest k, sorted, checked against the reference: (x, the launch's counters)."""
    from topkgen.runtime import reference
    from topkgen.runtime import launch_arguments, launch_shared_bytes

    import ml_dtypes

    x = make_rows(kind, rows, n, seed=n + k + DATA_KINDS.index(kind)).astype(
        np.float32 if dtype == "float32" else ml_dtypes.bfloat16)
    values, indices = np.zeros((rows, k), x.dtype), np.zeros((rows, k), np.int64)
    grid = (rows + spec.rows_per_block - 1) // spec.rows_per_block
    c = kernels.module(spec).launch(spec.name, grid, spec.threads,
                                    launch_arguments(spec, x, values, indices, rows, n, k, True),
                                    shared_bytes=launch_shared_bytes(spec, n), counters=True)
    expect, _ = reference.topk(x, k, largest=True)
    if not np.array_equal(reference.select_keys(values, True), reference.select_keys(expect, True)):
        raise SystemExit(f"{who}: {spec.name} returned a wrong top-{k} on {kind} rows of {n}")
    return x, c


def measure(kernels: Kernels, set_name: str, model_rows: int, rows: int, dtype: str, n: int, k: int,
            kind: str) -> Row:
    from topkgen.runtime import launch_shared_bytes

    spec = kernels.select(dtype, k, n)
    x, c = run_counted(kernels, spec, rows, dtype, n, k, kind)
    first = c.phases.get(FIRST_PASS, c)
    elements = rows * n
    wavefronts = first.shared_atomic_instructions * first.bank_lanes_mean / elements
    issued = kernels.counter(spec).count(c, spec.name).warp_instructions
    facts = KernelFacts(threads=spec.threads, ctas_per_sm=kernels.ctas_per_sm(spec, launch_shared_bytes(spec, n)),
                        bytes_in_flight=spec.threads * 16 * spec.loads_in_flight,
                        reads_per_element=c.global_load_bytes / x.nbytes, atomic_wavefronts_per_element=wavefronts,
                        barriers_per_row=c.barriers / rows, warp_instructions_per_row=issued / rows)
    floor = (model_rows * n * x.itemsize + model_rows * k * (x.itemsize + 8)) / HBM_BYTES_PER_S
    # The model describes kernels that stream a row with one CTA; the register ladder is
    # bound by its O(k N / 32) selection rounds, which the model does not count.
    seconds, bound = estimate_seconds(model_rows, n, k, x.itemsize, facts) if spec.family == "radix" else (None, "")
    return Row(set_name, model_rows, dtype, n, k, kind, spec.family, spec.name, facts.reads_per_element,
               c.shared_atomics / elements, first.bank_lanes_mean, first.bank_lanes_max, facts.barriers_per_row,
               None if seconds is None else seconds * 1e6, bound, issued / elements, issued / rows,
               facts.ctas_per_sm, issue_seconds(max(model_rows, 132), facts, 4) * 1e6,
               issue_seconds(max(model_rows, 132), facts, 2) * 1e6, floor * 1e6, _by_kind(c))


def _by_kind(counts) -> dict:
    return {kind: [b.instructions, round(b.lanes_mean, 3), b.lanes_max] for kind, b in counts.bank_lanes_by_kind.items()}


def _kinds(by_kind: dict) -> str:
    return ", ".join(f"{kind} {mean:.1f}/{most}" for kind, (_, mean, most) in by_kind.items()) or "none"


@dataclass(frozen=True)
class SplitRow:
    """One batch of the small-batch set: its split, as counted on one emulated row."""

    dtype: str
    n: int
    k: int
    rows: int                  # the batch planned for
    kernel: str
    ctas_per_row: int          # stage 1 (1: not split)
    chunk: int
    stage1_reads_per_element: float
    merge_candidates: int      # per row (0: not split)
    merge_bytes_per_candidate: float  # global bytes stage 2 loads per candidate
    model_us: float
    model_one_cta_us: float    # the same batch with one CTA per row
    # issue 27: both launches' warp instructions per input key (SASS x emulator), the HBM floor
    warp_instructions_per_key: float = 0.0
    hbm_floor_us: float = 0.0
    data: str = "normal"  # the row's data kind (shapes.DATA_KINDS)

    def key(self) -> str:
        return f"small batch|{self.dtype}|{self.n}|{self.k}|{self.rows}|{self.data}"


def _facts(kernels: Kernels, spec, counts, elements: int, ctas: int, input_bytes: int, shared_bytes: int) -> KernelFacts:
    first = counts.phases.get(FIRST_PASS, counts)
    return KernelFacts(threads=spec.threads, ctas_per_sm=kernels.ctas_per_sm(spec, shared_bytes),
                       bytes_in_flight=spec.threads * 16 * spec.loads_in_flight,
                       reads_per_element=counts.global_load_bytes / input_bytes,
                       atomic_wavefronts_per_element=first.shared_atomic_instructions * first.bank_lanes_mean / elements,
                       barriers_per_row=counts.barriers / ctas)


def run_split_row(module, spec, x: np.ndarray, k: int, chunks: int, expect: np.ndarray, who: str,
                  one_launch: bool = False) -> list:
    """The launches of one row of x (1 x n) in `chunks` chunks (1: one CTA), as
    topkgen.policy.split.stages plans them and the runtime binds them (`one_launch`: the split's
    one launch, its hand-over checked: check_ordering), with counters; stops with `who`'s
    message when the top k's keys differ from `expect`'s."""
    from topkgen.manifest.params import params
    from topkgen.policy.split import ChunkPlan, stages
    from topkgen.runtime import arguments, reference
    from topkgen.runtime.emulator_backend import workspace_arrays

    n = x.shape[1]
    values, indices = np.zeros((1, k), x.dtype), np.zeros((1, k), np.int64)
    plan = ChunkPlan(1, n, k, chunks, x.itemsize, one_launch=one_launch) if chunks > 1 else None
    pointers = {"x": x, "values": values, "indices": indices}
    if plan is not None:
        pointers.update(workspace_arrays(plan, x.dtype, np.zeros(plan.workspace_bytes, np.uint8)))
    counts = [module.launch(spec.name, stage.grid_rows, spec.threads, arguments(params(spec), stage, pointers, None),
                            shared_bytes=stage.shared_bytes, counters=True, check_ordering=one_launch)
              for stage in stages(1, n, k, True, plan, shared=spec.shared)]
    if not np.array_equal(reference.select_keys(values, True), reference.select_keys(expect, True)):
        raise SystemExit(f"{who}: {spec.name} in {chunks} chunks returned a wrong top-{k} of {n}")
    return counts


def measure_split(kernels: Kernels, dtype: str, n: int, k: int, batches: tuple[int, ...],
                  kind: str = "normal") -> list[SplitRow]:
    """One emulated row of (dtype, n, k) once with one CTA and once as each batch's plan
    splits it (the launches of topkgen.policy.split.stages, bound as the runtime binds them)."""
    from topkgen import policy
    from topkgen.policy.split import ChunkPlan
    from topkgen.runtime import reference

    import ml_dtypes

    x = make_rows(kind, 1, n, seed=n + k + DATA_KINDS.index(kind)).astype(
        np.float32 if dtype == "float32" else ml_dtypes.bfloat16)
    expect, _ = reference.topk(x, k, largest=True)
    spec = policy.select(kernels.policy, ARCH, dtype, k, n).kernel
    module = kernels.module(spec)

    def run(chunks: int):
        return run_split_row(module, spec, x, k, chunks, expect, "bench-kernels")

    def per_key(counts) -> float:
        return sum(kernels.counter(spec).count(c, spec.name).warp_instructions for c in counts) / n

    def floor_us(rows: int) -> float:
        return (rows * n * x.itemsize + rows * k * (x.itemsize + 8)) / HBM_BYTES_PER_S * 1e6

    def issued(counts, ctas: int) -> float:  # warp instructions per CTA: the model's issue bound
        return kernels.counter(spec).count(counts, spec.name).warp_instructions / ctas

    (whole,) = run(1)
    whole_per_key = per_key([whole])
    one_cta = replace(_facts(kernels, spec, whole, n, 1, x.nbytes, spec.shared.bytes_for(n)),
                      warp_instructions_per_row=issued(whole, 1))
    out = []
    for rows in batches:
        sel = policy.select(kernels.policy, ARCH, dtype, k, n, rows=rows)
        unsplit_s, _ = estimate_seconds(rows, n, k, x.itemsize, one_cta)
        if sel.split is None:
            out.append(SplitRow(dtype, n, k, rows, spec.name, 1, n, one_cta.reads_per_element, 0, 0.0,
                                unsplit_s * 1e6, unsplit_s * 1e6, whole_per_key, floor_us(rows), kind))
            continue
        plan = sel.split
        first, second = run(plan.chunks)  # one launch's two parts are counted apart, as two launches
        if spec.merges:
            run_split_row(module, spec, x, k, plan.chunks, expect, "bench-kernels (one launch)", one_launch=True)
        stage1 = replace(_facts(kernels, spec, first, n, plan.chunks, x.nbytes, spec.shared.bytes_for(plan.last_chunk)),
                         warp_instructions_per_row=issued(first, plan.chunks))
        merged = plan.candidates * x.itemsize
        stage2 = replace(_facts(kernels, spec, second, plan.candidates, 1, merged, spec.shared.bytes_for(plan.candidates)),
                         warp_instructions_per_row=issued(second, 1))
        # one launch: the merge's CTA starts where its row's last chunk ends, no launch between
        seconds = (estimate_seconds(rows * plan.chunks, plan.chunk, k, x.itemsize, stage1)[0]
                   + estimate_seconds(rows, plan.candidates, k, x.itemsize, stage2)[0] - LAUNCH_S * spec.merges)
        out.append(SplitRow(dtype, n, k, rows, spec.name, plan.chunks, plan.chunk, stage1.reads_per_element,
                            plan.candidates, second.global_load_bytes / plan.candidates, seconds * 1e6,
                            unsplit_s * 1e6, per_key([first, second]), floor_us(rows), kind))
    return out


def print_split_table(rows: list[SplitRow]) -> None:
    print("\n### radix kernels, small batch, split across CTAs (model: each line's batch)\n")
    head = ("| dtype | N | K | rows | data | kernel | CTAs/row | chunk | stage-1 reads/elem | merge candidates/row "
            "| merge bytes read/candidate | warp instr/key (stage 1 and merge) | HBM floor us | model us (H200) "
            "| model us, one CTA/row | model ratio |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        print(f"| {r.dtype} | {r.n} | {r.k} | {r.rows} | {r.data} | {r.kernel} | {r.ctas_per_row} | {r.chunk} "
              f"| {r.stage1_reads_per_element:.3f} | {r.merge_candidates} | {r.merge_bytes_per_candidate:.2f} "
              f"| {r.warp_instructions_per_key:.2f} | {r.hbm_floor_us:.2f} | {r.model_us:.0f} | {r.model_one_cta_us:.0f} | {r.model_one_cta_us / r.model_us:.1f}x |")


def _model(row: Row) -> str:
    return "n/a" if row.model_us is None else f"{row.model_us:.0f} ({row.model_bound})"


def print_tables(rows: list[Row], baseline: dict[str, dict] | None) -> None:
    for family in dict.fromkeys(r.family for r in rows):
        for set_name in dict.fromkeys(r.set for r in rows if r.family == family):
            group = [r for r in rows if r.family == family and r.set == set_name]
            print(f"\n### {family} kernels, {set_name} (model: {group[0].model_rows} rows)\n")
            head = ("| dtype | N | K | data | kernel | reads/elem | warp instr/key | warp instr/row | atom/elem "
                    "| lanes p1 mean/max | bank lanes by kind mean/max | bar/row | CTAs/SM | issue us @4 / @2 "
                    "| HBM floor us | model us (H200, bound) |")
            if baseline is not None:
                head += " reads vs base | lanes p1 max vs base | model vs base |"
            print(head)
            print("|" + "---|" * (head.count("|") - 1))
            for r in group:
                line = (f"| {r.dtype} | {r.n} | {r.k} | {r.data} | {r.kernel} | {r.reads_per_element:.3f} "
                        f"| {r.warp_instructions_per_key:.2f} | {r.warp_instructions_per_row:.0f} "
                        f"| {r.atomics_per_element:.3f} | {r.first_pass_lanes_mean:.1f} / {r.first_pass_lanes_max} "
                        f"| {_kinds(r.bank_lanes_by_kind)} | {r.barriers_per_row:.1f} | {r.ctas_per_sm} | {r.issue_us_at_4:.1f} / {r.issue_us_at_2:.1f} "
                        f"| {r.hbm_floor_us:.1f} | {_model(r)} |")
                if baseline is not None:
                    line += _versus(r, baseline.get(r.key()))
                print(line)


def _versus(r: Row, base: dict | None) -> str:
    if base is None:
        return " new | new | new |"

    def ratio(now: float | None, before: float | None) -> str:
        if now is None or not before:
            return "n/a"
        return f"{before:.3g} -> {now:.3g} ({now / before:.2f}x)"

    return (f" {ratio(r.reads_per_element, base['reads_per_element'])} | {base['first_pass_lanes_max']} -> "
            f"{r.first_pass_lanes_max} | {ratio(r.model_us, base['model_us'])} |")


def load_baseline(path: str) -> dict[str, dict] | str:
    """The rows of an earlier run by key, or why the file cannot serve as one."""
    try:
        data = json.loads(Path(path).read_text())
        return {Row(**row).key(): row for row in data["rows"]}
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"--baseline {path}: not a bench-kernels JSON file ({err})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_kernels.py", description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="FILE", help="write the rows as JSON (a baseline for later runs)")
    parser.add_argument("--md", metavar="FILE", help="also write the tables (what it prints) to FILE")
    parser.add_argument("--baseline", metavar="FILE", help="a JSON file of an earlier run to compare with")
    parser.add_argument("--sets", metavar="NAMES", help="comma-separated shape sets (default: all): "
                        + ", ".join(s.name for s in SETS))
    args = parser.parse_args(argv)
    try:
        wanted = select_sets(args.sets)
    except ValueError as err:
        parser.error(f"--sets: {err}")
    baseline = load_baseline(args.baseline) if args.baseline else None
    if isinstance(baseline, str):
        parser.error(baseline)
    if args.json and Path(args.json).is_dir():
        parser.error(f"--json: {args.json} is a directory")
    if args.md and Path(args.md).is_dir():
        parser.error(f"--md: {args.md} is a directory")
    started = time.perf_counter()
    kernels = Kernels()
    rows = [measure(kernels, s.name, s.model_rows, s.emulated_rows, dtype, n, k, kind)
            for s in wanted if not s.per_batch for dtype, n, k in s.shapes for kind in s.data]
    # The small batches on every data kind (gpu_check times them on normal rows only).
    split_rows = [r for s in wanted if s.per_batch for dtype, n, k in s.shapes for kind in DATA_KINDS
                  for r in measure_split(kernels, dtype, n, k, s.gpu_rows, kind)]
    import contextlib
    import io

    tables = io.StringIO()
    with contextlib.redirect_stdout(tables):
        print(f"bench-kernels: {ARCH} kernels of the default policy, counted on the emulator; "
              f"the model column is an H200 estimate, not a measurement")
        print_tables(rows, baseline)
        if split_rows:
            print_split_table(split_rows)
    print(tables.getvalue(), end="")
    if args.md:
        Path(args.md).write_text(tables.getvalue())
    if args.json:
        Path(args.json).write_text(json.dumps({"arch": ARCH, "rows": [asdict(r) for r in rows],
                                               "split_rows": [asdict(r) for r in split_rows]}, indent=1) + "\n")
    launches = len(rows) + sum(1 + (r.ctas_per_row > 1) for r in split_rows)
    print(f"\n{launches} launches in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
