"""What a loaded policy is: its limits, the dataclasses of archs, families, rules and kernels, and
where the packaged policies and templates live. Every other stage reads these types."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterable

from topkgen.common import reader
from topkgen.common.errors import InputError
from topkgen.common.schema import format_path
from topkgen.policy.split import ChunkPlan, SharedMemory

DTYPE_SIZES = {"float32": 4, "bfloat16": 2, "float16": 2}
DTYPE_TAGS = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
MODE_TAGS = {"fast": "fast", "deterministic": "det"}
MODES = ("fast", "deterministic")
N_MAX = 2**31 - 1
# k has no bound but n: 1 <= k <= n <= N_MAX. K rungs go up to K_RUNG_MAX (a radix CTA keeps
# K candidates in static shared memory); k above a policy's largest rung is served by the
# large-k path (topkgen.policy.planning.large_kernel), which keeps them in global memory.
K_RUNG_MAX = 4096
# Every policy's rules serve at least 1 <= k <= K_COVERED (the coverage rule); the large-k
# path serves k above the largest rung, and never below K_COVERED + 1.
K_COVERED = 1024
# The large-k path's name, as select, explain and the dispatch table give it (not a rule).
LARGE_K_PATH = "large_k"
MAX_THREADS_PER_BLOCK = 1024
# A radix kernel's final sort holds K / threads candidates per thread in registers
# (templates/topk_common.cuh, register_sort); more would spill.
MAX_SORT_CANDIDATES_PER_THREAD = 8
VECTOR_BYTES = 16
THREADS_PER_SM = 2048  # the most of any arch (THREADS_PER_SM_BY_ARCH holds each one's)
# Documented hardware limits per arch, from NVIDIA's documentation (the CUDA C++ Programming
# Guide's "Technical Specifications per Compute Capability"; the same numbers are in CCCL's
# cuda/__device/arch_traits.h): the shared memory one CTA may use (static + dynamic, with the
# opt-in attribute: the SM's shared memory less the 1 KB the system reserves per block from
# sm_80 on), and the threads resident on one SM. An arch of a policy must be in both (the
# schema's arch list names the same archs: every one the pinned NVRTC 13.0 compiles for and a
# top-k user runs; NVRTC 13.0 dropped sm_50..sm_72 and renamed sm_101 to sm_110).
SHARED_BYTES_PER_BLOCK = {"sm_75": 65536, "sm_80": 166912, "sm_86": 101376, "sm_87": 166912, "sm_89": 101376,
                          "sm_90": 232448, "sm_100": 232448, "sm_103": 232448, "sm_110": 232448,
                          "sm_120": 101376, "sm_121": 101376}
THREADS_PER_SM_BY_ARCH = {"sm_75": 1024, "sm_80": 2048, "sm_86": 1536, "sm_87": 1536, "sm_89": 1536,
                          "sm_90": 2048, "sm_100": 2048, "sm_103": 2048, "sm_110": 1536,
                          "sm_120": 1536, "sm_121": 1536}
# NVRTC 13 compiles an arch-specific target (--gpu-architecture=sm_90a) for sm_90 and later only.
ARCH_SPECIFIC_FROM = (9, 0)
# Static shared memory of a radix kernel of K rung k (histogram, candidates, scratch); the
# large-k path keeps its candidates in global memory (k = 0 here).
def radix_static_shared_bytes(k: int) -> int:
    return 4 * 2048 + 8 * k + 512


# The largest radix kernel of the classic rungs (K=1024), which every arch must fit.
RADIX_STATIC_SHARED_BYTES = radix_static_shared_bytes(K_COVERED)
# Register kernels keep N/32 keys per lane (at most 64) and one result per lane (K <= 32).
REGISTER_MAX_N = 2048
REGISTER_MAX_K = 32
WORK_BY_FAMILY = {"register": ("ladder", "exact"), "radix": ("exact", "dynamic", "fixed_vec")}
# The template each family's kernels render from (topkgen.build.render reads it from here).
FAMILY_TEMPLATES = {"register": "register_select.cu.j2", "radix": "radix_select.cu.j2"}
# The per-arch keys each family's kernels are built from: required when the policy declares
# the family, optional otherwise (vector_tail is then "runtime", which no kernel reads).
FAMILY_ARCH_KEYS = {"register": ("warps_per_block",), "radix": ("threads", "vector_tail")}
MAX_POLICY_BYTES = 1 << 20
# Every kernel is compiled (AOT) or may be (JIT), and loading checks dispatch over all of
# them: a policy may declare at most this many, over all archs, dtypes and modes.
MAX_KERNELS = 4096
# Dispatch is tabulated on the grid of every k, n and batch bound some rule or split sets
# (topkgen.policy.dispatch_table): build asks select at each cell, and every loader indexes the
# table. A few hundred exact-n rules made that grid millions of cells (build spent 12
# minutes on it) and the table more than loaders index; the default policy's is ~15,000, the fleet's (11 archs, k up to n) ~163,000.
MAX_DISPATCH_CELLS = 1 << 18


class PolicyError(InputError):
    """A policy that cannot be used. Carries file, line, column and key path."""

    def __init__(self, message: str, *, source: str = "<policy>", line: int | None = None,
                 column: int | None = None, key: str | None = None) -> None:
        self.message, self.source, self.line, self.column, self.key = message, source, line, column, key
        where = source if line is None else f"{source}:{line}:{column}"
        super().__init__(f"{where}: {key}: {message}" if key else f"{where}: {message}")


class DispatchError(InputError, ValueError):
    """A shape outside the dispatch domain; the message names the bad argument."""


@dataclass(frozen=True)
class SplitTuning:
    """When a request's rows are cut into chunks, and into how many (schema: $defs/split)."""

    sm_count: int
    ctas_per_sm: int
    rows_below: int
    min_n: int
    max_chunks: int
    min_chunk: int
    chunk_per_k: int
    rows_below_by_k: dict[int, int] = field(default_factory=dict)  # per K rung, over rows_below
    one_launch: bool = False  # its radix kernels merge a split in stage 1's launch (take tickets)

    def rows_below_for(self, k_rung: int) -> int:
        """Split only batches of fewer rows than this for a kernel of this K rung."""
        return self.rows_below_by_k.get(k_rung, self.rows_below)

    def min_chunk_for(self, k_rung: int) -> int:
        """The shortest chunk a kernel of this K rung gets."""
        return max(self.min_chunk, self.chunk_per_k * k_rung)

    def fitting(self, n: int, resident: int) -> int:
        """The fewest chunks whose every chunk a kernel reads once into shared memory when it
        holds `resident` elements there: 1 when the whole row fits, max_chunks when no count
        does. The last chunk is at most n / chunks + chunks - 1 long, so n <= chunks x
        (resident - chunks + 1) is enough (and keeps the answer monotone in n)."""
        return next((c for c in (1, *self.chunk_counts()) if n <= c * (resident - c + 1)), self.max_chunks)

    def chunks(self, rows: int, n: int, k_rung: int, resident: int) -> int:
        """Chunks per row before the kernel's window: the largest power of two at most
        max_chunks and n / max(min_chunk, chunk_per_k x K), and at most the larger of
        sm_count x ctas_per_sm / rows (fill the GPU) and the chunks that fit the kernel's
        shared memory (`resident` elements, 0 for none: one read per element); 1 is no split."""
        if rows >= self.rows_below_for(k_rung) or n < self.min_n:
            return 1
        want = self.sm_count * self.ctas_per_sm // rows
        if resident > 0:
            want = max(want, self.fitting(n, resident))
        bound = min(self.max_chunks, n // self.min_chunk_for(k_rung), want)
        return 1 << (bound.bit_length() - 1) if bound >= 2 else 1

    def chunk_counts(self) -> list[int]:
        """Every chunk count a split may use: the powers of two from 2 to max_chunks."""
        return [1 << i for i in range(1, self.max_chunks.bit_length())]

    def rows_starts(self) -> list[int]:
        """Where the chunks per row may change as rows grow: the rows axis's breakpoints."""
        target = self.sm_count * self.ctas_per_sm
        below = {self.rows_below, *self.rows_below_by_k.values()}
        return sorted({1} | below | {target // s + 1 for s in self.chunk_counts() if target // s + 1 < max(below)})


@dataclass(frozen=True)
class ArchTuning:
    name: str
    capability: tuple[int, int]
    threads: int | None          # radix kernels only (None when the policy has none)
    warps_per_block: int | None  # register kernels only
    tail_policy: str
    tail_max_iterations: int | None
    min_ctas_per_sm: dict[int, int]
    shared_row_bytes: int = 0  # radix: rows up to this size are read once into dynamic shared memory
    loads_in_flight: int = 1   # radix: 16-byte loads each thread issues before using any
    loads_in_flight_by_k: dict[int, int] = field(default_factory=dict)  # per K rung, over loads_in_flight
    split: SplitTuning | None = None  # small batches of long rows; None: never split
    ship_ptx: bool = False       # ship PTX (compute_XY) beside the cubins: forward compatibility
    arch_specific: bool = False  # compile for sm_XYa: runs on exactly this arch
    shared_buffer_per_k: int | None = None  # radix: a resident row's candidate buffer, in candidates per K (None: all)
    threads_by_k: dict[int, int] = field(default_factory=dict)  # radix: block size per K rung, over max(K, threads)
    shared_buffer_per_k_by_k: dict[int, int] = field(default_factory=dict)  # per K rung, over shared_buffer_per_k

    @property
    def target(self) -> str:
        """The NVRTC target of this arch's cubins: sm_90, or sm_90a when arch_specific."""
        return f"{self.name}a" if self.arch_specific else self.name


@dataclass(frozen=True)
class Family:
    name: str
    template: str
    max_registers: int
    spills_allowed: bool


@dataclass(frozen=True)
class Rule:
    name: str
    family: str
    work: str
    archs: tuple[str, ...]
    dtypes: tuple[str, ...]
    k_rungs: tuple[int, ...]
    k_min: int
    n_min: int | None
    n_max: int | None
    n_exact: tuple[int, ...]
    ladder: tuple[int, ...]
    vector_iterations: int | None
    modes: tuple[str, ...]
    serves: tuple[str, ...]
    aot: bool
    reason: str | None
    position: int   # place in dispatch_order, 0-based
    doc_index: int  # place in the rules list of the file, for error positions


@dataclass(frozen=True)
class KernelSpec:
    """One kernel: every parameter the template and the manifest need. The name encodes
    all of them, so it is the key for the AOT lookup and the JIT cache alike."""

    name: str
    arch: str
    family: str
    template: str
    rule: str
    work: str
    dtype: str
    k: int            # K rung: the kernel computes top-K and writes the first k
    k_min: int        # smallest k this kernel serves
    n_min: int
    n_max: int
    exact_n: int | None
    mode: str         # the mode it was built for
    serves: tuple[str, ...]  # the modes select sends to it (a deterministic kernel may serve fast too)
    threads: int
    rows_per_block: int
    min_ctas_per_sm: int
    vector_width: int
    vector_iterations: int | None
    ladder: tuple[int, ...]
    tail_policy: str
    tail_max_iterations: int | None
    aot: bool
    max_registers: int
    spills_allowed: bool
    dynamic_shared_bytes: int = 0  # compiled for this much dynamic shared memory: a launch gets at most this
    shared_buffer_bytes: int = 0   # a resident row's candidate buffer past its copy (split.SharedMemory)
    loads_in_flight: int = 1
    target: str = ""        # the NVRTC target when not the arch: its arch-specific sm_XYa (policy arch_specific)
    ship_ptx: bool = False  # its PTX (compute_XY) ships beside the cubin (policy ship_ptx)
    merges: bool = False    # it runs a split in one launch (takes tickets): its arch splits rows it serves

    @property
    def nvrtc_target(self) -> str:
        """What NVRTC compiles its cubin for: sm_90, or sm_90a for an arch-specific arch."""
        return self.target or self.arch

    @property
    def shared(self) -> SharedMemory:
        """How much dynamic shared memory a launch of this kernel gets (split.SharedMemory)."""
        return SharedMemory(self.dynamic_shared_bytes, self.shared_buffer_bytes, DTYPE_SIZES[self.dtype])

    @property
    def work_rung(self) -> str:
        if self.work == "fixed_vec":
            return f"fixed_vec={self.vector_iterations}"
        if self.work == "exact":
            return f"exact_n={self.exact_n}"
        return self.work

    def serves_n(self, n: int) -> bool:
        return self.n_min <= n <= self.n_max

    def record(self) -> dict[str, Any]:
        """The kernel's parameters as plain data, shared by the plan JSON and the manifest."""
        return {
            "name": self.name, "arch": self.arch, "family": self.family, "rule": self.rule,
            "dtype": self.dtype, "k": self.k, "k_min": self.k_min,
            "n_window": {"min": self.n_min, "max": self.n_max}, "mode": self.mode, "serves": list(self.serves),
            "work": self.work, "work_rung": self.work_rung,
            "launch": {"threads_per_block": self.threads, "rows_per_block": self.rows_per_block,
                       "min_ctas_per_sm": self.min_ctas_per_sm, "dynamic_shared_bytes": self.dynamic_shared_bytes,
                       "shared_buffer_bytes": self.shared_buffer_bytes},
            "vector_tail": {"policy": self.tail_policy, "max_iterations": self.tail_max_iterations},
            "loads_in_flight": self.loads_in_flight,
        }


@dataclass(frozen=True)
class Selection:
    """select's answer: the kernel and, when the request's rows are split, its chunk plan
    (stage 1 and stage 2 both run `kernel`). The reason is worded when it is read: the
    dispatch table's check asks select for many answers and reads no reason."""

    kernel: KernelSpec
    source: str  # "aot" or "jit"
    rule: str
    why: Callable[[], str] = field(compare=False, repr=False)
    skipped: tuple[str, ...] = ()
    split: ChunkPlan | None = None

    @cached_property
    def reason(self) -> str:
        return self.why()

    @property
    def chunks(self) -> int:
        """Chunks per row: 1 when the rows are not split."""
        return self.split.chunks if self.split else 1


@dataclass
class Policy:
    path: str
    sha256: str
    text: str  # the YAML it was loaded from: manifests embed it so loaders use this same code
    name: str
    archs: dict[str, ArchTuning]
    aot_dtypes: tuple[str, ...]
    jit_dtypes: tuple[str, ...]
    families: dict[str, Family]
    rules: tuple[Rule, ...]  # in dispatch order
    aot_covers_all: bool     # AOT kernels alone serve every shape of an AOT dtype
    _kernel_cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def dtypes(self) -> tuple[str, ...]:
        return self.aot_dtypes + self.jit_dtypes

    def rule(self, name: str) -> Rule:
        for r in self.rules:
            if r.name == name:
                return r
        raise KeyError(name)

    def with_sm_count(self, arch: str, sm_count: int) -> "Policy":
        """This policy with `arch`'s split tuned for a GPU of `sm_count` SMs (an H100 PCIe's
        114, an H20's 78) instead of the part its split section names: the same kernels, other
        chunks per row for small batches (the sm_count x ctas_per_sm / rows term). Itself when
        the arch does not split or already assumes that count."""
        tuning = self.archs[arch]
        if tuning.split is None or tuning.split.sm_count == sm_count:
            return self
        split = replace(tuning.split, sm_count=sm_count)
        return replace(self, archs={**self.archs, arch: replace(tuning, split=split)}, _kernel_cache={})

    def jit_only_rules(self, archs: Iterable[str] | None = None) -> list[Rule]:
        """The JIT-only tiers (aot: false) that apply to any of `archs` (all when None)."""
        wanted = None if archs is None else set(archs)
        return [r for r in self.rules if not r.aot and (wanted is None or wanted & set(r.archs))]

    @property
    def is_packaged_default(self) -> bool:
        """Loaded from the default policy that ships with topkgen (no --policy)."""
        path = Path(self.path)
        return path.is_file() and path.resolve() == default_policy_path().resolve()

    @property
    def display_path(self) -> str:
        """The policy's path as it may appear in shipped output: never absolute, and the
        same from whatever directory topkgen runs (manifests are byte-identical, shards built
        in different folders merge): a policy that ships with topkgen as policies/<its place
        there>, however topkgen is installed (a git checkout, a source archive, a wheel, a
        venv inside a repository); else relative to the git work tree that holds the file,
        else the file's name."""
        path = Path(self.path)
        if not path.is_file():  # not a file here (a git revision, a manifest): keep the label
            return self.path
        resolved = path.resolve()
        shipped = _data_dir("policies").resolve()
        if shipped in resolved.parents:
            return f"policies/{resolved.relative_to(shipped).as_posix()}"
        for folder in resolved.parents:
            if (folder / ".git").exists():
                return resolved.relative_to(folder).as_posix()
        return resolved.name

    def reference(self) -> dict[str, str]:
        """How the plan, explain and a manifest name the policy that decided: a file name that
        is not UTF-8 (or holds a control or bidirectional character) escaped, since the
        manifest reader, rightly, refuses lone surrogates and such characters in the label."""
        return {"path": reader.printable(self.display_path), "name": self.name, "sha256": self.sha256}


def rule_record(rule: Rule) -> dict[str, Any]:
    """A JIT-only tier (or any rule) as plain data for the plan JSON, manifest and diff."""
    n: dict[str, Any] = (
        {"exact": list(rule.n_exact)} if rule.work == "exact"
        else {"ladder": list(rule.ladder)} if rule.work == "ladder"
        else {"vector_iterations": rule.vector_iterations} if rule.work == "fixed_vec"
        else {"min": rule.n_min, "max": rule.n_max})
    return {"rule": rule.name, "family": rule.family, "work": rule.work, "archs": list(rule.archs),
            "dtypes": list(rule.dtypes), "k": list(rule.k_rungs), "k_min": rule.k_min, "n": n,
            "modes": list(rule.modes), "serves": list(rule.serves), "reason": rule.reason}


# ----------------------------------------------------------------------------- loading

def default_policy_path() -> Path:
    """The default policy: policies/topk.yaml in a checkout, topkgen/policies in a wheel."""
    return _data_dir("policies") / "topk.yaml"


def _data_dir(name: str) -> Path:
    top = Path(__file__).resolve().parents[2]  # topkgen/policy/ -> the checkout
    if (top / "pyproject.toml").is_file() and (top / name).is_dir():  # a checkout (editable install)
        return top / name
    return Path(str(resources.files("topkgen").joinpath(name)))


class _Locator:
    """Turns a key path into file:line:column using the positions recorded while parsing."""

    def __init__(self, source: str, document: reader.Document) -> None:
        self.source, self.document = source, document

    def error(self, path: tuple, message: str, at_key: bool = False) -> PolicyError:
        """An error at the value under `path`, or at its key when at_key is true."""
        probe = tuple(path)
        if at_key and ("key",) + probe in self.document.positions:
            probe = ("key",) + probe
        line, col = self.document.position(probe)
        return PolicyError(reader.printable(message), source=self.source, line=line, column=col,
                           key=reader.printable(format_path(tuple(path))))
