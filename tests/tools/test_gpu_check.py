"""The CPU-side parts of scripts/gpu_check.py: its cases, arguments, tables, the parsers of
nvbench's and ncu's output, and the path taken where no GPU exists."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from topkgen.common.paths import CUDA_HEADERS

ROOT = Path(__file__).resolve().parents[2]


def test_cases_cover_the_bench_shapes_and_the_seed_grid_at_132_and_4096_rows(gc):
    from shapes import DATA_KINDS, SETS

    cases = gc.cases()
    assert {c.data for c in cases} == set(DATA_KINDS)
    for s in SETS:
        for dtype, n, k in s.shapes:
            got = {(c.rows, c.data) for c in cases if (c.dtype, c.n, c.k) == (dtype, n, k)}
            assert {(rows, kind) for rows in s.gpu_rows for kind in s.data} <= got
    seed = {(c.rows, c.n) for c in cases if c.set == "seed grid"}
    assert {(132, 2048), (4096, 2048), (132, 16384), (4096, 16384)} <= seed
    small = {(c.rows, c.n, c.k) for c in cases if c.dtype == "float32" and c.data == "normal"}
    assert {(r, n, k) for r in (1, 4, 16, 64) for n in (131072, 262144) for k in (16, 256, 1024)} <= small
    assert len({c.id for c in cases}) == len(cases) == 164  # 170 set x rows x data-kind cases, 6 of them shared by two sets
    assert all(c.id.isascii() and " " not in c.id for c in cases)


@pytest.mark.parametrize("argv,message", [
    (["--skip", "bench,nope"], "unknown stage 'nope'"),
    (["--data", "normal,zipf"], "unknown data kind 'zipf'"),
    (["--sets", "seed grid,huge"], "unknown shape set 'huge'"),
    (["--max-noise", "0"], "--max-noise"),
    (["--timer", "stopwatch"], "invalid choice"),
])
def test_bad_arguments_exit_2_naming_them(gc, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        gc.parse_args(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_arguments_select_cases_and_stages(gc, tmp_path):
    args = gc.parse_args(["--sets", "rows of 131072", "--data", "normal,90% -inf", "--skip", "ncu,sanitizer",
                          "--out", str(tmp_path / "b")])
    assert [c.id for c in args.cases][:2] == ["float32-1024x131072-k256-normal", "float32-1024x131072-k256-masked"]
    assert len(args.cases) == 8 and args.skip == {"ncu", "sanitizer"}
    # beside the bundle, not in it: `topkgen build --out b` refuses a folder holding more than a bundle
    assert (args.results, args.work) == (tmp_path / "b-results", tmp_path / "b-work")


def test_table_puts_medians_side_by_side(gc):
    case = gc.Case("seed grid", 132, "float32", 2048, 64, "normal")
    other = gc.Case("seed grid", 132, "bfloat16", 2048, 64, "uniform")
    timings = {(case.id, "topkgen"): gc.Timing("events", [10.0, 12.0, 11.0], dropped=10),
               (case.id, "torch"): gc.Timing("events", [33.0, 33.0])}
    table = gc.format_table([case, other], timings, {case.id: (2048 * 4 * 1.5, 0.0)}, {case.id: 1})
    lines = table.splitlines()
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|")
    cells = [c.strip() for c in lines[2].split("|")[1:-1]]
    assert cells[6:] == ["1", "11.0", "33.0", "n/a", "3.00x", f"{132 * 2048 * 4 / 11e-6 / 4.8e12:.1%}", "3 (10)",
                         "12288 (1.50x)"]
    assert [c.strip() for c in lines[3].split("|")[1:-1]][6:] == ["n/a"] * 6 + ["n/a", "n/a"]


def test_the_small_batch_cases_split_as_the_policy_says(gc):
    """Issue 14's point 6: every small-batch case that the default policy splits is labelled
    with its chunks per row, so the timing table says which cases ran split."""
    cases = gc.cases("small batch")
    chunks = gc.chunks_per_row(cases, "sm_90")
    assert len(cases) == 24 and all(c.data == "normal" for c in cases)
    from topkgen import policy

    pol = policy.load()
    split = pol.archs["sm_90"].split  # rows_below, or rows_below_by_k for the serving kernel's K rung
    below = {c.id: split.rows_below_for(policy.select(pol, "sm_90", c.dtype, c.k, c.n).kernel.k) for c in cases}
    assert {c.rows < below[c.id] for c in cases} == {True, False}  # cases of both kinds
    assert all((chunks[c.id] > 1) == (c.rows < below[c.id]) for c in cases)  # the split ones, and only they
    assert chunks["float32-1x131072-k256-normal"] == 32 and chunks["float32-16x262144-k16-normal"] == 16


def test_ncu_csv_gives_dram_bytes_per_launch_in_order(gc):
    text = "\n".join([
        "==PROF== Connected to process 123",
        '"ID","Process ID","Kernel Name","Metric Name","Metric Unit","Metric Value"',
        '"0","123","topk_radix_dyn_k64_fast_f32_sm_90","dram__bytes_read.sum","Mbyte","1.50"',
        '"0","123","topk_radix_dyn_k64_fast_f32_sm_90","dram__bytes_write.sum","Kbyte","2.00"',
        '"1","123","topk_radix_dyn_k64_fast_f32_sm_90","dram__bytes_read.sum","byte","4,096"',
        '"1","123","topk_radix_dyn_k64_fast_f32_sm_90","dram__bytes_write.sum","byte","0"',
        "==PROF== Disconnected from process 123",
    ])
    assert gc.parse_ncu_csv(text) == [(1.5e6, 2e3), (4096.0, 0.0)]


def test_nvbench_json_and_sample_files(gc, tmp_path):
    (tmp_path / "nvbench.json-bin").mkdir()
    np.array([1e-5, 2e-5, 3e-5], "<f4").tofile(tmp_path / "nvbench.json-bin" / "0.bin")

    def state(case, impl, summaries, skipped=False):
        return {"axis_values": [{"name": "case", "type": "string", "value": case},
                                {"name": "impl", "type": "string", "value": impl}],
                "summaries": summaries, "is_skipped": skipped, **({"skip_reason": "budget"} if skipped else {})}

    doc = {"benchmarks": [{"states": [
        state("a", "topkgen", [{"tag": "nv/json/bin:nv/cold/sample_times", "data": [
            {"name": "filename", "type": "string", "value": "nvbench.json-bin/0.bin"},
            {"name": "size", "type": "int64", "value": "3"}]}]),
        state("a", "torch", [{"tag": "nv/cold/time/gpu/mean", "data": [
            {"name": "value", "type": "float64", "value": "4e-05"}]}]),
        state("a", "flashinfer", [], skipped=True),
    ]}]}
    (tmp_path / "nvbench.json").write_text(json.dumps(doc))
    got = gc.read_nvbench(tmp_path / "nvbench.json")
    assert got[("a", "topkgen")].samples == pytest.approx([10.0, 20.0, 30.0])
    assert got[("a", "topkgen")].median == pytest.approx(20.0)
    assert got[("a", "torch")].samples == pytest.approx([40.0]) and "mean only" in got[("a", "torch")].note
    assert got[("a", "flashinfer")].samples == [] and got[("a", "flashinfer")].note == "budget"


def test_list_needs_no_gpu(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--list", "--sets", "register ladder"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "10 cases x 3 implementations"  # 2 shapes x 1 batch x 5 data kinds


def test_without_a_gpu_it_says_so_builds_and_exits_3(tmp_path):
    """Without a GPU it exited 0 after the CPU-side parts: `make gpu-check` on a machine
    without one read as passed. It exits 3 and says again, last, that nothing was measured."""
    from topkgen.runtime import gpu_unavailable

    if gpu_unavailable() is None:
        pytest.skip("a GPU is present: the no-GPU path is not taken")
    out, results = tmp_path / "bundle", tmp_path / "results"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--out", str(out), "--results",
                           str(results)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stdout.startswith("no GPU: ")
    assert proc.stdout.endswith("\nno GPU: the device checks did not run, nothing was measured (exit 3)\n")
    assert "would time 164 cases x 3 implementations" in proc.stdout
    # Issue 14's crossover: two bundles of the same kernels, one splitting every batch of the
    # grid (108: 2 dtypes x 2 n x 3 K x 9 batches) and one splitting none.
    assert "would time 108 batches twice: the split bundle splits 108 of them, the unsplit one 0" in proc.stdout
    # The two bundles go beside the bundle, not into RESULTS (on the device machine $OUT, which
    # brings back 8 files at most) nor into the bundle (whose next build would refuse it).
    assert not results.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["bundle", "bundle-work"]
    names = {name: [k["name"] for k in json.loads((tmp_path / "bundle-work" / f"bundle-{name}" / "manifest.json")
                                                  .read_text())["kernels"]] for name in ("split", "unsplit")}
    assert names["split"] == names["unsplit"] == [k["name"] for k in json.loads((out / "manifest.json").read_text())[
        "kernels"]]
    assert json.loads((out / "manifest.json").read_text())["archs"] == ["sm_90"]


def test_toolkit_headers_serve_where_the_header_wheels_are_missing(gc, tmp_path, monkeypatch):
    """The accelerator machine's Python has no nvidia-cuda-crt/-cccl wheels, but a toolkit
    beside its nvcc: gpu-check points TOPKGEN_CUDA_INCLUDE there rather than fail the build."""
    from topkgen.common import paths

    include = tmp_path / "cuda" / "include"
    for f in CUDA_HEADERS:  # no nv/target: a CUDA 13 toolkit keeps it in include/cccl
        (include / f).parent.mkdir(parents=True, exist_ok=True)
        (include / f).write_text("")
    monkeypatch.setenv("TOPKGEN_CUDA_INCLUDE", "")  # recorded, so what the script sets is undone after
    monkeypatch.delenv("TOPKGEN_CUDA_INCLUDE")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))

    def missing():
        if "TOPKGEN_CUDA_INCLUDE" in paths.os.environ:
            return Path(paths.os.environ["TOPKGEN_CUDA_INCLUDE"])
        raise RuntimeError("CUDA headers not found")

    missing.cache_clear = lambda: None
    monkeypatch.setattr(paths, "cuda_include_dir", missing)
    gc.use_toolkit_headers_if_wheels_lack_them()
    assert paths.os.environ["TOPKGEN_CUDA_INCLUDE"] == str(include)


@pytest.mark.parametrize("exit_code,output,failed", [(255, "========= Device not supported\n", False),
                                                      (3, "========= Invalid __global__ write of size 4\n", True),
                                                      (0, "========= ERROR SUMMARY: 0 errors\n", False)])
def test_sanitizer_refusal_is_no_failure_but_its_findings_are(gc, tmp_path, monkeypatch, capsys, exit_code, output,
                                                              failed):
    tool = tmp_path / "compute-sanitizer"
    tool.write_text(f"#!/bin/sh\nprintf '{output}'\nexit {exit_code}\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{gc.os.environ['PATH']}")
    assert gc.sanitize(str(tmp_path / "bundle"), gc.time.monotonic() + 60) is failed
    printed = capsys.readouterr().out
    assert ("refused this device" in printed) is (exit_code == 255)


def test_cpp_stage_is_skipped_not_failed_where_nothing_can_build_the_loader(gc, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gc, "ROOT", tmp_path)  # no build/cpp, no .venv
    assert gc.cpp_against_python(str(tmp_path / "bundle"), "sm_90", gc.time.monotonic() + 60) is False
    assert "SKIPPED: build/cpp/topkgen-cpp is not built" in capsys.readouterr().out


def test_sanitizer_runs_each_tool_once_over_every_shape(gc, tmp_path, monkeypatch):
    """One process per tool; its code is valid Python that covers every SANITIZER_SHAPES kernel."""
    tool = tmp_path / "compute-sanitizer"
    tool.write_text(f"#!/bin/sh\nprintf '%s' \"$7\" > {tmp_path}/code.$2.py\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{gc.os.environ['PATH']}")
    assert gc.sanitize(str(tmp_path / "bundle"), gc.time.monotonic() + 60) is False
    assert sorted(p.name for p in tmp_path.glob("code.*.py")) == ["code.memcheck.py", "code.racecheck.py"]
    code = (tmp_path / "code.memcheck.py").read_text()
    compile(code, "sanitizer-child", "exec")
    assert all(repr((dtype, k, n)) in code for _, dtype, k, n in gc.SANITIZER_SHAPES)


def test_help_lists_the_options_the_readme_names():
    """--help once crashed on a '%' in a help text (argparse formats them)."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--help"], capture_output=True,
                          text=True)
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    for option in ("--results", "--budget-s", "--sets", "--skip", "--data"):
        assert option in proc.stdout


def test_a_cuda_13_toolkit_include_folder_serves_nvrtc_and_the_emulator(gc, tmp_path):
    """What the fallback above relies on: a CUDA 13 toolkit's include folder has cuda_bf16.h
    and crt/ but keeps nv/target (which cuda_bf16.h includes) only in include/cccl. NVRTC 13
    has it built in; the emulator's g++ gets -I include/cccl. The wheels' headers, laid out
    so, compile a bfloat16 kernel with both (real compiles: NVRTC uncached, the emulator in
    an empty cache)."""
    from topkgen.common.paths import cuda_include_dir

    wheels = cuda_include_dir()
    include = tmp_path / "include"
    include.mkdir()
    for entry in wheels.iterdir():
        if entry.name != "nv":
            (include / entry.name).symlink_to(entry)
    assert all((include / f).is_file() for f in CUDA_HEADERS)
    assert (include / "cccl" / "nv" / "target").is_file() and not (include / "nv").exists()
    code = ("from topkgen import policy; from topkgen.build.render import render; from topkgen.build.compile import compile_kernel\n"
            "from topkgen.emulator import compile_source\n"
            "spec = next(s for s in policy.all_kernels(policy.load(), 'sm_90') if s.dtype == 'bfloat16')\n"
            "print(spec.name, len(compile_kernel(render(spec), spec.name, 'sm_90', use_cache=False).cubin))\n"
            "compile_source(render(spec), name=spec.name)\n")
    env = {**gc.os.environ, "TOPKGEN_CUDA_INCLUDE": str(include), "PYTHONPATH": str(ROOT),
           "TOPKGEN_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    name, size = proc.stdout.split()
    assert name.endswith("_bf16_sm_90") and int(size) > 0
    assert list((tmp_path / "cache" / "emulator").glob("*.so"))


def test_a_stage_that_raises_fails_alone(gc, capsys):
    """The device run is one shot: a stage that raises (an API the machine's cuda-core
    lacks, a CUDA error) is reported with its traceback, and the caller goes on."""
    def broken(x):
        raise AttributeError(f"no attribute {x!r}")

    assert gc.guarded("bench", broken, "launch", failed=True) is True
    assert gc.guarded("ncu", lambda: {"a": (1.0, 2.0)}, failed={}) == {"a": (1.0, 2.0)}
    printed = capsys.readouterr().out
    assert "STAGE FAILED: bench:" in printed and "AttributeError: no attribute 'launch'" in printed


def test_crossover_results_as_gpu_check_records_them_are_written_into_the_policy(gc, tmp_path):
    """Issue 14's write-back from a results file made by gpu-check's own code: the batches'
    chunks as the split bundle cuts them (here served by the emulator backend), synthetic
    medians in which splitting pays below 32 rows. Only sm_90's rows_below line changes;
    every comment stays."""
    from topkgen import policy
    from topkgen.runtime import TopK

    args = gc.parse_args(["--out", str(tmp_path / "bundle"), "--results", str(tmp_path / "results")])
    bundles = gc.crossover_bundles(args, "sm_90", [sys.executable, "-m", "topkgen"])
    split_op = TopK(bundles["split"], arch="sm_90", backend="emulator")
    measured = [gc.crossover_measured(split_op, dtype, n, k, rows, {"split": 10.0 if rows < 32 else 30.0,
                                                                     "unsplit": 20.0})
                for dtype, n, k, rows in gc.split_crossover.GRID]
    args.results.mkdir()
    assert gc.record_crossover(args.results, "sm_90", "NVIDIA H200", measured) is False
    assert sorted(p.name for p in args.results.iterdir()) == ["split_crossover.json", "split_crossover.md"]
    pol = tmp_path / "topk.yaml"
    before = policy.default_policy_path().read_text()
    pol.write_text(before)
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "split_crossover.py"),
                           str(args.results / "split_crossover.json"), "--policy", str(pol), "--write"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote rows_below 17 for sm_90 into {pol}" in proc.stdout  # 16 is the last batch below 32 rows
    after = pol.read_text()
    changed = [(a, b) for a, b in zip(before.splitlines(), after.splitlines()) if a != b]
    assert len(before.splitlines()) == len(after.splitlines()) and len(changed) == 1
    assert changed[0][1] == ("      rows_below: 17  # measured on NVIDIA H200 (make gpu-check, "
                             "benchmarks/split_crossover.py)")
    assert [line for line in before.splitlines() if "#" in line and "rows_below" not in line] == \
        [line for line in after.splitlines() if "#" in line and "rows_below" not in line]
    assert policy.load(pol).archs["sm_90"].split.rows_below == 17


def test_a_stage_process_that_dies_is_reported_and_the_run_goes_on(gc, tmp_path, capfd):
    """Each Python GPU stage runs in a child process (a sticky CUDA error or a hang costs that
    stage alone). Here the bench child cannot time anything (no torch or no GPU): it exits
    non-zero, and run_stage says so and returns."""
    args = gc.parse_args(["--out", str(tmp_path / "bundle"), "--results", str(tmp_path / "results"),
                          "--sets", "register ladder", "--data", "normal"])
    args.results.mkdir()
    assert gc.run_stage(args, "bench", "sm_90", gc.time.monotonic() + 60) is True
    out = capfd.readouterr().out
    assert "--stage bench --arch sm_90 --deadline" in out and "STAGE FAILED: bench (exit 1)" in out


def test_the_table_is_made_from_the_samples_file_the_bench_stage_writes(gc, tmp_path):
    case = gc.Case("seed grid", 132, "float32", 2048, 64, "normal")
    timings = {(case.id, "topkgen"): gc.Timing("events", [10.0, 12.0, 11.0], dropped=10),
               (case.id, "torch"): gc.Timing("events", [33.0], note="time budget spent")}
    path = tmp_path / gc.SAMPLES
    gc.write_samples(path, [case], timings, [case.id])
    assert gc.read_samples(path) == timings and json.loads(path.read_text())["mismatches"] == [case.id]
    assert [p.name for p in tmp_path.iterdir()] == [gc.SAMPLES]  # no temporary file left beside it
