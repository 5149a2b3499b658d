"""The one thread that owns the engine: requests queue (bounded) and run one at a time."""

from __future__ import annotations

import queue
import threading
import time

from moepack.runtime.engine import Engine, EngineError
from moepack.serve.generate import Generator
from moepack.serve.job import Done, Job, ServerStopping
from moepack.serve.metrics import Metrics
from moepack.serve.vocab import Vocab


class Worker:
    def __init__(self, engine: Engine, vocab: Vocab, max_queue: int, metrics: Metrics) -> None:
        self.engine, self.metrics = engine, metrics
        self.gen = Generator(engine, vocab)
        self.max_queue = max_queue
        self._q: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self.pending = 0  # submitted and not finished, the running one included
        self.current: Job | None = None
        self.stopped: ServerStopping | None = None  # set once: no job runs after it
        self.engine_stats = engine.stats()  # read only by this thread; others get the copy
        self._thread = threading.Thread(target=self._loop, name="moepack-engine", daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        return max(0, self.pending - 1)

    def submit(self, job: Job) -> bool:
        """Queue a job; False when the queue is full (the caller answers 429)."""
        with self._lock:
            if self.pending >= self.max_queue + 1:
                return False
            self.pending += 1
        self._q.put(job)
        return True

    def retry_after(self) -> int:
        """Seconds a refused client should wait: the queue ahead times a typical request."""
        return max(1, round(self.waiting * self.metrics.mean_request_seconds()))

    def stop(self) -> None:
        """Stop taking jobs: the running one and every waiting one get ServerStopping (their
        requests answer with it at once) and are cancelled (the engine stops within a layer's
        work). From any thread."""
        with self._lock:
            if self.stopped is not None:
                return
            self.stopped = ServerStopping()
            current = self.current
        if current is not None:
            current.emit(self.stopped)  # before the cancel: the request sees it, not the
            current.cancel.set()        # "cancelled" end the engine then reports
        while True:
            try:
                job = self._q.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.emit(self.stopped)
                job.cancel.set()
                with self._lock:
                    self.pending -= 1

    def close(self, timeout: float = 5.0) -> bool:
        """Stop, then end the thread; True when it has ended within `timeout` seconds (only
        then may the engine be closed: the thread may still be inside it)."""
        self.stop()
        self._q.put(None)
        self._thread.join(timeout=timeout)
        return not self._thread.is_alive()

    def _loop(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                return
            try:
                if job.cancel.is_set():  # its client left while it waited
                    self.metrics.cancelled += 1
                    continue
                with self._lock:
                    stopped = self.stopped
                    self.current = job if stopped is None else None
                if stopped is not None:  # taken off the queue just as stop() drained it
                    job.emit(stopped)
                    continue
                self._run(job)
            finally:
                with self._lock:
                    self.pending -= 1
                    self.current = None

    def _run(self, job: Job) -> None:
        try:
            done: Done = self.gen.run(job)
        except EngineError as e:
            job.emit(e)
            self.metrics.errors += 1
        except Exception as e:  # noqa: BLE001 (a bug must fail this request, not the server)
            job.emit(e)
            self.metrics.errors += 1
        else:
            job.emit(done)
            self.metrics.record(done)
        finally:
            self.engine_stats = self.engine.stats()
            self.metrics.last_job_end = time.time()
