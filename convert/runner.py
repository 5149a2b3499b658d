"""Runs tasks in `jobs` worker processes (or in this process for jobs=1) and relays their
reports to the coordinator's callbacks, in arrival order."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from moepack.convert.errors import ConvertError
from moepack.convert.tasks import Task
from moepack.convert.worker import Worker, WorkerConfig, describe, peak_rss, process_main

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
                raise ConvertError(f"{task.key}: {describe(e)}") from e
            on_message(("task_done", task.key, peak_rss()))
    finally:
        worker.close()


def _run_processes(cfg: WorkerConfig, tasks: list[Task], done: dict[str, str], jobs: int,
                   on_message: OnMessage) -> None:
    ctx = mp.get_context("spawn")  # no fork: BLAS thread pools and locks do not survive it
    task_q, result_q = ctx.Queue(), ctx.Queue()
    for t in tasks:
        task_q.put(t)
    n = min(jobs, len(tasks))
    for _ in range(n):
        task_q.put(None)
    with _thread_env(cfg.threads):
        procs = [ctx.Process(target=process_main, args=(cfg, done, task_q, result_q),
                             name=f"moepack-convert-{i}", daemon=True) for i in range(n)]
        for p in procs:
            p.start()
    remaining = len(tasks)
    try:
        while remaining:
            try:
                msg = result_q.get(timeout=0.5)
            except queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise ConvertError(
                        f"worker {dead[0].name} died (exit code {dead[0].exitcode}); "
                        "out of memory? rerun the same command to continue") from None
                continue
            if msg[0] == "error":
                raise ConvertError(f"{msg[1]}: {msg[2]}")
            if msg[0] == "task_done":
                remaining -= 1
            on_message(msg)
        for p in procs:
            p.join()
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=5)
        task_q.cancel_join_thread()
        result_q.cancel_join_thread()
