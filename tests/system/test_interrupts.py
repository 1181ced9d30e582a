"""Ctrl-C and a closed stdout have exit statuses of their own: 130 with one line, and 141
with nothing, for every command. Both were 1 (click's "Aborted!" and its broken-pipe exit),
which for diff reads as "the sides differ"."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ..conftest import DEFAULT_POLICY, ROOT
from ..support.commands import TOPKGEN
from ..support.tiny import TINY_POLICY, each_command

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def test_ctrl_c_is_exit_130_and_one_line_for_every_command(cli, tiny_bundle, tiny_policy, tmp_path,  # noqa: F811
                                                           monkeypatch):
    from topkgen.policy import loading as policy

    commands = each_command(tiny_policy, tiny_bundle, tmp_path)

    def interrupted(*args, **kwargs):  # every command loads a policy: Ctrl-C arrives there
        raise KeyboardInterrupt

    monkeypatch.setattr(policy, "_build", interrupted)
    for name, args in commands.items():
        result = cli(*args)
        assert (result.exit_code, result.stderr, result.stdout) == (130, "topkgen: interrupted\n", ""), name
    assert not (tmp_path / "out").exists() and not (tmp_path / "o.npz").exists()


# A Ctrl-C that lands while Python is still importing the CLI, before its handler exists:
# here, as the CLI imports click.
_CTRL_C_ON_IMPORTING_CLICK = """\
import sys
class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == "click":
            raise KeyboardInterrupt
sys.meta_path.insert(0, CtrlC())
sys.argv = ["topkgen", "plan"]
"""


@pytest.mark.parametrize("start", [
    "from importlib.metadata import entry_points\nentry_points(group='console_scripts')['topkgen'].load()()\n",
    "import runpy\nrunpy.run_module('topkgen', run_name='__main__')\n",  # python -m topkgen
], ids=["installed command", "python -m topkgen"])
def test_ctrl_c_while_the_cli_is_still_importing_is_exit_130_and_one_line(start):
    proc = subprocess.run([sys.executable, "-c", _CTRL_C_ON_IMPORTING_CLICK + start], capture_output=True, text=True,
                          env=ENV)
    assert (proc.returncode, proc.stderr, proc.stdout) == (130, "topkgen: interrupted\n", "")
    closed = subprocess.run([sys.executable, "-c", _CTRL_C_ON_IMPORTING_CLICK + start], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=ENV,
                            preexec_fn=lambda: os.close(2))  # 2>&-: Python's stderr is None
    assert (closed.returncode, closed.stdout) == (130, b"")


def _interrupt(args: list[str], cache: Path, ready, signum: int = signal.SIGINT) -> tuple[subprocess.CompletedProcess,
                                                                                          float]:
    """Run topkgen with a cold compile cache, send `signum` (SIGINT: as Ctrl-C does) once
    `ready(proc)` says it is at work, and collect what it printed and the seconds it took to
    exit after the signal."""
    env = {**ENV, "TOPKGEN_CACHE_DIR": str(cache)}
    env.pop("TOPKGEN_CACHE_URL", None)
    proc = subprocess.Popen([*TOPKGEN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # pytest may ignore it
    try:
        ready(proc)
        assert proc.poll() is None, "finished before it was interrupted"
        proc.send_signal(signum)
        sent = time.monotonic()
        proc.wait(timeout=120)
        seconds = time.monotonic() - sent
        stdout, stderr = proc.communicate()
    finally:
        proc.kill()
    return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr), seconds


@pytest.mark.parametrize("signum,status,line", [(signal.SIGINT, 130, "topkgen: interrupted\n"),
                                                (signal.SIGTERM, 143, "topkgen: terminated\n")],  # a CI job cancelled
                         ids=["Ctrl-C", "SIGTERM"])
def test_ctrl_c_during_a_build_is_exit_130_and_leaves_nothing(tmp_path, signum, status, line):
    def first_kernel_compiled(proc):  # in a pipe, build prints a line per kernel
        assert proc.stdout.readline().startswith("[ 1/29] ")

    out = tmp_path / "out"
    done, _ = _interrupt(["build", "--arch", "sm_90", "-j", "1", "--out", str(out)], tmp_path / "cache",
                         first_kernel_compiled, signum)
    assert (done.returncode, done.stderr) == (status, line), done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]  # no bundle, no staging directory


@pytest.mark.parametrize("jobs", [1, 2])
def test_ctrl_c_during_a_build_does_not_wait_for_the_compiles_under_way(tmp_path, jobs):
    """An NVRTC compile cannot be interrupted, and the build waited for those under way
    before exiting (the worker threads were joined; NVRTC's signal handler, restored with
    SA_RESTART, also kept the waiting main thread from waking). The exit now comes at once:
    well within the time one compile takes, measured here, of the kernel that was compiling
    when the signal came (once a kernel is reported done, the next compile has begun)."""
    from topkgen import policy
    from topkgen.build.compile import compile_kernel
    from topkgen.build.render import render

    def first_kernel_compiled(proc):
        assert proc.stdout.readline().startswith("[ 1/29] ")

    done, seconds = _interrupt(["build", "--arch", "sm_90", "-j", str(jobs), "--out", str(tmp_path / "out")],
                               tmp_path / "cache", first_kernel_compiled)
    assert (done.returncode, done.stderr) == (130, "topkgen: interrupted\n"), done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]  # no bundle, no staging directory
    spec = policy.plan(policy.load(None), "sm_90")[jobs]  # the compile that began as the first one ended
    source = render(spec)
    compile_kernel(source, spec.name, spec.arch, use_cache=False)  # NVRTC loaded: not counted
    start = time.perf_counter()
    compile_kernel(source, spec.name, spec.arch, use_cache=False)
    one_compile = time.perf_counter() - start
    assert seconds < one_compile / 4, (seconds, one_compile)


_CTRL_C_AFTER_A_JIT_COMPILE = """\
import os, signal, sys, threading, time
from topkgen.build.compile import compile_kernel
compile_kernel('extern "C" __global__ void topk_probe() {}', "topk_probe", "sm_90", use_cache=False)
read_end, write_end = os.pipe()
threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
threading.Timer(5.0, os.write, (write_end, b"x")).start()  # ends the wait if the Ctrl-C did not
start = time.monotonic()
try:
    os.read(read_end, 1)
    print("not interrupted")
except KeyboardInterrupt:
    print(f"interrupted after {time.monotonic() - start:.1f} s")
sys.stdout.flush()
os._exit(0)
"""


def test_a_program_that_jit_compiled_still_takes_a_ctrl_c_in_a_blocking_call():
    """NVRTC's first compile leaves Python's SIGINT handler installed with SA_RESTART: in a
    program that JIT-compiled a kernel (TopK does on the main thread), a Ctrl-C during any
    later blocking call (here a read of a pipe) was raised only once the call returned on
    its own. compile_kernel now compiles in a child process (compile._nvrtc), which leaves
    the program's handlers as they were, so it is raised at once."""
    proc = subprocess.run([sys.executable, "-c", _CTRL_C_AFTER_A_JIT_COMPILE], capture_output=True, text=True,
                          env=ENV, timeout=120,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # a shell's `&` ignores it
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("interrupted after "), proc.stdout
    assert float(proc.stdout.split()[2]) < 2.0, proc.stdout


def test_ctrl_c_with_a_stderr_whose_reader_left_is_still_130(tmp_path):
    """The CLI's handler wrote the Ctrl-C line itself, and a stderr nobody reads (`topkgen
    build ... 2>&1 | head -1`, the reader gone) turned that write into a BrokenPipeError:
    exit 1, "a build failed". One function, launch.report_stop, now writes it for the CLI and
    for a Ctrl-C during start-up alike, and the status says it when the line cannot."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = {**ENV, "TOPKGEN_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("TOPKGEN_CACHE_URL", None)
    proc = subprocess.Popen([*TOPKGEN, "build", "--arch", "sm_90", "-j", "1", "--out", str(tmp_path / "out")],
                            stdout=subprocess.PIPE, stderr=write_end, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    os.close(write_end)
    try:
        assert proc.stdout.readline().startswith("[ 1/29] ")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130
    finally:
        proc.kill()
        proc.communicate()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]


def test_ctrl_c_during_diff_build_is_exit_130_not_a_result(tmp_path):
    cache = tmp_path / "cache"

    def compiling(proc):  # diff's progress goes to a terminal only: wait for the first cache entry
        deadline = time.monotonic() + 120
        while not any(p.is_file() for p in cache.rglob("*")) and time.monotonic() < deadline:
            time.sleep(0.05)

    done, _ = _interrupt(["diff", str(DEFAULT_POLICY), str(DEFAULT_POLICY), "--build", "--stat", "-j", "1"], cache,
                         compiling)
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "topkgen: interrupted\n")


@pytest.mark.parametrize("args", [
    ["plan"], ["plan", "--format", "json"], ["--help"],
    ["explain", "--arch", "sm_90", "--dtype", "float32", "--k", "8", "--n", "4096"],
    ["diff", str(DEFAULT_POLICY), "{tiny}"],  # they differ: 1 would read as a result
], ids=["plan", "plan-json", "help", "explain", "diff"])
def test_a_reader_that_left_is_exit_141_and_quiet(tiny_policy, args):  # noqa: F811
    """`topkgen plan | head -1`, with the reader gone before the first write so that the
    pipe is broken every time, whatever the output's size."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([*TOPKGEN, *(a.format(tiny=tiny_policy) for a in args)], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, env=ENV)
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (141, "")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full to fill")
@pytest.mark.parametrize("args", [["plan"], ["explain", "--arch", "sm_90", "--dtype", "float32", "--k", "8",
                                             "--n", "1000"], ["--version"], ["--help"], ["build", "--help"]])
def test_a_full_disk_under_stdout_is_one_line_not_an_internal_error(args):
    with open("/dev/full", "w") as full:
        proc = subprocess.run([*TOPKGEN, *args], stdout=full, stderr=subprocess.PIPE, text=True, env=ENV)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == "topkgen: error: cannot write the output: No space left on device\n"


@pytest.mark.parametrize("args, status", [
    (["plan"], 2), (["--version"], 2),           # output dropped without a word: was exit 0
    (["diff", "{tiny}", DEFAULT_POLICY], 2),     # was exit 70 (sys.stdout is None)
    (["diff", "{tiny}", DEFAULT_POLICY, "-q"], 1),  # prints nothing: the status is the answer
])
def test_a_closed_stdout_is_one_line_when_there_is_output(args, status, tiny_policy):  # noqa: F811
    proc = subprocess.run([*TOPKGEN, *(str(a).format(tiny=tiny_policy) for a in args)], stderr=subprocess.PIPE,
                          text=True, env=ENV, preexec_fn=lambda: os.close(1))  # >&-
    assert (proc.returncode, proc.stderr) == (status, "topkgen: error: cannot write the output: standard output "
                                                      "is closed\n" if status == 2 else "")


def test_a_closed_stdout_does_not_fail_a_command_whose_product_is_files(tiny_policy, tiny_bundle, tmp_path):  # noqa: F811
    """build and run -o report on stdout; with it closed the report goes nowhere, and the
    bundle or the .npz is still written, exit 0 (a review found build stopped at its first
    progress line and merge/import exited 2 after their work)."""
    np.save(tmp_path / "x.npy", np.zeros((1, 100), np.float32))
    for args, product in ((["build", "--policy", tiny_policy, "--out", tmp_path / "out"], tmp_path / "out"),
                          (["run", "--bundle", tiny_bundle, "--arch", "sm_90", "--backend", "emulator", "--k", "3",
                            tmp_path / "x.npy", "-o", tmp_path / "o.npz"], tmp_path / "o.npz")):
        proc = subprocess.run([*TOPKGEN, *map(str, args)], stderr=subprocess.PIPE, text=True,
                              env={**ENV, "TOPKGEN_CACHE_DIR": os.environ.get("TOPKGEN_CACHE_DIR", str(tmp_path))},
                              preexec_fn=lambda: os.close(1))
        said = [line for line in proc.stderr.splitlines() if not line.startswith("topkgen: compiling ")]  # first use
        assert (proc.returncode, said) == (0, []), args[0]
        assert product.exists()


# `topkgen run -o o.npz` that stops once its temporary beside o.npz is written and synced,
# so that the SIGKILL lands there every time (a small .npz is written in microseconds).
_STOP_IN_THE_TEMPORARY = """\
import os, sys, time
fsync = os.fsync
def stop_after(fd):
    fsync(fd)
    if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(".o.npz."):
        print("written", flush=True)
        time.sleep(600)
os.fsync = stop_after
from topkgen.cli import main
sys.argv[0] = "topkgen"
main()
"""


def test_run_killed_while_writing_o_leaves_a_temporary_that_the_next_run_removes(tiny_bundle, tmp_path):  # noqa: F811
    """SIGKILL cannot be caught: `run -o o.npz` killed during its write left the hidden
    .o.npz.<pid>.<hex>.tmp beside o.npz for good. The next write of o.npz removes it, and
    only it: a live writer's temporary (its pid alive, or its flock held) is left alone."""
    np.save(tmp_path / "x.npy", np.zeros((1, 100), np.float32))
    args = ["run", "--bundle", str(tiny_bundle), "--arch", "sm_90", "--backend", "emulator", "--k", "3",
            str(tmp_path / "x.npy"), "-o", str(tmp_path / "o.npz")]
    env = {**ENV, "TOPKGEN_CACHE_DIR": os.environ["TOPKGEN_CACHE_DIR"]}
    proc = subprocess.Popen([sys.executable, "-c", _STOP_IN_THE_TEMPORARY, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline() == "written\n", proc.communicate()[1]
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
    finally:
        proc.kill()
        proc.communicate()
    left = sorted(p.name for p in tmp_path.iterdir())
    assert len(left) == 2 and re.fullmatch(rf"\.o\.npz\.{proc.pid}\.[0-9a-f]{{8}}\.tmp", left[0]), left
    alive = tmp_path / f".o.npz.{os.getpid()}.0123abcd.tmp"
    gone = subprocess.Popen(["true"])
    gone.wait()
    held = tmp_path / f".o.npz.{gone.pid}.4567abcd.tmp"  # a writer in another pid namespace
    for live in (alive, held):
        live.write_bytes(b"")
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys\n"
                               f"fcntl.flock(os.open({str(held)!r}, os.O_RDONLY), fcntl.LOCK_EX)\n"
                               "print(flush=True); sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        holder.stdout.readline()  # it holds the flock
        done = subprocess.run([*TOPKGEN, *args], capture_output=True, text=True, env=env)
    finally:
        holder.communicate()
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, held.name, "o.npz", "x.npy"])


def test_a_closed_stdout_and_a_stderr_whose_reader_left_is_141_not_a_failed_build(tmp_path):
    """`topkgen build ... 2>&1 >&- | ...` with the reader gone: the build's warnings hit a
    broken pipe. The exit is 141, as for any reader that left, with nothing written; the
    stdout that must then be silenced is the closed one, which has no descriptor to point at
    /dev/null (that attempt raised, and the build exited 1, "a build failed")."""
    policy = tmp_path / "over-budget.yaml"  # both kernels over a 16-register budget: two warnings
    policy.write_text(TINY_POLICY.replace("max_registers: 96", "max_registers: 16"))
    args = [*TOPKGEN, "build", "--policy", str(policy), "--out", str(tmp_path / "out"), "--allow-over-budget"]
    env = {**ENV, "TOPKGEN_CACHE_DIR": os.environ["TOPKGEN_CACHE_DIR"]}
    shown = subprocess.run(args, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=lambda: os.close(1))
    assert (shown.returncode, shown.stderr.count("topkgen: warning: kernel topk_radix_")) == (0, 2), shown.stderr
    shutil.rmtree(tmp_path / "out")
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(args, stderr=write_end, env=env, preexec_fn=lambda: os.close(1))
    finally:
        os.close(write_end)
    assert proc.returncode == 141
    assert sorted(p.name for p in tmp_path.iterdir()) == [policy.name]  # no bundle, no staging directory


def test_a_reader_that_leaves_mid_write_is_141_not_a_result():
    """The pipe takes the first 64 KiB of a larger write, then its reader leaves: CPython's
    stdout dropped the rest without an error, and show exited 0, diff 1 ("the sides differ")."""
    legacy = ROOT / "policies" / "legacy" / "exact_n_grid.yaml"  # against the default: 1.5 MB of JSON
    read_end, write_end = os.pipe()
    proc = subprocess.Popen([*TOPKGEN, "diff", DEFAULT_POLICY, str(legacy), "--format", "json"], stdout=write_end,
                            stderr=subprocess.PIPE, text=True, env=ENV)
    os.close(write_end)
    deadline = time.monotonic() + 60
    while len(os.read(read_end, 16)) == 0 and time.monotonic() < deadline:  # it has begun to write
        time.sleep(0.01)
    os.close(read_end)
    stderr = proc.communicate(timeout=120)[1]
    assert (proc.returncode, stderr) == (141, "")
