"""Faults of the machine, not of topkgen (issue 33, point 9): a full disk under the bundle or
the emulator's host compile, memory the emulator cannot have, and a SIGTERM while a kernel
runs on the emulator. Each is one line and its own exit status (2, or 143), never an internal
error (70) or a process that runs on."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ..support.commands import ENV, TOPKGEN, one_line_error, run_topkgen


@pytest.fixture
def full_fs(tmp_path):
    """A 1 MiB tmpfs at tmp_path/full with all but 40 KiB taken: a real full disk, for the
    processes topkgen starts (g++, ld) as much as for topkgen. Needs the right to mount."""
    where = tmp_path / "full"
    where.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {proc.stderr.decode().strip()}")
    try:
        (where / "cache").mkdir()
        with open(where / "fill", "wb") as f:  # room for a small source file, not for a shared object
            f.write(b"\0" * ((1 << 20) - (40 << 10)))
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_full_disk_under_the_bundle_is_one_line_exit_2_and_nothing_written(tiny_policy, full_fs):
    out = full_fs / "out"
    proc = run_topkgen("build", "--policy", tiny_policy, "--out", out)  # the session's cache serves both kernels
    one_line_error(proc, f"{out} left as it was", os.strerror(28))  # ENOSPC
    assert sorted(p.name for p in full_fs.iterdir()) == ["cache", "fill"]  # no staging directory left


_EMULATE = """
import sys
from topkgen.common import errors
from topkgen.emulator import compile_source
try:
    compile_source('extern "C" __global__ void k(int* p) { p[threadIdx.x] = 1; }', name="full_disk_probe")
except errors.InputError as err:
    print(type(err).__name__, err)
    sys.exit(2)
"""


def test_a_full_disk_under_the_emulators_host_compile_is_an_input_error(full_fs):
    """The linker's "No space left on device" was an EmulationError, so `run` said internal error, exit 70."""
    proc = subprocess.run([sys.executable, "-c", _EMULATE], capture_output=True, text=True, timeout=120,
                          env={**ENV, "TOPKGEN_CACHE_DIR": str(full_fs / "cache")})
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stdout.count("\n") == 1 and "the emulator cache" in proc.stdout, proc.stdout
    assert os.strerror(28) in proc.stdout and str(full_fs / "cache") in proc.stdout


def _sparse_npy(path: Path, shape: tuple[int, int]) -> Path:
    """A float32 .npy of zeros, written as a sparse file (no disk, no time)."""
    header = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=shape)
    del header
    return path


def _address_space(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return apply


def test_memory_the_emulator_cannot_have_is_one_line_exit_2(tiny_bundle, tmp_path):
    """A 1 GiB input under a 1.8 GB address space: numpy's MemoryError or the emulator's refused
    region were internal errors (exit 70)."""
    x = _sparse_npy(tmp_path / "x.npy", (64, 1 << 22))
    warm = run_topkgen("run", "--bundle", tiny_bundle, "--backend", "emulator", "--arch", "sm_90", "--k", 64,
                       _sparse_npy(tmp_path / "small.npy", (1, 1024)))  # compiled first: no "compiling" line below
    assert warm.returncode == 0, warm.stderr
    for limit in (1_500_000_000, 1_800_000_000):  # the first fails in numpy, the second in the emulator
        proc = run_topkgen("run", "--bundle", tiny_bundle, "--backend", "emulator", "--arch", "sm_90", "--k", 64, x,
                           "-o", tmp_path / "o.npz", preexec_fn=_address_space(limit), timeout=120)
        one_line_error(proc, "out of memory")
    assert not (tmp_path / "o.npz").exists()


def _threads(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        return 0


def test_sigterm_while_the_emulator_runs_a_kernel_is_exit_143_at_once(tiny_bundle, tmp_path):
    """A SIGTERM was taken only when tk_launch returned (26 s and more on a GiB); now the launch
    runs on a thread of its own, and is cancelled."""
    x = _sparse_npy(tmp_path / "x.npy", (64, 1 << 22))  # 1 GiB: a launch of several seconds
    warm = run_topkgen("run", "--bundle", tiny_bundle, "--backend", "emulator", "--arch", "sm_90", "--k", 64,
                       _sparse_npy(tmp_path / "small.npy", (1, 1024)))  # the module compiled before the clock starts
    assert warm.returncode == 0, warm.stderr
    proc = subprocess.Popen([*TOPKGEN, "run", "--bundle", str(tiny_bundle), "--backend", "emulator", "--arch",
                             "sm_90", "--k", "64", str(x), "-o", str(tmp_path / "o.npz")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        deadline = time.monotonic() + 60
        while _threads(proc.pid) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # the emulator's threads are up: the kernel runs
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.3)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=20)
        took = time.monotonic() - sent
    finally:
        proc.kill()
        proc.wait()
    assert (proc.returncode, stderr, stdout) == (143, "topkgen: terminated\n", "")
    assert took < 3, f"{took:.1f} s from SIGTERM to exit"
    assert not (tmp_path / "o.npz").exists()
