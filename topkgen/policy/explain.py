"""Why a kernel serves a shape, as one object that `topkgen explain` prints and
`TopK.explain()` returns: str() is the text, record() the JSON document
(schemas/explain.schema.json), so the command and the library cannot word it differently.

It imports topkgen.policy only: `select` decides, this module words the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from topkgen.policy.model import KernelSpec, Policy, Selection
from topkgen.policy.selection import select

SCHEMA_VERSION = 2


@dataclass(frozen=True)
class Explanation:
    """A request (arch, dtype, k, n, mode, JIT allowed, and the batch size when known) and
    the selection that serves it."""

    arch: str
    dtype: str
    k: int
    n: int
    deterministic: bool
    jit: bool
    selection: Selection
    policy: dict[str, str]  # path, name, sha256 of the policy that decided
    rows: int | None = None
    binary: Any = None  # with a GPU's arch (explain --gpu-arch): the load order's Binary (gpu, way, arch, words)

    # The selection's parts, so an Explanation reads like the Selection it holds.
    @property
    def kernel(self) -> KernelSpec:
        return self.selection.kernel

    @property
    def source(self) -> str:
        return self.selection.source

    @property
    def rule(self) -> str:
        return self.selection.rule

    @property
    def reason(self) -> str:
        return self.selection.reason

    @property
    def mode(self) -> str:
        return "deterministic" if self.deterministic else "fast"

    def request(self) -> dict[str, Any]:
        return {"arch": self.arch, "dtype": self.dtype, "k": self.k, "n": self.n, "rows": self.rows,
                "mode": self.mode, "jit": self.jit}

    def split_words(self) -> str:
        """The chunk plan in words: what the split line prints."""
        plan = self.selection.split
        if plan is None:
            if self.rows == 0:
                return "none: an empty batch launches nothing"
            per_cta = self.kernel.rows_per_block
            whole = "one CTA per row" if per_cta == 1 else f"each CTA takes {per_cta} whole rows"
            return f"none: {whole}" if self.rows is not None else f"none: {whole} (no batch size given)"
        same = " in the same launch (the tickets in the workspace too)" if plan.one_launch else ""
        return (f"{plan.chunks} chunks per row of {plan.chunk} elements (the last {plan.last_chunk}), "
                f"{plan.rows * plan.chunks} CTAs; then {self.kernel.name} merges {plan.candidates} candidates "
                f"per row{same}; workspace {plan.workspace_bytes} bytes")

    def grid_words(self) -> str:
        """The launches' grids as the loader computes them (README, Writing a loader): CTAs x
        threads and what each CTA takes, for every family (register kernels take several rows
        per CTA; a split runs rows x chunks CTAs, then one per row, or in one launch (a kernel
        that merges, schema 7) each row's last CTA merging it)."""
        spec, rows = self.kernel, self.rows
        threads, per_cta = spec.threads, spec.rows_per_block
        if rows == 0:
            return "none: an empty batch launches nothing"
        rows_word = "1 row" if per_cta == 1 else f"{per_cta} rows"
        if rows is None:
            ctas = "rows CTAs" if per_cta == 1 else f"ceil(rows / {per_cta}) CTAs"
            return f"{ctas} x {threads} threads, {rows_word} per CTA (no batch size given)"
        plan = self.selection.split
        if plan is not None and plan.one_launch:
            return (f"one launch: {plan.rows * plan.chunks} CTAs x {threads} threads, 1 chunk per CTA, each row's "
                    f"last CTA then merging (as two: then {_ctas(rows)} x {threads} threads, 1 row per CTA)")
        if plan is not None:
            return (f"stage 1: {plan.rows * plan.chunks} CTAs x {threads} threads, 1 chunk per CTA; "
                    f"stage 2: {_ctas(rows)} x {threads} threads, 1 row per CTA")
        return f"{_ctas(-(-rows // per_cta))} x {threads} threads, {rows_word} per CTA"

    def __str__(self) -> str:
        gpu = () if self.binary is None else (f"gpu:    {self.binary.gpu}: {self.binary.way} ({self.binary.arch})",
                                              f"binary: {self.binary.words}")
        return "\n".join((
            *gpu,
            f"shape:  {self.arch} {self.dtype} k={self.k} n={self.n}"
            f"{'' if self.rows is None else f' rows={self.rows}'} mode={self.mode}"
            f"{'' if self.jit else ' (JIT disabled)'}",
            f"kernel: {self.kernel.name}",
            f"source: {self.source}",
            f"rule:   {self.rule}",
            f"split:  {self.split_words()}",
            f"grid:   {self.grid_words()}",
            f"why:    {self.reason}",
        ))

    def record(self) -> dict[str, Any]:
        """The JSON document of `topkgen explain --format json`: the request echoed, the answer."""
        sel = self.selection
        gpu = {} if self.binary is None else {"binary": {"gpu": self.binary.gpu, "way": self.binary.way,
                                                        "arch": self.binary.arch, "words": self.binary.words}}
        return {"format": "topkgen-explain", "schema_version": SCHEMA_VERSION, "policy": dict(self.policy),
                "request": self.request(), "kernel": sel.kernel.name, "source": sel.source, "rule": sel.rule,
                "reason": sel.reason, "skipped_jit_rules": list(sel.skipped), "spec": sel.kernel.record(),
                "split": None if sel.split is None else {**sel.split.record(), "stage2_kernel": sel.kernel.name}, **gpu}


def _ctas(count: int) -> str:
    return "1 CTA" if count == 1 else f"{count} CTAs"


def explain(policy: Policy, arch: str, dtype: str, k: int, n: int, *, deterministic: bool = False,
            jit: bool = True, rows: int | None = None) -> Explanation:
    """`select`'s answer for a shape, with the request it answers."""
    sel = select(policy, arch, dtype, k, n, deterministic=deterministic, jit=jit, rows=rows)
    return Explanation(arch, dtype, k, n, deterministic, jit, sel, policy.reference(), rows)
