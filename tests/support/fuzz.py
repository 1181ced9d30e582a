"""`make fuzz`: bounded-time fuzzing of the policy reader, the manifest reader and `run`
(issue 11, point 7), built on hypothesis.

    python -m tests.support.fuzz --seconds 300            # every target, the time split between them
    python -m tests.support.fuzz --target run --seconds 60
    python -m tests.support.fuzz --target run --seconds 600 --seed 7000000   # other inputs than CI's

Each target runs in its own process (a crash is caught as a failure, not lost) and feeds
topkgen, in process through its CLI, with inputs drawn from three sources: structured
documents (tests/support/strategies.py), mutations of real inputs (the default and legacy policies,
a manifest built here, arrays saved by numpy) with hostile snippets spliced in, and raw
bytes. A case fails on a traceback or an internal error (exit 70), on an exit status
other than 0 or 2 (diff may also say 1: the sides differ), on a message that is not one
line, on a case running over 10 s (faulthandler ends the process and leaves the input in
fuzz-out/), or when an accepted input later breaks plan, render, select or the results.
"""

from __future__ import annotations

import argparse
import faulthandler
import hashlib
import io
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from topkgen import policy as pol
from topkgen.cli import main as cli_main
from topkgen.common.errors import InputError
from topkgen.build.render import render

from .strategies import _NoAliases, policy_documents, policy_text
from .topk_cases import NUMPY_DTYPES, check_topk

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "fuzz-out"
TARGETS = ("policy", "manifest", "run")
HANG_SECONDS = 10
CHUNK = 150  # examples per hypothesis run; runs repeat with new seeds until time is up
BASES = [(ROOT / "policies" / "topk.yaml").read_text(), (ROOT / "policies" / "legacy" / "exact_n_grid.yaml").read_text()]
SNIPPETS = [
    "!!python/name:os.system ", "!!python/object/apply:os.system ['true']", "!!int ", "!!bool ", "!!timestamp ",
    "!!binary ", "!!set ", "!!str ", "!custom ", "&a ", "*a", "<<: ", "<<: *a", "? ", "---\n", "...\n",
    "%TAG ! tag:yaml.org,2002:\n", "%YAML 1.1\n", "[" * 40, "]" * 40, "{" * 40, "[" * 5000, "9" * 30, "9" * 5000,
    "-1", "0", "2147483647", "2147483648", "0x7fffffff", "0o777", "1e999", ".nan", "-.inf", "1_000", "12:30",
    "2001-12-14", "yes", "no", "~", "null", "", " ", "\t", "\n", "\r\n", "\x00", "\x07", "\x1b[31m", "\x85",
    "\u2028", "\u202e", "\ufeff", "\ufffe", '"\\ud800"', '"\\u0000"', '"\\x1b"', "'", '"', "\\", "#", ": ", "- ",
    ",", "sm_90", "sm_100", "sm_75", "radix", "register", "float16", "bfloat16", "1024", "4096", "128", "256",
    "k_min: 1000", "modes: []", "aot: false", "reason: x", "threads: 128", "template: x.cu.j2",
]
JSON_SNIPPETS = ['\\u0000', '\\ud800', '\\udc00', '\\u202e', '\\n', '"', '[' * 50, '[' * 5000, 'NaN', 'Infinity',
                 '1e999', '-0', '9' * 30, '9' * 500, 'null', 'true', '{}', '[]', '"a": 1, "a": 2', '\x00', '\ufeff',
                 '"../../etc/passwd"', '"/abs.cubin"', '"sm_90/\\u0000.cubin"', '"\\udc80"']


# ----------------------------------------------------------------------------- mutations

@st.composite
def mutated_text(draw, base: str, snippets: list[str]) -> str:
    """`base` with a few splices: hostile snippets or arbitrary text in, spans out or doubled."""
    text = base
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["insert", "insert", "delete", "replace", "duplicate"]))
        end = min(len(text), pos + draw(st.integers(1, 60)))
        piece = draw(st.sampled_from(snippets) | st.text(max_size=12))
        if op == "insert":
            text = text[:pos] + piece + text[pos:]
        elif op == "delete":
            text = text[:pos] + text[end:]
        elif op == "replace":
            text = text[:pos] + piece + text[end:]
        else:
            text = text[:pos] + text[pos:end] * draw(st.integers(2, 30)) + text[end:]
    return text


def json_values(depth: int = 2):
    scalars = (st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.sampled_from([0, 1, -1, 1024, 2**31 - 1, 2**31,
                                                                                         2**63, 10**30])
               | st.floats(allow_nan=False) | st.text(max_size=20) | st.sampled_from(SNIPPETS))
    if depth == 0:
        return scalars
    inner = json_values(depth - 1)
    return scalars | st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8) | st.sampled_from(SNIPPETS), inner,
                                                                   max_size=4)


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            out += _paths(value, prefix + (key,))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            out += _paths(value, prefix + (i,))
    return out


@st.composite
def mutated_value(draw, doc: Any) -> Any:
    """`doc` (plain data) with a value replaced, removed, or a key added somewhere."""
    doc = json.loads(json.dumps(doc))
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        if not path:
            continue
        parent = doc
        for part in path[:-1]:
            parent = parent[part]
        op = draw(st.sampled_from(["set", "set", "set", "delete", "add"]))
        if op == "set":
            parent[path[-1]] = draw(json_values())
        elif op == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=10) | st.sampled_from(SNIPPETS))] = draw(json_values(1))
        else:
            parent.append(draw(json_values(1)))
    return doc


def _encode(draw, text: str) -> bytes:
    encoding = draw(st.sampled_from(["utf-8"] * 12 + ["utf-16", "utf-8-sig", "latin-1"]))
    return text.encode(encoding, errors="surrogatepass" if encoding.startswith("utf") else "replace")


@st.composite
def policy_inputs(draw) -> bytes:
    source = draw(st.sampled_from(["structured", "value", "text", "text", "bytes"]))
    if source == "structured":
        text = policy_text(draw(policy_documents()))
    elif source == "value":
        text = yaml.dump(draw(mutated_value(yaml.safe_load(draw(st.sampled_from(BASES))))), Dumper=_NoAliases,
                         sort_keys=False, allow_unicode=True)
    elif source == "text":
        base = draw(st.sampled_from(BASES) | policy_documents().map(policy_text))
        text = draw(mutated_text(base, SNIPPETS))
    else:
        return draw(st.binary(max_size=4000))
    return _encode(draw, text)


# ----------------------------------------------------------------------------- checks

class Failure(AssertionError):
    pass


RUNNER = CliRunner(mix_stderr=False)


def _cli(args: list[str], allowed: tuple[int, ...]) -> Any:
    result = RUNNER.invoke(cli_main, args, catch_exceptions=True)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise Failure(f"topkgen {' '.join(args)} raised:\n"
                      + "".join(traceback.format_exception(result.exception)))
    if result.exit_code not in allowed:
        raise Failure(f"topkgen {' '.join(args)} exited {result.exit_code}:\n{result.stderr[-3000:]}")
    if result.exit_code == 2 and (result.stderr.count("\n") != 1 or not result.stderr.startswith("topkgen: error: ")):
        raise Failure(f"topkgen {' '.join(args)}: not one line:\n{result.stderr[-3000:]}")
    return result


def _check_accepted_policy(draw, policy: pol.Policy) -> None:
    """What an accepted policy promises: it plans, renders, and serves every shape."""
    specs = [s for a in policy.archs for r in policy.rules for d in policy.dtypes
             for s in pol.kernels_of_rule(policy, r, a, d)]
    for arch in policy.archs:
        pol.plan(policy, arch)
        pol.jit_kernels(policy, arch)
    for i in draw(st.lists(st.integers(0, len(specs) - 1), max_size=12, unique=True)) if specs else []:
        render(specs[i])
    for _ in range(6):
        arch = draw(st.sampled_from(sorted(policy.archs)))
        dtype = draw(st.sampled_from(policy.dtypes))
        n = draw(st.integers(1, pol.N_MAX) | st.integers(1, 5000))
        k = draw(st.integers(1, min(n, pol.K_COVERED)))
        det = draw(st.booleans())
        jit = not (policy.aot_covers_all and dtype in policy.aot_dtypes and draw(st.booleans()))
        spec = pol.select(policy, arch, dtype, k, n, deterministic=det, jit=jit).kernel
        if not (spec.k_min <= k <= spec.k and spec.serves_n(n) and (spec.mode == "deterministic" or not det)):
            raise Failure(f"select sent k={k} n={n} det={det} to {spec.name}, which does not serve it")


# ----------------------------------------------------------------------------- targets

class Target:
    name = ""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.counts: dict[str, int] = {"cases": 0}

    def count(self, outcome: str) -> None:
        self.counts["cases"] += 1
        self.counts[outcome] = self.counts.get(outcome, 0) + 1

    def strategy(self):
        raise NotImplementedError

    def case(self, draw, value) -> None:
        raise NotImplementedError

    def save(self, value: Any, suffix: str) -> None:
        OUT.mkdir(exist_ok=True)
        data = value if isinstance(value, bytes) else repr(value).encode()
        (OUT / f"{self.name}-{suffix}.bin").write_bytes(data)


class PolicyTarget(Target):
    name = "policy"

    def strategy(self):
        return policy_inputs()

    def case(self, draw, data: bytes) -> None:
        path = self.work / "policy.yaml"
        path.write_bytes(data)
        result = _cli(["plan", "--policy", str(path), "--format", "json"], (0, 2))
        if result.exit_code == 2:
            self.count("refused")
            return
        self.count("accepted")
        _check_accepted_policy(draw, pol.loads(data, source="fuzz.yaml"))


FUZZ_POLICY = """\
version: 1
name: fuzz
archs:
  sm_90: {capability: [9, 0], threads: 256, warps_per_block: 4, vector_tail: {policy: fixed, max_iterations: 4},
          min_ctas_per_sm: {1024: 2}}
  sm_100: {capability: [10, 0], threads: 256, warps_per_block: 4, vector_tail: {policy: runtime}}
dtypes: {aot: [float32, bfloat16], jit: [float16]}
families:
  radix: {template: radix_select.cu.j2, budget: {max_registers: 96, spills: false}}
rules:
  - {name: radix_all, family: radix, work: dynamic, k: [64, 1024], n: {min: 1, max: 2147483647},
     modes: [deterministic], serves: [fast, deterministic]}
aot_covers_all: true
dispatch_order: [radix_all]
"""


def _fuzz_bundle(work: Path) -> Path:
    """A real bundle (NVRTC, 8 kernels) to mutate and to run."""
    from topkgen.build import bundle

    policy_path = work / "fuzz_policy.yaml"
    policy_path.write_text(FUZZ_POLICY)
    policy = pol.load(policy_path)
    out = work / "bundle"
    bundle.build(policy, list(policy.archs), out)
    return out


class ManifestTarget(Target):
    name = "manifest"

    def __init__(self, work: Path) -> None:
        super().__init__(work)
        self.original = _fuzz_bundle(work)
        self.manifest = json.loads((self.original / "manifest.json").read_text())
        self.bundle = work / "mutant"
        shutil.copytree(self.original, self.bundle)

    def strategy(self):
        @st.composite
        def manifests(draw) -> bytes:
            source = draw(st.sampled_from(["value", "value", "policy", "text", "bytes"]))
            if source == "bytes":
                return draw(st.binary(max_size=3000))
            if source == "text":
                return _encode(draw, draw(mutated_text(json.dumps(self.manifest, indent=1), JSON_SNIPPETS)))
            doc = json.loads(json.dumps(self.manifest))
            if source == "value":
                doc = draw(mutated_value(doc))
            else:  # a changed policy inside, usually with a matching sha256 so that it is read
                text = draw(mutated_text(doc["policy"]["text"], SNIPPETS))
                doc["policy"]["text"] = text
                if draw(st.integers(0, 4)):
                    doc["policy"]["sha256"] = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
            return json.dumps(doc, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")

        return manifests()

    def case(self, draw, data: bytes) -> None:
        (self.bundle / "manifest.json").write_bytes(data)
        result = _cli(["diff", str(self.bundle), str(self.work / "fuzz_policy.yaml"), "--format", "json"], (0, 1, 2))
        from topkgen.manifest import reading as manifests
        from topkgen.runtime import TopK, TopKError

        try:
            manifest, root = manifests.load_manifest(self.bundle)
            policy = manifests.manifest_policy(manifest, "fuzz")
        except manifests.ManifestError:
            self.count("refused")
            if result.exit_code != 2:
                raise Failure(f"diff exited {result.exit_code} on a manifest the loader refuses") from None
            return
        self.count("accepted")
        _check_accepted_policy(draw, policy)
        for arch in policy.archs:
            try:
                op = TopK(self.bundle, arch=arch, backend="emulator")
            except TopKError:
                continue
            try:
                manifests.read_files(root, manifest, [arch])
            except manifests.ManifestError:
                pass
            try:
                op.explain(draw(st.sampled_from(["float32", "bfloat16", "float16", "int8"])), draw(st.integers(-1, 1100)),
                           draw(st.integers(-1, 10**6)), draw(st.booleans()))
            except TopKError:
                pass


def _header(descr: str, fortran: Any, shape: Any) -> bytes:
    header = f"{{'descr': {descr}, 'fortran_order': {fortran}, 'shape': {shape}, }}"
    header += " " * (-(len(header) + 11) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode()


class RunTarget(Target):
    name = "run"

    def __init__(self, work: Path) -> None:
        super().__init__(work)
        self.bundle = _fuzz_bundle(work)
        # Every kernel of the bundle (and its float16 JIT tier) runs once before the clock
        # does: a cold emulator compile on a loaded machine can take longer than a case may.
        path, out = work / "warm.npy", work / "warm.npz"
        for arch, dtype, k in itertools.product(("sm_90", "sm_100"), ("float32", "bfloat16", "float16"), (1, 65)):
            np.save(path, np.arange(70, dtype=np.float32).astype(NUMPY_DTYPES[dtype]))
            _cli(["run", "--bundle", str(self.bundle), "--backend", "emulator", "--arch", arch, "--k", str(k),
                  str(path), "-o", str(out)], (0,))

    def strategy(self):
        dtypes = st.sampled_from(["float32", "float32", "bfloat16", "float16", "uint16", ">f4", "float64", "int32",
                                  "bool", "complex64"])

        @st.composite
        def arrays(draw) -> bytes:
            dtype = draw(dtypes)
            ndim = draw(st.integers(1, 3))
            shape = tuple(draw(st.integers(0, 4)) for _ in range(ndim - 1)) + (draw(st.integers(1, 3000)),)
            np_dtype = NUMPY_DTYPES.get(dtype, dtype)
            count = int(np.prod(shape))
            raw = np.frombuffer(draw(st.binary(min_size=64, max_size=64)) * (count * 8 // 64 + 1), np.uint8)
            x = raw[:count * np.dtype(np_dtype).itemsize].view(np_dtype).reshape(shape)
            if draw(st.booleans()):
                x = np.asfortranarray(x)
            buffer = io.BytesIO()
            np.save(buffer, x)
            return buffer.getvalue()

        headers = st.builds(
            lambda descr, fortran, shape, payload: _header(descr, fortran, shape) + payload,
            st.sampled_from(["'<f4'", "'<f2'", "'|V2'", "'>f4'", "'|O'", "[('a', '<f4')]", "('<f4', (2,))", "'<U4'",
                             "'|V0'", "'<f4", "1", "'x'"]),
            st.sampled_from(["False", "True", "1", "None"]),
            st.sampled_from(["()", "(0,)", "(3,)", "(2, 5)", "(1, 1099511627776)", "(-1, 4)", "(2**40,)",
                             "(4, 0)", "(1, 2, 3, 4, 5)", "[2, 2]", "'x'"]),
            st.binary(max_size=200))

        @st.composite
        def inputs(draw) -> tuple[bytes, list[str]]:
            source = draw(st.sampled_from(["array", "array", "array", "header", "mutated", "bytes"]))
            if source == "array":
                data = draw(arrays())
            elif source == "header":
                data = draw(headers)
            elif source == "mutated":
                data = bytearray(draw(arrays()))
                for _ in range(draw(st.integers(1, 4))):
                    data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
                data = bytes(data[:draw(st.integers(0, len(data)))]) if draw(st.booleans()) else bytes(data)
            else:
                data = draw(st.binary(max_size=500))
            options = ["--k", str(draw(st.integers(1, 80) | st.integers(-2, 1100)))]
            options += ["--smallest"] if draw(st.booleans()) else []
            options += ["--deterministic"] if draw(st.booleans()) else []
            options += ["--dtype", draw(st.sampled_from(["bfloat16", "float16"]))] if draw(st.integers(0, 5)) == 0 else []
            options += ["--arch", draw(st.sampled_from(["sm_90", "sm_100", "sm_90", "sm_100", "", "sm_80"]))]
            return data, options

        return inputs()

    def case(self, draw, value) -> None:
        data, options = value
        path, out = self.work / "in.npy", self.work / "out.npz"
        path.write_bytes(data)
        out.unlink(missing_ok=True)
        result = _cli(["run", "--bundle", str(self.bundle), "--backend", "emulator", *options, str(path), "-o", str(out)],
                      (0, 2))
        if result.exit_code == 2:
            self.count("refused")
            return
        self.count("accepted")
        from topkgen.cli.npyfile import read_npy

        x = read_npy(path)
        k = int(options[options.index("--k") + 1])
        dtype = options[options.index("--dtype") + 1] if "--dtype" in options else None
        name = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}.get(
            str(x.dtype), dtype or "bfloat16")
        if x.dtype == np.uint16:
            x = x.view(NUMPY_DTYPES[name])
        result_arrays = np.load(out)
        values = result_arrays["values"]
        if values.dtype == np.uint16 or values.dtype.kind == "V":
            values = values.view(NUMPY_DTYPES[name])
        # Every kernel of the fuzz bundle is deterministic: the results are the reference's, bit for bit.
        check_topk(x.reshape(-1, x.shape[-1]), values.reshape(-1, k), result_arrays["indices"].reshape(-1, k), k,
                   "--smallest" not in options, True, name, what=f"run {options}")


# ----------------------------------------------------------------------------- driver

def fuzz(target: Target, seconds: float, first_seed: int = 0) -> int:
    """Hypothesis runs of CHUNK examples with a new seed each (first_seed + 1, + 2, ...),
    until `seconds` are spent."""
    start = time.monotonic()
    stop = start + seconds
    failures = 0

    def one(data: Any) -> None:
        value = data.draw(target.strategy(), label="input")
        target.save(value if not isinstance(value, tuple) else value[0], "current")
        faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)
        try:
            target.case(data.draw, value)
        except InputError as err:  # an input error that escaped the CLI's handling is still a bug here
            raise Failure(f"uncaught input error: {err}") from None
        finally:
            faulthandler.cancel_dump_traceback_later()

    run_number = 0
    while time.monotonic() < stop:
        run_number += 1
        # Size each run to the time left (a check inside the test would make hypothesis see
        # flaky data generation), from the mean time of a case so far.
        spent = time.monotonic() - start
        mean = spent / target.counts["cases"] if target.counts["cases"] else 0.05
        examples = max(1, min(CHUNK, int((stop - time.monotonic()) / mean)))
        test = seed(first_seed + run_number)(settings(max_examples=examples, deadline=None, database=None,
                                                      derandomize=False, phases=[Phase.generate, Phase.shrink],
                                                      suppress_health_check=list(HealthCheck), print_blob=False)(
            given(st.data())(one)))
        try:
            test()
        except Exception:  # hypothesis re-raises the shrunk failure
            failures += 1
            print(f"fuzz {target.name}: FAILURE (seed {first_seed + run_number}):\n{traceback.format_exc()}",
                  flush=True)
            if failures >= 3:
                break
    (OUT / f"{target.name}-current.bin").unlink(missing_ok=True)
    detail = ", ".join(f"{k} {v}" for k, v in sorted(target.counts.items()) if k != "cases")
    print(f"fuzz {target.name}: {target.counts['cases']} cases in {seconds:.0f} s ({detail}), {failures} failures, "
          f"seeds {first_seed + 1}..{first_seed + run_number}", flush=True)
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("FUZZ_SECONDS", 300)),
                        help="total time, split evenly between the targets (default: FUZZ_SECONDS or 300)")
    parser.add_argument("--target", choices=TARGETS, help="one target in this process (default: each in its own)")
    parser.add_argument("--seed", type=int, default=0,
                        help="runs use hypothesis seeds SEED + 1, SEED + 2, ... (default 0, what CI runs)")
    args = parser.parse_args(argv)
    if args.target:
        classes: dict[str, Callable[[Path], Target]] = {"policy": PolicyTarget, "manifest": ManifestTarget,
                                                        "run": RunTarget}
        with tempfile.TemporaryDirectory(prefix=f"topkgen-fuzz-{args.target}-") as work:
            target = classes[args.target](Path(work))
            return 1 if fuzz(target, args.seconds, args.seed) else 0
    share = args.seconds / len(TARGETS)
    failed = []
    for name in TARGETS:
        proc = subprocess.run([sys.executable, "-m", "tests.support.fuzz", "--target", name, "--seconds", str(share),
                               "--seed", str(args.seed)], cwd=ROOT)
        if proc.returncode != 0:
            failed.append(f"{name} (exit {proc.returncode}; inputs in {OUT})")
    if failed:
        print(f"fuzz: FAILED: {', '.join(failed)}", flush=True)
        return 1
    print("fuzz: no failures", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
