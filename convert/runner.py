"""Runs tasks in `jobs` worker processes (or in this process for jobs=1) and relays their
reports to the coordinator's callbacks, in arrival order."""

from __future__ import annotations

import errno
import multiprocessing as mp
import os
import resource
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.connection import wait

from moepack.convert.errors import ConvertError
from moepack.convert.tasks import Task
from moepack.convert.worker import (
    Worker,
    WorkerConfig,
    describe,
    interrupted,
    peak_rss,
    process_main,
)

from moepack.sysinfo import usable_cores

OnMessage = Callable[[tuple], None]
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


def threads_per_worker(jobs: int) -> int:
    """Math threads per worker, so that workers x threads <= cores (a peer's converter once
    started 1,792 threads on 224 cores)."""
    return max(1, usable_cores() // max(1, jobs))


@contextmanager
def _thread_env(threads: int) -> Iterator[None]:
    # Children read these when numpy's BLAS loads, so they must be set before spawning.
    saved = {k: os.environ.get(k) for k in _THREAD_VARS}
    os.environ.update(dict.fromkeys(_THREAD_VARS, str(threads)))
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def _starting(jobs: int) -> Iterator[None]:
    """Out of file descriptors (EMFILE: RLIMIT_NOFILE, ENFILE: the system's table) or processes
    (EAGAIN: RLIMIT_NPROC) while starting the workers (pipes, the spawned interpreter): one line
    naming the limit and what to do; the partial and the journal stay for the rerun."""
    try:
        yield
    except OSError as e:
        if e.errno in (errno.EMFILE, errno.ENFILE):
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            limit = "the system's open-file table is full" if e.errno == errno.ENFILE else \
                f"ulimit -n is {soft}"
            raise ConvertError(f"cannot start {jobs} worker processes: too many open files "
                               f"({limit}); raise it or pass fewer --jobs, then rerun the same "
                               "command to continue") from e
        if e.errno == errno.EAGAIN:
            raise ConvertError(f"cannot start {jobs} worker processes: {e.strerror} (the "
                               "process limit, ulimit -u?); pass fewer --jobs, then rerun the "
                               "same command to continue") from e
        raise


def run_tasks(cfg: WorkerConfig, tasks: list[Task], done: dict[str, str], jobs: int,
              on_message: OnMessage) -> None:
    if not tasks:
        return
    if jobs <= 1:
        _run_inline(cfg, tasks, done, on_message)
    else:
        _run_processes(cfg, tasks, done, jobs, on_message)


def _run_inline(cfg: WorkerConfig, tasks: list[Task], done: dict[str, str],
                on_message: OnMessage) -> None:
    worker = Worker(cfg, on_message)
    try:
        for task in tasks:
            try:
                worker.run(task, done)
            except (ConvertError, OSError, KeyboardInterrupt):
                raise
            except Exception as e:  # same report as from a worker process
                if interrupted(e):
                    raise KeyboardInterrupt from None
                raise ConvertError(f"{task.key}: {describe(e)}") from e
            on_message(("task_done", task.key, peak_rss()))
    finally:
        worker.close()


def _run_processes(cfg: WorkerConfig, tasks: list[Task], done: dict[str, str], jobs: int,
                   on_message: OnMessage) -> None:
    # One pipe per worker, no mp.Queue: queues hold named semaphores, and a run stopped by an
    # error could leave one for the resource tracker to report as leaked on stderr.
    ctx = mp.get_context("spawn")  # no fork: BLAS thread pools and locks do not survive it
    pending = list(reversed(tasks))
    n = min(jobs, len(tasks))
    conns, procs = [], []
    try:
        with _thread_env(cfg.threads), _starting(n):
            for i in range(n):
                ours, theirs = ctx.Pipe()
                conns.append(ours)
                p = ctx.Process(target=process_main, args=(cfg, done, theirs),
                                name=f"moepack-convert-{i}", daemon=True)
                try:
                    p.start()
                finally:
                    theirs.close()
                procs.append(p)
        for c in conns:
            c.send(pending.pop())
        busy = list(conns)
        while busy:
            for c in wait(busy):
                try:
                    msg = c.recv()
                except EOFError:
                    p = procs[conns.index(c)]
                    p.join(timeout=5)
                    raise ConvertError(
                        f"worker {p.name} died (exit code {p.exitcode}); "
                        "out of memory? rerun the same command to continue") from None
                if msg[0] == "error":
                    raise ConvertError(f"{msg[1]}: {msg[2]}")
                if msg[0] == "task_done":
                    task = pending.pop() if pending else None
                    c.send(task)
                    if task is None:
                        busy.remove(c)
                on_message(msg)
        for p in procs:
            p.join()
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=5)
        for c in conns:
            c.close()
