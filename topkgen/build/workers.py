"""Work spread over threads that a Ctrl-C does not wait for.

An NVRTC compile cannot be interrupted, and concurrent.futures joins its workers both when
its executor's `with` block ends and when the interpreter exits: a Ctrl-C during a build
waited for every compile under way (seconds at -j 2) before the prompt came back. Here the
workers are daemon threads, which nothing joins: once the caller stops listening, no new
item starts, and those under way are abandoned; topkgen.cli.launch then ends the process at
once (`busy`). What they would write cannot be half-written by that: the compile cache
writes each entry to a temporary file and links it into place (cache.LocalStore.create).

The caller waits in short polls, not in one blocking wait: the first NVRTC compile of a
process leaves Python's SIGINT and SIGTERM handlers installed with SA_RESTART, after which a
blocked call is restarted after a Ctrl-C instead of raising it (Python raises it only once it
runs again). Once the run is over the caller puts Python's handlers back as Python installs
them (`python_handles_signals_again`), so that what it blocks on next (the destination's
lock, while another build writes there) wakes for a Ctrl-C too; topkgen.build.compile does the
same after a compile on the main thread, for a program that JIT-compiles through TopK.
"""

from __future__ import annotations

import queue
import signal
import threading
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")
_POLL_SECONDS = 0.05
_working: set[int] = set()  # the threads running an item now


def busy() -> bool:
    """Whether any item is under way (in a run that was abandoned, when the caller is done)."""
    return bool(_working)


def run_all(work: Callable[[T], R], items: Sequence[T], jobs: int,
            finished: Callable[[T, R], None] | None = None) -> list[R]:
    """`[work(item) for item in items]`, `jobs` items at a time; `finished` is told of each
    item as it finishes, on the caller's thread (so nothing is printed once it has stopped).
    The first exception `work` raises is raised here. When the caller stops early (that
    exception, a Ctrl-C, a SIGTERM), no further item is started and none is waited for."""
    todo: queue.SimpleQueue[tuple[int, T]] = queue.SimpleQueue()
    for entry in enumerate(items):
        todo.put(entry)
    done: queue.SimpleQueue[tuple[int, bool, object]] = queue.SimpleQueue()

    def worker() -> None:
        me = threading.get_ident()
        while True:
            _working.add(me)  # before taking an item: a caller that sees busy() false started none
            try:
                index, item = todo.get_nowait()
            except queue.Empty:
                _working.discard(me)
                return
            try:
                done.put((index, True, work(item)))
            except BaseException as err:  # noqa: BLE001 - handed to the caller's thread, raised there
                done.put((index, False, err))
            finally:
                _working.discard(me)

    for _ in range(min(max(1, jobs), len(items))):
        threading.Thread(target=worker, name="topkgen-worker", daemon=True).start()
    results: list[R | None] = [None] * len(items)
    try:
        for _ in items:
            while True:
                try:
                    index, ok, value = done.get(timeout=_POLL_SECONDS)
                    break
                except queue.Empty:
                    continue  # back in Python now and then, where a Ctrl-C is raised (see the module's doc)
            if not ok:
                raise value  # type: ignore[misc]
            results[index] = value  # type: ignore[assignment]
            if finished is not None:
                finished(items[index], value)  # type: ignore[arg-type]
    finally:
        while True:  # what has not started never will
            try:
                todo.get_nowait()
            except queue.Empty:
                break
        python_handles_signals_again()
    return results  # type: ignore[return-value]


def python_handles_signals_again() -> None:
    """Install Python's own SIGINT and SIGTERM handlers again, without the SA_RESTART an
    NVRTC compile left them with (see the module's doc); only the main thread may."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(signum)
        if callable(handler):  # SIG_DFL and SIG_IGN run no handler, so nothing restarts
            signal.signal(signum, handler)
