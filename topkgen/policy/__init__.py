"""The top-k kernel policy: load and validate it, plan the kernel set, and dispatch.

This module is the single source of truth shared by the AOT build, the runtime, the JIT
path, `explain` and `diff`. `select` is the only place where dispatch is decided.
It imports the standard library and PyYAML only, so other build systems can use it.
"""

from __future__ import annotations

import hashlib
import operator
import sys
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterable

from topkgen.common import reader, suggest
from topkgen.common.errors import InputError
from topkgen.common.schema import SchemaViolation, format_path, load_schema, validate
from topkgen.policy.split import ROWS_MAX, ChunkPlan

DTYPE_SIZES = {"float32": 4, "bfloat16": 2, "float16": 2}
DTYPE_TAGS = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
MODE_TAGS = {"fast": "fast", "deterministic": "det"}
MODES = ("fast", "deterministic")
K_MAX = 1024
N_MAX = 2**31 - 1
VECTOR_BYTES = 16
THREADS_PER_SM = 2048
# Shared memory one CTA may use (static + dynamic, with the opt-in attribute), per arch.
SHARED_BYTES_PER_BLOCK = {"sm_75": 65536, "sm_80": 166912, "sm_86": 101376, "sm_87": 166912, "sm_89": 101376,
                          "sm_90": 232448, "sm_100": 232448, "sm_103": 232448, "sm_120": 101376, "sm_121": 101376}
# Static shared memory of the largest radix kernel (K=1024): histogram, candidates, scratch.
RADIX_STATIC_SHARED_BYTES = 4 * 2048 + 8 * 1024 + 512
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
# minutes on it) and the table more than loaders index; the default policy's is ~15,000.
MAX_DISPATCH_CELLS = 1 << 17


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

    def min_chunk_for(self, k_rung: int) -> int:
        """The shortest chunk a kernel of this K rung gets."""
        return max(self.min_chunk, self.chunk_per_k * k_rung)

    def fitting(self, n: int, resident: int) -> int:
        """The fewest chunks whose every chunk a kernel reads once into shared memory when it
        holds `resident` elements there (max_chunks when none does). The last chunk is at
        most n / chunks + chunks - 1 long, so n <= chunks x (resident - chunks + 1) is enough
        (and keeps the answer monotone in n)."""
        return next((c for c in self.chunk_counts() if n <= c * (resident - c + 1)), self.max_chunks)

    def chunks(self, rows: int, n: int, k_rung: int, resident: int) -> int:
        """Chunks per row before the kernel's window: the largest power of two at most
        max_chunks and n / max(min_chunk, chunk_per_k x K), and at most the larger of
        sm_count x ctas_per_sm / rows (fill the GPU) and the chunks that fit the kernel's
        shared memory (`resident` elements, 0 for none: one read per element); 1 is no split."""
        if rows >= self.rows_below or n < self.min_n:
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
        return sorted({1, self.rows_below} | {target // s + 1 for s in self.chunk_counts()
                                              if target // s + 1 < self.rows_below})


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
    dynamic_shared_bytes: int = 0  # launched with this much dynamic shared memory
    loads_in_flight: int = 1

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
                       "min_ctas_per_sm": self.min_ctas_per_sm, "dynamic_shared_bytes": self.dynamic_shared_bytes},
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


def load(path: str | Path | None = None) -> Policy:
    """Load and validate a policy file (the default policy when path is None)."""
    path = Path(path) if path is not None else default_policy_path()
    return loads(read_file(path), source=str(path))


def read_file(path: str | Path, source: str | None = None) -> bytes:
    """A policy file's bytes (a pipe's too), read no further than a policy may be long;
    `source` names it in errors (default: the path)."""
    try:
        return reader.read_bytes(path, limit=MAX_POLICY_BYTES, what="policy")
    except reader.ReadError as err:
        raise PolicyError(err.message, source=err.source if source is None else source) from None


def loads(text: str | bytes, source: str = "<policy>") -> Policy:
    """Parse, validate and build a policy from YAML text (UTF-8 bytes, or str); `source`
    names it in errors. The policy keeps the text and the sha256 of the same bytes."""
    try:
        raw = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    except UnicodeEncodeError as err:
        raise PolicyError(f"not UTF-8: {reader.printable(err.reason)} at character {err.start}", source=source) from None
    if len(raw) > MAX_POLICY_BYTES:
        raise PolicyError(f"the policy is larger than {MAX_POLICY_BYTES} bytes", source=source)
    try:
        decoded = reader.decode(raw, source)
        document = reader.parse_yaml(decoded, source)
    except reader.ReadError as err:
        raise PolicyError(err.message, source=err.source, line=err.line, column=err.column, key=err.key) from None
    if document.value is None:
        raise PolicyError("the policy file is empty", source=source, line=1, column=1)
    doc = document.value
    if isinstance(doc, dict) and {"schema_version", "kernels", "dispatch"} <= doc.keys():  # not "unknown key dispatch"
        raise PolicyError("a bundle's manifest, not a policy: topkgen show reads a bundle, and the policy it was built "
                          "from is the manifest's policy.text", source=source, line=1, column=1)
    located = _Locator(source, document)
    try:
        validate(doc, load_schema("policy.schema.json"))
    except SchemaViolation as err:
        raise located.error(err.path, err.message, err.at_key) from None
    policy = _build(doc, located, source, hashlib.sha256(raw).hexdigest(), decoded)
    _check_kernel_names(policy, located)
    _check_total_dispatch(policy, located)
    _check_dispatch_grid(policy, located)
    return policy


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


def _build(doc: dict, loc: _Locator, source: str, sha: str, text: str) -> Policy:
    families = {}
    for name, f in doc["families"].items():
        template = f.get("template", FAMILY_TEMPLATES[name])
        if template != FAMILY_TEMPLATES[name]:
            raise loc.error(("families", name, "template"),
                            f"{name} kernels render from {FAMILY_TEMPLATES[name]}, not {template}")
        families[name] = Family(name, template, f["budget"]["max_registers"], f["budget"]["spills"])

    archs: dict[str, ArchTuning] = {}
    for name, t in doc["archs"].items():
        expected = arch_capability(name)
        if "capability" in t and tuple(t["capability"]) != expected:
            raise loc.error(("archs", name, "capability"),
                            f"{name} has capability {list(expected)}, not {t['capability']} (leave it out: "
                            f"the name says it)")
        for family in families:
            for key in FAMILY_ARCH_KEYS[family]:
                if key not in t:
                    raise loc.error(("archs", name), f"missing key '{key}': the policy declares {family} "
                                                     f"kernels, which need it", at_key=True)
        tail = t.get("vector_tail", {"policy": "runtime"})
        if tail["policy"] == "fixed" and "max_iterations" not in tail:
            raise loc.error(("archs", name, "vector_tail"), "policy 'fixed' needs max_iterations")
        if tail["policy"] == "runtime" and "max_iterations" in tail:
            raise loc.error(("archs", name, "vector_tail", "max_iterations"),
                            "max_iterations only applies to policy 'fixed'")
        ctas = {int(k): v for k, v in t.get("min_ctas_per_sm", {}).items()}
        shared = t.get("shared_row_bytes", 0)
        if shared % VECTOR_BYTES:
            raise loc.error(("archs", name, "shared_row_bytes"), f"{shared} is not a multiple of {VECTOR_BYTES}")
        if name not in SHARED_BYTES_PER_BLOCK:
            raise loc.error(("archs", name), f"topkgen does not know {name}'s shared memory per block "
                                                  f"(it knows {', '.join(SHARED_BYTES_PER_BLOCK)})", at_key=True)
        room = SHARED_BYTES_PER_BLOCK[name] - RADIX_STATIC_SHARED_BYTES
        if shared > room:
            raise loc.error(("archs", name, "shared_row_bytes"),
                            f"{shared} bytes leave no room for the radix kernels' {RADIX_STATIC_SHARED_BYTES} bytes "
                            f"of static shared memory within {name}'s {SHARED_BYTES_PER_BLOCK[name]} per block "
                            f"(at most {room})")
        loads_by_k = {int(k): v for k, v in t.get("loads_in_flight_by_k", {}).items()}
        split = None
        if "split" in t:
            if "radix" not in families:
                raise loc.error(("archs", name, "split"), "split rows run on radix kernels, and the policy "
                                                          "declares none (add the radix family, or remove split)")
            split = SplitTuning(**t["split"])
        archs[name] = ArchTuning(name, expected, t.get("threads"), t.get("warps_per_block"),
                                 tail["policy"], tail.get("max_iterations"), ctas, shared,
                                 t.get("loads_in_flight", 1), loads_by_k, split)

    aot = tuple(doc["dtypes"]["aot"])
    jit = tuple(doc["dtypes"].get("jit", []))
    for i, d in enumerate(jit):
        if d in aot:
            raise loc.error(("dtypes", "jit", i), f"{d} is already an AOT dtype")
    if not aot and not jit:  # nothing to serve: build failed on its own manifest (an internal error)
        raise loc.error(("dtypes", "aot"), "the policy serves no dtype: list one in dtypes.aot (compiled into the "
                                           "bundle) or dtypes.jit (compiled on first use)")

    declared: set[str] = set()
    for i, r in enumerate(doc["rules"]):
        if r["name"] in declared:
            raise loc.error(("rules", i, "name"), f"duplicate rule name '{r['name']}'")
        declared.add(r["name"])
    place: dict[str, int] = {}
    for i, name in enumerate(doc["dispatch_order"]):
        if name not in declared:
            raise loc.error(("dispatch_order", i), f"unknown rule '{name}'")
        if name in place:
            raise loc.error(("dispatch_order", i), f"rule '{name}' is listed twice")
        place[name] = i
    rules = []
    for i, r in enumerate(doc["rules"]):
        if r["name"] not in place:
            raise loc.error(("rules", i, "name"),
                            f"rule '{r['name']}' has no place in dispatch_order, so dispatch would be ambiguous")
        rules.append(_build_rule(r, i, place[r["name"]], archs, aot + jit, families, loc))
    _check_kernel_count(rules, loc)
    rules.sort(key=lambda r: r.position)
    _check_occupancy(archs, rules, loc)
    return Policy(source, sha, text, doc["name"], archs, aot, jit, families, tuple(rules),
                  doc.get("aot_covers_all", False))


def arch_capability(arch: str) -> tuple[int, int]:
    """The compute capability an arch name stands for: sm_90 -> (9, 0), sm_121 -> (12, 1)."""
    digits = arch[3:]
    return int(digits[:-1]), int(digits[-1])


def block_shape(family: str, tuning: ArchTuning, k: int) -> tuple[int, int]:
    """(threads per block, rows per block) of a family's kernels with K rung k: a warp per
    row for register kernels, max(K, threads) threads on one row for radix kernels."""
    if family == "register":
        return 32 * tuning.warps_per_block, tuning.warps_per_block
    return max(k, tuning.threads), 1


def _check_kernel_count(rules: list[Rule], loc: _Locator) -> None:
    total = 0
    for rule in rules:
        total += (len(rule.archs) * len(rule.dtypes) * len(rule.k_rungs) * len(rule.modes)
                  * (len(rule.n_exact) if rule.work == "exact" else 1))
        if total > MAX_KERNELS:
            raise loc.error(("rules", rule.doc_index), f"the rules up to this one declare {total} kernels "
                                                       f"over all archs, dtypes and modes; at most {MAX_KERNELS}")


def _check_occupancy(archs: dict[str, ArchTuning], rules: list[Rule], loc: _Locator) -> None:
    """min_ctas_per_sm CTAs of each kernel that gets them must fit on one SM, at the block
    size of that kernel's own family."""
    for rule in rules:
        for arch in rule.archs:
            tuning = archs[arch]
            for k in rule.k_rungs:
                ctas = tuning.min_ctas_per_sm.get(k)
                threads = block_shape(rule.family, tuning, k)[0]
                if ctas is not None and ctas * threads > THREADS_PER_SM:
                    raise loc.error(("archs", arch, "min_ctas_per_sm", str(k)),
                                    f"{ctas} CTAs of {threads} threads (the {rule.family} kernels of rule "
                                    f"'{rule.name}', K={k}) exceed {THREADS_PER_SM} threads per SM")


def _build_rule(r: dict, i: int, position: int, archs: dict, dtypes: tuple, families: dict,
                loc: _Locator) -> Rule:
    at = ("rules", i)
    fam, work = r["family"], r["work"]
    if fam not in families:
        raise loc.error(at + ("family",), f"family '{fam}' is not declared under families")
    if work not in WORK_BY_FAMILY[fam]:
        raise loc.error(at + ("work",), f"family '{fam}' has no work rung '{work}' "
                                         f"(allowed: {', '.join(WORK_BY_FAMILY[fam])})")
    for j, a in enumerate(r.get("archs", [])):
        if a not in archs:
            raise loc.error(at + ("archs", j), f"arch '{a}' is not declared under archs")
    for j, d in enumerate(r.get("dtypes", [])):
        if d not in dtypes:
            raise loc.error(at + ("dtypes", j), f"dtype '{d}' is not declared under dtypes")
    k_rungs = tuple(sorted(r["k"]))
    k_min = r.get("k_min", 1)
    if k_min > k_rungs[0]:
        raise loc.error(at + ("k_min",), f"k_min {k_min} is above the smallest K rung {k_rungs[0]}")

    n = r.get("n", {})
    needs = {"ladder": "ladder", "fixed_vec": "vector_iterations"}
    for key, owner in (("ladder", "ladder"), ("vector_iterations", "fixed_vec")):
        if key in r and work != owner:
            raise loc.error(at + (key,), f"'{key}' only applies to work '{owner}'")
    if work in needs and needs[work] not in r:
        raise loc.error(at, f"work '{work}' needs '{needs[work]}'")
    if work in ("ladder", "fixed_vec") and n:
        raise loc.error(at + ("n",), f"the N window of work '{work}' follows from its "
                                     f"{'ladder' if work == 'ladder' else 'vector iterations'}; remove 'n'")
    if work == "exact" and (set(n) != {"exact"}):
        raise loc.error(at + ("n",), "work 'exact' needs n: {exact: [...]} and nothing else")
    if work == "dynamic" and (set(n) != {"min", "max"}):
        raise loc.error(at + ("n",), "work 'dynamic' needs n: {min: ..., max: ...} and nothing else")
    if work == "dynamic" and n["min"] > n["max"]:
        raise loc.error(at + ("n", "min"), f"n.min {n['min']} is above n.max {n['max']}")
    ladder = tuple(sorted(r.get("ladder", ())))
    if fam == "register":
        if k_rungs[-1] > REGISTER_MAX_K:
            raise loc.error(at + ("k",), f"register kernels support K <= {REGISTER_MAX_K}")
        for j, value in enumerate(n.get("exact", [])):
            if value % 32 or value > REGISTER_MAX_N:
                raise loc.error(at + ("n", "exact", j),
                                f"register exact N must be a multiple of 32 and <= {REGISTER_MAX_N}")
        if ladder and ladder[0] < k_rungs[-1]:
            raise loc.error(at + ("ladder",), f"the smallest ladder rung {ladder[0]} is below K {k_rungs[-1]}")

    modes = tuple(m for m in MODES if m in r["modes"])
    serves = tuple(m for m in MODES if m in r.get("serves", r["modes"]))
    for m in serves:
        if m not in modes and not (m == "fast" and modes == ("deterministic",)):
            raise loc.error(at + ("serves",), f"a rule built for {list(modes)} cannot serve '{m}'")
    for m in modes:
        if m not in serves:
            raise loc.error(at + ("serves",), f"mode '{m}' is built but not served")
    is_aot = r.get("aot", True)
    if not is_aot and "reason" not in r:
        raise loc.error(at, "a JIT-only rule (aot: false) needs a 'reason'")
    if is_aot and "reason" in r:
        raise loc.error(at + ("reason",), "'reason' is for JIT-only rules (aot: false)")
    return Rule(
        name=r["name"], family=fam, work=work,
        archs=tuple(a for a in archs if a in r.get("archs", archs)),
        dtypes=tuple(d for d in dtypes if d in r.get("dtypes", dtypes)),
        k_rungs=k_rungs, k_min=k_min,
        n_min=n.get("min"), n_max=n.get("max"), n_exact=tuple(sorted(n.get("exact", ()))),
        ladder=ladder, vector_iterations=r.get("vector_iterations"),
        modes=modes, serves=serves, aot=is_aot, reason=r.get("reason"), position=position, doc_index=i,
    )


# ----------------------------------------------------------------------------- planning

def kernels_of_rule(policy: Policy, rule: Rule, arch: str, dtype: str) -> list[KernelSpec]:
    """Every kernel a rule declares for one arch and dtype, in a stable order."""
    key = (rule.name, arch, dtype)
    cached = policy._kernel_cache.get(key)
    if cached is not None:
        return cached
    out: list[KernelSpec] = []
    if arch in rule.archs and dtype in rule.dtypes:
        tuning = policy.archs[arch]
        family = policy.families[rule.family]
        vec = VECTOR_BYTES // DTYPE_SIZES[dtype]
        exacts: Iterable[int | None] = rule.n_exact if rule.work == "exact" else (None,)
        lower = rule.k_min
        for k in rule.k_rungs:
            for exact in exacts:
                for mode in rule.modes:
                    out.append(_kernel(policy, rule, tuning, family, dtype, k, lower, exact, mode, vec))
            lower = k + 1
    policy._kernel_cache[key] = out
    return out


def _kernel(policy: Policy, rule: Rule, tuning: ArchTuning, family: Family, dtype: str, k: int,
            k_min: int, exact: int | None, mode: str, vec: int) -> KernelSpec:
    threads, rows_per_block = block_shape(rule.family, tuning, k)
    loads = 1
    if rule.family == "radix":
        loads = tuning.loads_in_flight_by_k.get(k, tuning.loads_in_flight)
        if rule.work == "fixed_vec":  # no more loads per step than vectors per thread
            loads = min(loads, rule.vector_iterations)
    if rule.work == "ladder":
        n_min, n_max, work_tag = 1, rule.ladder[-1], "ladder"
    elif rule.work == "exact":
        n_min = n_max = exact
        work_tag = f"n{exact}"
    elif rule.work == "fixed_vec":
        n_min, n_max, work_tag = 1, rule.vector_iterations * threads * vec, f"fv{rule.vector_iterations}"
    else:
        n_min, n_max, work_tag = rule.n_min, rule.n_max, "dyn"
    name = f"topk_{rule.family}_{work_tag}_k{k}_{MODE_TAGS[mode]}_{DTYPE_TAGS[dtype]}_{tuning.name}"
    return KernelSpec(
        name=name, arch=tuning.name, family=rule.family, template=family.template, rule=rule.name,
        work=rule.work, dtype=dtype, k=k, k_min=k_min, n_min=n_min, n_max=n_max, exact_n=exact,
        mode=mode, serves=tuple(m for m in rule.serves if _built_mode(rule, m) == mode),
        threads=threads, rows_per_block=rows_per_block,
        min_ctas_per_sm=tuning.min_ctas_per_sm.get(k, 1), vector_width=vec,
        vector_iterations=rule.vector_iterations, ladder=rule.ladder,
        tail_policy=tuning.tail_policy, tail_max_iterations=tuning.tail_max_iterations,
        aot=rule.aot and dtype in policy.aot_dtypes,
        max_registers=family.max_registers, spills_allowed=family.spills_allowed,
        dynamic_shared_bytes=_dynamic_shared_bytes(rule, tuning, n_max, vec, DTYPE_SIZES[dtype]),
        loads_in_flight=loads,
    )


def _dynamic_shared_bytes(rule: Rule, tuning: ArchTuning, n_max: int, vec: int, size: int) -> int:
    """A radix kernel's dynamic shared memory: the arch's shared_row_bytes, or less when
    every row the kernel serves fits (its copy needs up to vec - 1 keys of alignment room)."""
    if rule.family != "radix":
        return 0
    whole_row = -(-(n_max + vec - 1) * size // VECTOR_BYTES) * VECTOR_BYTES
    return min(tuning.shared_row_bytes, whole_row)


def plan(policy: Policy, arch: str) -> list[KernelSpec]:
    """The AOT kernel set of one arch, in a stable order (dispatch order, dtype, K, mode)."""
    _check_arch(policy, arch)
    return [spec for rule in policy.rules if rule.aot
            for dtype in policy.aot_dtypes
            for spec in kernels_of_rule(policy, rule, arch, dtype)]


def jit_kernels(policy: Policy, arch: str) -> list[KernelSpec]:
    """The kernels of the JIT-only rules for one arch, for every dtype they serve."""
    _check_arch(policy, arch)
    return [spec for rule in policy.jit_only_rules([arch]) for dtype in policy.dtypes
            for spec in kernels_of_rule(policy, rule, arch, dtype)]


def all_kernels(policy: Policy, arch: str) -> list[KernelSpec]:
    """Every kernel of one arch that some rule declares, AOT or JIT, in every dtype, in a
    stable order (dispatch order, dtype, K, mode): all that a runtime may be asked for."""
    return [spec for rule in policy.rules for dtype in policy.dtypes
            for spec in kernels_of_rule(policy, rule, arch, dtype)]


def jit_plan(policy: Policy, arch: str) -> list[KernelSpec]:
    """Every kernel of one arch that the AOT plan leaves to JIT (the JIT-only tiers in
    every dtype, and every rule's kernels in the JIT dtypes), in a stable order."""
    _check_arch(policy, arch)
    return [spec for spec in all_kernels(policy, arch) if not spec.aot]


def _check_kernel_names(policy: Policy, loc: _Locator) -> None:
    """Kernel names are identities (AOT lookup and JIT cache key): two rules must never
    declare the same one."""
    seen: dict[str, Rule] = {}
    for arch in policy.archs:
        for rule in policy.rules:
            for dtype in policy.dtypes:
                for spec in kernels_of_rule(policy, rule, arch, dtype):
                    other = seen.setdefault(spec.name, rule)
                    if other is not rule:
                        raise loc.error(("rules", rule.doc_index, "name"),
                                        f"duplicate kernel name '{spec.name}': rule '{other.name}' declares it too")


# ----------------------------------------------------------------------------- dispatch

def in_policy_order(policy: Policy, archs: Iterable[str]) -> list[str]:
    """`archs`, each once, in the policy's order: a bundle of sm_100 and sm_90 is the same,
    byte for byte, however its archs were named."""
    named = list(archs)
    for arch in named:
        _check_arch(policy, arch)
    return [arch for arch in policy.archs if arch in named]


def _check_arch(policy: Policy, arch: str) -> None:
    if arch not in policy.archs:
        raise DispatchError(f"arch: '{arch}' is not in the policy (known: {', '.join(policy.archs)})")


def _built_mode(rule: Rule, mode: str) -> str:
    """The mode of the kernel that serves `mode` requests (a rule may serve both modes with
    its deterministic kernels alone)."""
    return mode if mode in rule.modes else rule.modes[0]


def _rule_matches(policy: Policy, rule: Rule, arch: str, dtype: str, k: int, n: int,
                  mode: str) -> KernelSpec | None:
    if arch not in rule.archs or dtype not in rule.dtypes or mode not in rule.serves:
        return None
    if not (rule.k_min <= k <= rule.k_rungs[-1]):
        return None
    built_mode = _built_mode(rule, mode)
    for spec in kernels_of_rule(policy, rule, arch, dtype):
        if spec.k_min <= k <= spec.k and spec.mode == built_mode and spec.serves_n(n):
            return spec
    return None


def select(policy: Policy, arch: str, dtype: str, k: int, n: int, deterministic: bool = False,
           jit: bool = True, rows: int | None = None) -> Selection:
    """The kernel that serves (arch, dtype, k, n, mode): the first rule in dispatch order
    that serves the shape. With jit=False, JIT-only rules are skipped and the shape must be
    of an AOT dtype. With `rows`, the batch size, the answer says whether the rows are split
    and how (`Selection.split`); rows=None, a caller that does not know the batch, never
    splits: it gets the one-CTA-per-row answer, which serves any batch. This is the only
    dispatch rule in topkgen."""
    deterministic, jit = as_flag("deterministic", deterministic), as_flag("jit", jit)
    _check_arch(policy, arch)
    if dtype not in policy.dtypes:
        raise unknown_dtype(dtype, policy.dtypes)
    check_shape(k, n)
    if rows is not None:
        check_rows(rows)
    if not jit and dtype not in policy.aot_dtypes:
        raise DispatchError(f"dtype: '{dtype}' has no AOT kernels and JIT is disabled")
    mode = "deterministic" if deterministic else "fast"
    skipped: list[str] = []
    for rule in policy.rules:
        spec = _rule_matches(policy, rule, arch, dtype, k, n, mode)
        if spec is None:
            continue
        if not jit and not rule.aot:
            skipped.append(rule.name)
            continue
        split = _split(policy, arch, spec, rows, n, k)

        def why(rule: Rule = rule, spec: KernelSpec = spec) -> str:
            reason = _reason(policy, rule, spec, dtype, k, n, mode, skipped)
            if rows is None:
                return reason
            return f"{reason}; {_split_reason(policy.archs[arch].split, spec, rows, n, split)}"

        return Selection(spec, "aot" if spec.aot else "jit", rule.name, why, tuple(skipped), split)
    raise DispatchError(f"no kernel serves arch={arch} dtype={dtype} k={k} n={n} mode={mode}"
                        f"{' without JIT' if not jit else ''}")


def unknown_dtype(dtype: str, known: Iterable[str]) -> DispatchError:
    """The refusal of a dtype that `known` (a policy's, a bundle's) lacks, in the words the
    command line (cli.DtypeType) and the runtime's dtype= use, suggestion included: `choose`
    said "'flaot32' is not in the bundle (known: ...)" and suggested nothing."""
    known = set(known)
    return DispatchError(f"dtype: {suggest.unknown_dtype(dtype, [d for d in DTYPE_SIZES if d in known])}")


def check_rows(rows: int) -> None:
    """Refuse a batch size outside 0 <= rows <= ROWS_MAX, with the message every loader gives.
    0 is a request too: an empty batch launches nothing, so it is served unsplit, as an
    unknown batch is, and needs no workspace."""
    rows = as_integer("rows", rows)
    if rows < 0:
        raise DispatchError(f"rows: must be >= 0, got {rows}")
    if rows > ROWS_MAX:
        raise DispatchError(f"rows: must be <= {ROWS_MAX}, got {rows}")


def resident_elements(spec: KernelSpec) -> int:
    """The longest row (or chunk) a radix kernel reads once into its dynamic shared memory
    (the kernel's own test: n <= bytes / size - (16 / size - 1)); 0 when it has none."""
    size = DTYPE_SIZES[spec.dtype]
    return max(0, spec.dynamic_shared_bytes // size - (VECTOR_BYTES // size - 1))


def split_capable(spec: KernelSpec) -> bool:
    """Whether a kernel can run on chunks and merge candidates (it takes chunk, row_stride
    and x_indices: the radix family)."""
    return spec.family == "radix"


def _split(policy: Policy, arch: str, spec: KernelSpec, rows: int | None, n: int, k: int) -> ChunkPlan | None:
    """The chunk plan of a request, or None: the arch's split rule, then the kernel's own
    limits (it must take chunks, and its n window must hold every chunk and the merge)."""
    tuning = policy.archs[arch].split
    if not rows or tuning is None or not split_capable(spec):  # unknown or empty batch: unsplit
        return None
    chunks = tuning.chunks(rows, n, spec.k, resident_elements(spec))
    if chunks < 2:
        return None
    plan = ChunkPlan(rows, n, k, chunks, DTYPE_SIZES[spec.dtype])
    if not spec.n_min <= min(plan.chunk, plan.candidates) or plan.candidates > spec.n_max:
        return None
    return plan


def _split_reason(tuning: SplitTuning | None, spec: KernelSpec, rows: int, n: int, split: ChunkPlan | None) -> str:
    if rows == 0:
        return "not split: rows=0, an empty batch launches nothing"
    if tuning is None:
        return "not split: the arch has no split section"
    if not split_capable(spec):
        return f"not split: {spec.family} kernels do not take chunks"
    if rows >= tuning.rows_below:
        return f"not split: rows={rows} >= rows_below {tuning.rows_below}"
    if n < tuning.min_n:
        return f"not split: n={n} < min_n {tuning.min_n}"
    resident = resident_elements(spec)
    fill = f"{tuning.sm_count} SMs x {tuning.ctas_per_sm} / {rows} rows = {tuning.sm_count * tuning.ctas_per_sm // rows}"
    if resident:
        fill = f"max({fill}, {tuning.fitting(n, resident)} chunks fit the kernel's shared memory)"
    bounds = (f"max_chunks {tuning.max_chunks}, n / max(min_chunk {tuning.min_chunk}, {tuning.chunk_per_k} x K "
              f"{spec.k}) = {n // tuning.min_chunk_for(spec.k)} and {fill}")
    if split is None:
        chunks = tuning.chunks(rows, n, spec.k, resident)
        if chunks < 2:
            return f"not split: fewer than 2 chunks within {bounds}"
        return (f"not split: the kernel's n window [{spec.n_min}, {spec.n_max}] does not hold {chunks} chunks of "
                f"{n // chunks} and their merge")
    return f"split into {split.chunks} chunks per row: the largest power of two within {bounds}"


def check_shape(k: int, n: int) -> None:
    """Refuse a (k, n) outside the dispatch domain, 1 <= k <= K_MAX, k <= n <= N_MAX, with
    the message every loader gives (the manifest's table lookups call this too)."""
    _check_counts(("k", k, K_MAX), ("n", n, N_MAX))
    if k > n:
        raise DispatchError(f"k: must be <= n, got k={k} > n={n}")


def as_integer(label: str, value: object) -> int:
    """`value` as a Python int: any integral type (numpy's integers too, through
    operator.index), so that every entry point takes what `x.shape` or arithmetic on arrays
    gives; a bool is refused, though Python counts it an int: True is never a k or an n."""
    numpy = sys.modules.get("numpy")  # numpy's bool has __index__ too; checked without importing numpy
    if isinstance(value, bool) or (numpy is not None and isinstance(value, numpy.bool_)):
        raise DispatchError(f"{label}: must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise DispatchError(f"{label}: must be an integer, got {value!r}") from None


def as_flag(label: str, value: object) -> bool:
    """A yes/no argument as a bool: a bool (numpy's too), never a value Python merely finds
    truthy: `deterministic="no"` or `jit=None` would quietly have served the other request."""
    numpy = sys.modules.get("numpy")
    if isinstance(value, bool) or (numpy is not None and isinstance(value, numpy.bool_)):
        return bool(value)
    raise DispatchError(f"{label}: expected True or False, got {value!r}")


def _check_counts(*counts: tuple[str, object, int]) -> None:
    """Each (label, value, most) an integer in 1..most: every type first, then every range."""
    values = [as_integer(label, value) for label, value, _ in counts]
    for (label, _, most), value in zip(counts, values):
        if value <= 0:
            raise DispatchError(f"{label}: must be >= 1, got {value}")
        if value > most:
            raise DispatchError(f"{label}: must be <= {most}, got {value}")


def _reason(policy: Policy, rule: Rule, spec: KernelSpec, dtype: str, k: int, n: int, mode: str,
            skipped: list[str]) -> str:
    window = f"n == {spec.exact_n}" if spec.work == "exact" else f"n in [{spec.n_min}, {spec.n_max}]"
    parts = [f"rule '{rule.name}' (#{rule.position + 1} in dispatch_order) is the first that serves "
             f"k={k} (K rung {spec.k} serves k {spec.k_min}..{spec.k}), n={n} ({window}), mode {mode}"]
    if mode != spec.mode:
        parts.append(f"its {spec.mode} kernel serves {mode} requests too")
    if skipped:
        parts.append(f"JIT disabled: skipped JIT-only rule(s) {', '.join(skipped)}")
    if not rule.aot:
        parts.append(f"JIT-only tier: {rule.reason}")
    elif dtype not in policy.aot_dtypes:
        parts.append(f"JIT: {dtype} has no AOT kernels")
    else:
        parts.append("AOT: in the bundle")
    return "; ".join(parts)


COVERAGE_RULE = ("Every arch, dtype and mode of a policy needs a kernel for every 1 <= k <= 1024 and "
                 "k <= n <= 2^31-1.")
GAP_FIX_JIT = ("To leave the shapes your rules do not cover to JIT, add a JIT-only rule and put it last in "
               "dispatch_order: {name: jit_rest, family: radix, work: dynamic, k: [1024], "
               "n: {min: 1, max: 2147483647}, modes: [fast, deterministic], aot: false, reason: \"...\"} "
               "(it serves whatever no earlier rule serves; declare the radix family if the policy lacks it).")
GAP_FIX_AOT = ("aot_covers_all: true asks the AOT rules to serve it alone: add an AOT rule for it, or set "
               "aot_covers_all: false to let JIT-only rules serve it.")


def _check_total_dispatch(policy: Policy, loc: _Locator) -> None:
    """Every (dtype, 1 <= k <= 1024, k <= n <= 2^31-1, mode) must be served on every arch
    with JIT and, where the policy says aot_covers_all, by AOT kernels alone for AOT dtypes. The rules' k ranges and n windows are
    intervals, so checking the n coverage at each k-segment start proves it for all k."""
    k_starts = {1}
    for rule in policy.rules:
        k_starts.add(rule.k_min)
        for k in rule.k_rungs:
            if k + 1 <= K_MAX:
                k_starts.add(k + 1)
    for arch in policy.archs:
        for dtype in policy.dtypes:
            for mode in MODES:
                for with_jit in (True, False):
                    if not with_jit and (dtype not in policy.aot_dtypes or not policy.aot_covers_all):
                        continue
                    for k in sorted(k_starts):
                        gap = _n_gap(policy, arch, dtype, mode, k, with_jit)
                        if gap is not None:
                            raise loc.error(("dispatch_order",),
                                            f"the rules leave a gap: nothing serves arch={arch} dtype={dtype} "
                                            f"mode={mode} k={k} n={gap[0]}..{gap[1]}"
                                            f"{'' if with_jit else ' without JIT'}. {COVERAGE_RULE} "
                                            f"{GAP_FIX_AOT if not with_jit else GAP_FIX_JIT}")


def _check_dispatch_grid(policy: Policy, loc: _Locator) -> None:
    from topkgen.policy import dispatch_table  # it reads a Policy: imported once there is one

    cells = dispatch_table.grid_cells(policy)
    if cells > MAX_DISPATCH_CELLS:
        raise loc.error(("rules",), f"the rules' k, n and batch bounds cut dispatch into {cells} cells over all "
                                    f"archs, dtypes and modes; at most {MAX_DISPATCH_CELLS} (every loader indexes "
                                    f"them): serve neighbouring exact n with one window (n: {{min, max}})",
                        at_key=True)


def _n_gap(policy: Policy, arch: str, dtype: str, mode: str, k: int, with_jit: bool) -> tuple[int, int] | None:
    intervals = []
    for rule in policy.rules:
        if (not with_jit and not rule.aot) or arch not in rule.archs or dtype not in rule.dtypes:
            continue
        if mode not in rule.serves or not (rule.k_min <= k <= rule.k_rungs[-1]):
            continue
        built = _built_mode(rule, mode)
        for spec in kernels_of_rule(policy, rule, arch, dtype):
            if spec.k_min <= k <= spec.k and spec.mode == built:
                intervals.append((spec.n_min, spec.n_max))
    covered = k  # first n not yet known to be served
    for lo, hi in sorted(intervals):
        if lo > covered:
            return covered, lo - 1
        covered = max(covered, hi + 1)
        if covered > N_MAX:
            return None
    return (covered, N_MAX) if covered <= N_MAX else None
