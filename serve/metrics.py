"""Counters for GET /metrics (Prometheus text format, version 0.0.4)."""

from __future__ import annotations

from collections import Counter, deque

from moepack.serve.job import Done


class Metrics:
    def __init__(self) -> None:
        self.requests: Counter[tuple[str, int]] = Counter()  # (endpoint, status) -> count
        self.rejected = 0  # 429: a queue full
        self.cancelled = 0
        self.errors = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.completion_tokens = 0
        self.last_job_end = 0.0
        self._recent: deque[float] = deque(maxlen=32)  # seconds of recent requests

    def record(self, done: Done) -> None:
        self.prompt_tokens += done.prompt_tokens
        self.cached_tokens += done.cached_tokens
        self.completion_tokens += done.completion_tokens
        if done.finish_reason == "cancelled":
            self.cancelled += 1
        self._recent.append(done.seconds)

    def mean_request_seconds(self) -> float:
        return sum(self._recent) / len(self._recent) if self._recent else 1.0

    def render(self, engine: dict, queue_depth: int, busy: bool) -> str:
        lines: list[str] = []

        def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP moepack_{name} {help_}")
            lines.append(f"# TYPE moepack_{name} {kind}")
            for labels, v in samples:
                lines.append(f"moepack_{name}{labels} {v:.10g}")

        metric("requests_total", "counter", "HTTP requests answered, by endpoint and status.",
               [(f'{{endpoint="{e}",status="{s}"}}', n)
                for (e, s), n in sorted(self.requests.items())])
        metric("requests_rejected_total", "counter",
               "Requests refused with 429 (the engine's or the tokenizer's queue full).",
               [("", self.rejected)])
        metric("requests_cancelled_total", "counter", "Generations stopped by a disconnect.",
               [("", self.cancelled)])
        metric("request_errors_total", "counter", "Requests the engine failed.",
               [("", self.errors)])
        metric("queue_depth", "gauge", "Requests waiting behind the running one.",
               [("", queue_depth)])
        metric("busy", "gauge", "1 while the engine runs a request.", [("", int(busy))])
        metric("prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
               [("", self.prompt_tokens)])
        metric("prompt_tokens_cached_total", "counter",
               "Prompt tokens reused from the previous request's KV cache (not evaluated).",
               [("", self.cached_tokens)])
        metric("completion_tokens_total", "counter", "Tokens generated.",
               [("", self.completion_tokens)])
        metric("prompt_tokens_per_second", "gauge", "Engine prompt throughput since start.",
               [("", engine["prompt_tok_s"])])
        metric("decode_tokens_per_second", "gauge", "Engine decode throughput since start.",
               [("", engine["decode_tok_s"])])
        metric("expert_cache_hits_total", "counter", "Expert cache hits.",
               [("", engine["cache_hits"])])
        metric("expert_cache_misses_total", "counter", "Expert cache misses (read from disk).",
               [("", engine["cache_misses"])])
        metric("expert_cache_hit_ratio", "gauge", "Hits / (hits + misses) since start.",
               [("", engine["hit_rate"])])
        metric("bytes_read_total", "counter", "Expert bytes read from the container.",
               [("", engine["bytes_read"])])
        metric("io_wait_seconds_total", "counter", "Compute time spent waiting for reads.",
               [("", engine["io_wait_seconds"])])
        metric("engine_busy_seconds_total", "counter", "Engine prompt + decode time.",
               [("", engine["prompt_seconds"] + engine["decode_seconds"])])
        return "\n".join(lines) + "\n"
