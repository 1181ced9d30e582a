"""`TopK`, the front end: load a bundle, choose each call's kernel from the manifest's dispatch
table, check the arguments, load or JIT-compile the kernel once, and hand the launch to a
backend. Both backends launch what `topkgen.policy.split.stages` plans: one launch, or a
split through a workspace (the caller's, or one allocated on the stream): one launch where the
kernel takes tickets (zeroed by the backend), else two, with
arguments passed by the names and in the order of the kernel's manifest `params`."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import replace
from typing import Any


from topkgen.build import bundle as bundles
from topkgen.manifest import reading as manifests
from topkgen.policy import DTYPE_SIZES, DispatchError, all_kernels, as_flag, as_integer, dispatch_table
from topkgen.common import settings
from topkgen.policy.dispatch_table import Choice
from topkgen.manifest.checks import entries
from topkgen.policy.explain import Explanation, explain
from topkgen.build.render import render
from topkgen.policy.split import ChunkPlan, scratch_bytes, stages
from topkgen.manifest.params import output_flags
from topkgen.common.suggest import did_you_mean
from topkgen.runtime.backend import Launch, TopKError, _Backend, _Work, _dtype, index_dtype_of, takes_tickets
from topkgen.runtime.binary import Binary, NoBinaryError, resolve_manifest
from topkgen.runtime.cuda_backend import _CudaBackend
from topkgen.runtime.emulator_backend import _EmulatorBackend

BACKENDS = ("cuda", "emulator")
SM_COUNT_MAX = 1024  # as the policy schema bounds split.sm_count


def jit_disabled() -> bool:
    return settings.flag("TOPKGEN_DISABLE_JIT")


class TopK:
    """Top-k over the last dimension, served by the kernels of a bundle (or JIT)."""

    def __init__(self, bundle: str | os.PathLike, *, arch: str | None = None, backend: str = "cuda",
                 gpu_arch: str | None = None, sm_count: int | None = None) -> None:
        """`bundle`: the bundle's directory (or its manifest.json); `arch`: the arch whose
        kernels serve the calls ("sm_90"; default: the one the load order of
        topkgen.runtime.binary picks for the GPU); `backend`: "cuda" or "emulator";
        `gpu_arch`: the GPU the emulator stands in for (the cuda backend takes the device's),
        so the load order runs on the CPU; `sm_count`: the SMs a split batch is planned to fill
        (default the GPU's own on the cuda backend; the policy's split.sm_count on the
        emulator). Each is checked before anything is read."""
        if not isinstance(bundle, (str, os.PathLike)):
            raise TopKError(f"bundle: expected a path (str or os.PathLike), got {type(bundle).__name__} {bundle!r}")
        if arch is not None and not isinstance(arch, str):
            raise TopKError(f"arch: expected a name such as 'sm_90' (a str), got {type(arch).__name__} {arch!r}")
        if not isinstance(backend, str) or backend not in BACKENDS:
            raise TopKError(f"backend: {backend!r} is not one of {', '.join(BACKENDS)}")
        if sm_count is not None and (_integer("sm_count", sm_count) < 1 or sm_count > SM_COUNT_MAX):
            raise TopKError(f"sm_count: must be in 1..{SM_COUNT_MAX}, got {sm_count}")
        try:
            self.manifest, self.root = manifests.load_manifest(bundle)
            self.policy = manifests.manifest_policy(self.manifest, str(bundle))
        except manifests.ManifestError as err:
            raise TopKError(str(err)) from None
        if "shard" in self.manifest:
            shard = self.manifest["shard"]
            raise TopKError(f"{self.root / manifests.MANIFEST}: shard: part {shard['index']}/{shard['count']} of a "
                            f"sharded build, not a bundle; assemble the parts with `topkgen merge` first")
        if gpu_arch is not None and (backend != "emulator" or not isinstance(gpu_arch, str)
                                     or not re.fullmatch(r"sm_[1-9][0-9]*[0-9]", gpu_arch)):
            raise TopKError(f"gpu_arch: the emulator's stand-in GPU, a name such as 'sm_86', got {gpu_arch!r}"
                            f"{'' if backend == 'emulator' else ' (the cuda backend takes the device)'}")
        if backend == "emulator" and arch is None and gpu_arch is None:
            raise TopKError("arch: the emulator backend needs an explicit arch (sm_90, sm_100, ...) or gpu_arch")
        self._backend: _Backend = _EmulatorBackend() if backend == "emulator" else _CudaBackend()
        self._backend.targets = dict(self.manifest["load_order"]["targets"])
        self.binary: Binary | None = None  # the load order's answer, when the arch was left to it
        if arch is None:
            gpu = gpu_arch if gpu_arch is not None else self._backend.current_arch()
            try:
                self.binary = resolve_manifest(gpu, self.manifest, jit=not jit_disabled())
            except NoBinaryError as err:
                raise TopKError(str(err)) from None
        self.arch = arch if arch is not None else self.binary.arch
        if self.arch not in self.policy.archs:
            raise TopKError(f"arch: {self.arch!r} is not in the bundle's policy (knows {', '.join(self.policy.archs)})"
                            f"{did_you_mean(self.arch, self.policy.archs)}")
        if backend == "cuda" and arch is not None:
            self._check_gpu_runs(arch)
        self._specs = {spec.name: spec for spec in all_kernels(self.policy, self.arch)}
        self._table, self.in_bundle = dispatch_table.serving_table(self.manifest, self.policy, self.arch)
        if self.binary is not None and self.binary.way == "jit":  # the arch's cubins do not run on this GPU
            self.in_bundle = False
        self._use_sm_count(sm_count if sm_count is not None else self._backend.sm_count())
        if self.in_bundle:
            self._entries = {e.record["name"]: e.record for e in entries(self.manifest) if e.record["arch"] == self.arch}
            try:  # every file checked now (sha256, ELF machine, SM) and kept: nothing is re-read later
                self._files = manifests.read_files(self.root, self.manifest, [self.arch])
            except manifests.ManifestError as err:
                raise TopKError(str(err)) from None
        else:  # an arch the bundle lacks: served by JIT
            self._entries = {name: bundles.spec_entry(spec) for name, spec in self._specs.items()}
            self._files = {}
        self._loaded: dict[str, Any] = {}

    def _use_sm_count(self, sm_count: int | None) -> None:
        """Plan split batches for a GPU of `sm_count` SMs: the bundle's table assumes the part
        its policy's split section names (H200's 132 for sm_90), and an H100 PCIe (114) or an
        H20 (78) would get H200's chunk counts. The same kernels serve; only the chunks per row
        of small batches change, so the table is tabulated again from the embedded policy."""
        split = self.policy.archs[self.arch].split
        self.sm_count = split.sm_count if split is not None and sm_count is None else sm_count
        if split is None or sm_count is None or sm_count == split.sm_count:
            return
        self.policy = self.policy.with_sm_count(self.arch, int(sm_count))
        self._table = dispatch_table.ArchTable(self.arch, dispatch_table.build(self.policy, [self.arch])[self.arch])

    def _check_gpu_runs(self, arch: str) -> None:
        """An arch named to the cuda backend must be one whose cubins this GPU runs: the same
        major compute capability, its minor at most the GPU's. Else the first call failed in
        the driver's cubin load (no binary for this GPU), not naming the argument."""
        major, minor = self.policy.archs[arch].capability
        gpu_major, gpu_minor = self._backend.device.compute_capability
        exact = self.manifest["load_order"]["targets"].get(arch, arch) != arch  # sm_90a cubins: sm_90 only
        if major != gpu_major or minor > gpu_minor or (exact and minor != gpu_minor):
            gpu = self._backend.current_arch()
            raise TopKError(f"arch: {arch!r} kernels do not run on this GPU ({gpu}); pass arch={gpu!r} or leave "
                            f"arch out (the backend takes the GPU's)")

    # ------------------------------------------------------------------ choosing
    def choose(self, dtype: str, k: int, n: int, deterministic: bool = False, rows: int | None = None) -> Choice:
        """The kernel for a shape, and its chunks per row for a batch of `rows` (None: the
        batch is unknown, served unsplit): one lookup in the dispatch table."""
        dtype, k, n, rows = _request(dtype, k, n, rows)
        deterministic = _flag("deterministic", deterministic)
        jit = not jit_disabled()
        if not jit and not self.in_bundle:
            raise TopKError(f"TOPKGEN_DISABLE_JIT is set and the bundle {self.root} has no kernels for {self.arch}")
        try:
            choice = self._table.lookup(dtype, k, n, deterministic, jit, rows)
        except DispatchError as err:
            raise TopKError(f"{err}{' (TOPKGEN_DISABLE_JIT is set)' if not jit else ''}") from None
        return choice if self.in_bundle else replace(choice, source="jit")

    def plan(self, dtype: str, k: int, n: int, rows: int, deterministic: bool = False) -> ChunkPlan | None:
        """How a batch of `rows` rows is split (None: it is not), so that a caller can size
        the workspace it passes (`workspace_bytes`). A batch of 0 rows launches nothing, as a
        call on one does: it is not split (the C++ loader's plan says the same)."""
        dtype, k, n, rows = _request(dtype, k, n, rows)
        if rows is None:  # choose's "batch unknown": never split, but a call on 1 row of 262144 is
            raise TopKError("rows: expected the batch's row count (an integer), got None: how a batch splits, "
                            "and the workspace it needs, depend on it")
        return self._plan(self.choose(dtype, k, n, deterministic, rows), rows, n, k, dtype)

    def _plan(self, choice: Choice, rows: int, n: int, k: int, dtype: str) -> ChunkPlan | None:
        """A choice's split, in one launch where its kernel takes tickets (their room in the workspace)."""
        if choice.chunks == 1:
            return None
        one_launch = takes_tickets(self._entries[choice.kernel]["params"])
        return ChunkPlan(rows, n, k, choice.chunks, DTYPE_SIZES[dtype], one_launch=one_launch)

    def workspace_bytes(self, dtype: str, k: int, n: int, rows: int, deterministic: bool = False,
                        index_dtype: str = "int64") -> int:
        """The workspace a call on rows x n elements needs (0: none): a split's candidates,
        or with index_dtype="int32" the large-k path's (rows x k x 8 bytes). Pass at least
        this many bytes as `workspace=` and the call allocates nothing (CUDA graphs can
        capture it)."""
        plan = self.plan(dtype, k, n, rows, deterministic)
        if plan is not None:
            return plan.workspace_bytes
        choice = self.choose(dtype, k, n, deterministic, rows)
        return self._scratch_bytes(choice.kernel, int(rows), int(k), _index_dtype(index_dtype))

    def _scratch_bytes(self, kernel: str, rows: int, k: int, index_dtype: str) -> int:
        """The large-k path's scratch (its kernels take `scratch`) for int32 indices, else 0."""
        takes = any(p["name"] == "scratch" for p in self._entries[kernel]["params"])
        return scratch_bytes(rows, k) if takes and index_dtype == "int32" else 0

    def explain(self, dtype: str, k: int, n: int, deterministic: bool = False, rows: int | None = None) -> Explanation:
        """The kernel that serves a shape and why: the table's choice, whose str() is what
        `topkgen explain` prints for the bundle's policy (an arch the bundle lacks is
        served by JIT, and says so)."""
        dtype, k, n, rows = _request(dtype, k, n, rows)
        choice = self.choose(dtype, k, n, deterministic, rows)  # checks deterministic is a bool
        answer = explain(self.policy, self.arch, dtype, k, n, deterministic=deterministic, jit=not jit_disabled(),
                         rows=rows)
        sel = answer.selection
        if (sel.kernel.name, sel.chunks) != (choice.kernel, choice.chunks):
            raise TopKError(f"the bundle's dispatch table sends {dtype} k={k} n={n}"
                            f"{'' if rows is None else f' rows={rows}'} to {choice.kernel} in {choice.chunks} "
                            f"chunk(s) per row but its policy to {sel.kernel.name} in {sel.chunks}; rebuild the bundle")
        if sel.source != choice.source or self.binary is not None:
            reason = sel.reason
            if sel.source != choice.source and (self.binary is None or self.binary.way != "jit"):
                reason += f"; the bundle has no {self.arch} kernel: jit"
            if self.binary is not None:
                reason += f"; binary: {self.binary.words}"
            sel = replace(sel, source=choice.source, why=lambda: reason)
            answer = replace(answer, selection=sel)
        return answer

    # ------------------------------------------------------------------ running
    def __call__(self, x: Any, k: int, *, largest: bool = True, deterministic: bool = False,
                 sorted: bool = True, index_dtype: str = "int64",  # noqa: A002 (torch.topk's name)
                 out: tuple[Any, Any] | None = None, dtype: str | None = None, stream: Any = None,
                 workspace: Any = None, lengths: Any = None, starts: Any = None, check: bool = False):
        """Returns (values, indices) of the k largest (or smallest) along the last dimension,
        sorted by value: largest first (smallest first with largest=False); deterministic=True
        takes the lowest-indexed of equal values at the k-th place; k = 0 returns empty arrays
        of shape [..., 0], as torch.topk does.
        A small batch of long rows may be split (one launch on the stream, two where the kernel
        takes no tickets): `workspace`, an array of at least `workspace_bytes(...)` bytes
        (its candidates, and for one launch its tickets, zeroed on the stream before it),
        serves it without an allocation; without one the backend allocates it on the stream.
        Nothing waits for the GPU.
        `out`: (values, indices), contiguous, of x's leading shape and k; values of x's type
        (or uint16 bits for 16-bit types), indices int64. Neither `out` nor `workspace` may
        share memory with x or with each other. `dtype` (short spellings too: bf16, fp16)
        says what raw uint16 input holds. `sorted=False` promises no order: the kernels skip
        their final sort and return the sorted call's set (fast mode: its ties may differ, as
        any two fast calls' may); deterministic mode returns the sorted call's set in the
        sorted order (its kernels sort anyway: that is what makes the order repeatable).
        `index_dtype` "int64" (torch's) or "int32", written by the kernels (`out[1]` follows
        it; the large-k path then needs `workspace_bytes(..., index_dtype="int32")` of
        scratch, allocated on the stream when no `workspace` is passed). Every argument is
        checked before a kernel is loaded (or JIT-compiled), in the same order by both
        backends: a refused call costs no compile.
        A ragged batch (topkgen.runtime.ragged): `lengths`, int32 or int64, one entry per row
        (device memory on the cuda backend, numpy on the emulator), and `starts` of the same
        type (optional, default 0): row r's candidates are x[r, starts[r] : starts[r] +
        lengths[r]], its indices positions in x's row; a row of fewer than k candidates
        returns them first and pads the rest with index -1 and value -inf (largest) or +inf
        (smallest). The kernel and any split come from x's n; the lengths are read on the
        device only. The emulator refuses a window outside the row, naming the row; the GPU
        kernels clamp it, unless `check=True`, which reads both arrays on the host first."""
        view = self._backend.view(x, dtype)
        k, largest = _integer("k", k), _flag("largest", largest)
        sorted_ = _flag("sorted", sorted)
        index_dtype = _index_dtype(index_dtype)
        self._backend.check_stream(stream)
        check = _flag("check", check)
        if starts is not None and lengths is None:
            raise TopKError("starts: given without lengths; a window is [starts[r], starts[r] + lengths[r]): pass "
                            "lengths= too")
        windows = self._backend.windows(view, lengths, starts, check)
        if k < 0:
            raise TopKError(f"k: must be >= 0 (0 returns empty results), got {k}")
        if k == 0:  # as torch.topk: empty values and indices of shape [..., 0]; nothing launched
            _flag("deterministic", deterministic)
            arrays = self._backend.check(view, 0, out, workspace, None, index_dtype)
            return self._backend.run(_Work(None, "", Launch(1, 1, 0), [], [], None, index_dtype), view, 0, arrays, stream)
        choice = self.choose(view.dtype, k, view.n, deterministic, view.rows)
        plan = self._plan(choice, view.rows, view.n, k, view.dtype)
        scratch = 0 if plan is not None else self._scratch_bytes(choice.kernel, view.rows, k, index_dtype)
        arrays = self._backend.check(view, k, out, workspace, plan, index_dtype, scratch)
        kernel = self._kernel(choice) if view.rows else None  # an empty batch loads and compiles nothing
        entry = self._entries[choice.kernel]
        ragged = (windows.window_bytes, windows.has_starts) if windows is not None else (0, False)
        launch = Launch.of(entry)
        work = _Work(kernel, choice.kernel, launch, entry["params"],
                     stages(view.rows, view.n, k, largest, plan, flags=output_flags(sorted_, index_dtype),
                            scratch=scratch > 0, window_bytes=ragged[0], starts=ragged[1],
                            shared=launch.shared) if view.rows else [],
                     plan, index_dtype, scratch, windows.pointers if windows is not None else {})
        return self._backend.run(work, view, k, arrays, stream)


    def _kernel(self, choice: Choice) -> Any:
        name = choice.kernel
        if name in self._loaded:
            return self._loaded[name]
        entry = self._entries[name]
        if choice.source == "aot":
            source = render(self._specs[name])
            if hashlib.sha256(source.encode()).hexdigest() != entry["source_sha256"]:
                raise TopKError(f"kernel {name}: the bundle was built from other source than this "
                                f"topkgen renders; rebuild the bundle")
            if self.binary is not None and self.binary.way == "ptx":  # the load order took the shipped PTX
                loaded = self._backend.load_ptx(name, self._files[f"{name}.ptx"], entry["symbol"], source)
            else:
                loaded = self._backend.load_aot(name, self._files[name], entry["symbol"], source)
        elif name in self._files:  # the source the bundle ships, sha256 checked at load
            loaded = self._backend.load_jit(name, self._files[name].decode())
        else:
            loaded = self._backend.load_jit(name, render(self._specs[name]))
        self._loaded[name] = loaded
        return loaded


def _integer(label: str, value: Any) -> int:
    """An integer argument as an int, by the rule the policy's own checks apply (any
    integral type, numpy's too; not a bool)."""
    try:
        return as_integer(label, value)
    except DispatchError as err:
        raise TopKError(str(err)) from None


def _index_dtype(value: Any) -> str:
    return index_dtype_of(value)


def _flag(label: str, value: Any) -> bool:
    """A yes/no argument as a bool, by the rule `select` applies (policy.as_flag): `largest="no"`
    or `deterministic=None` would quietly have served the other request."""
    try:
        return as_flag(label, value)
    except DispatchError as err:
        raise TopKError(str(err)) from None


def _request(dtype: str, k: Any, n: Any, rows: Any) -> tuple[str, int, int, int | None]:
    """A request's arguments as `choose`, `plan`, `workspace_bytes` and `explain` all take
    them: the dtype's short spellings expanded, k, n and rows as ints whatever integral type
    they came as (what `__call__` takes too). The ranges are the dispatch table's to check,
    with the messages every loader gives (rows 0, an empty batch, is served unsplit)."""
    dtype, k, n = _dtype(dtype), _integer("k", k), _integer("n", n)
    return dtype, k, n, None if rows is None else _integer("rows", rows)
