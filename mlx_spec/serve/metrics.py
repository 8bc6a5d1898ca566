"""`GET /metrics`: what an operator scrapes, in Prometheus' text format (prometheus-client), one registry per
server. Requests by route and status; of finished generations: prompt, cached and generated tokens, drafted and
accepted tokens per drafter and draft position, stop reasons, prompt-cache hits; time to first token and time per
output token; and, read as scraped, the queue, the rows decoding, the prompt cache's bytes and MLX's memory.
"""

from __future__ import annotations

import time

import mlx.core as mx
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..core.events import Done, Token

CONTENT_TYPE = CONTENT_TYPE_LATEST
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120, float("inf"))
TOKEN_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2, 2.5, 5, float("inf"))


class Metrics:
    def __init__(self, generator):
        """generator: the server's `Generator`, whose queue, rows and engines the gauges read when scraped."""
        self.registry = registry = CollectorRegistry()
        self.requests = Counter("mlx_spec_requests", "HTTP requests answered, by route and status",
                                ["route", "status"], registry=registry)
        self.generations = Counter("mlx_spec_generations", "Generations finished, by stop reason", ["stop_reason"],
                                   registry=registry)
        self.prompt_tokens = Counter("mlx_spec_prompt_tokens", "Prompt tokens of finished generations",
                                     registry=registry)
        self.cached_tokens = Counter("mlx_spec_cached_prompt_tokens", "Of those, tokens the prompt cache served",
                                     registry=registry)
        self.cache_hits = Counter("mlx_spec_prompt_cache_hits", "Generations the prompt cache served a prefix",
                                  registry=registry)
        self.generated_tokens = Counter("mlx_spec_generation_tokens", "Tokens generated", registry=registry)
        self.drafted = Counter("mlx_spec_draft_tokens", "Draft positions verified, by drafter and position (1: a "
                               "round's first draft)", ["drafter", "position"], registry=registry)
        self.accepted = Counter("mlx_spec_accepted_draft_tokens", "Draft positions accepted, by drafter and position",
                                ["drafter", "position"], registry=registry)
        self.first_token = Histogram("mlx_spec_time_to_first_token_seconds", "From a request's arrival to its "
                                     "first token", buckets=LATENCY_BUCKETS, registry=registry)
        self.per_token = Histogram("mlx_spec_time_per_output_token_seconds", "A generation's decoding time (after "
                                   "its prefill) per token it generated", buckets=TOKEN_BUCKETS, registry=registry)
        gauges = {"mlx_spec_queue_depth": ("Requests waiting for the generation thread",
                                           lambda: generator.jobs.qsize() + len(generator.deferred)),
                  "mlx_spec_batch_rows": ("Generations decoding together now", lambda: len(generator.running)),
                  "mlx_spec_prompt_cache_bytes": ("Bytes the prompt cache holds", lambda: sum(
                      engine.prompt_cache.nbytes for engine in generator.engines.values() if engine.prompt_cache)),
                  "mlx_spec_memory_active_bytes": ("MLX's memory in use", mx.get_active_memory),
                  "mlx_spec_memory_peak_bytes": ("MLX's peak memory since start", mx.get_peak_memory)}
        for name, (text, read) in gauges.items():
            Gauge(name, text, registry=registry).set_function(read)
    def request(self, route: str, status: int) -> None:
        self.requests.labels(route, str(status)).inc()

    def observe(self, job, event) -> None:
        """An engine event of `job` (a generator `Job`), from the generation thread."""
        if isinstance(event, Token) and not job.answered:
            job.answered = True
            self.first_token.observe(time.monotonic() - job.arrived)
        if not isinstance(event, Done):
            return
        stats = event.stats
        self.generations.labels(event.stop_reason).inc()
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.cached_tokens.inc(stats.reused_prompt_tokens)
        self.cache_hits.inc(stats.reused_prompt_tokens > 0)
        self.generated_tokens.inc(stats.generated_tokens)
        for position, (drafted, accepted) in enumerate(zip(stats.position_drafted, stats.position_accepted), 1):
            self.drafted.labels(stats.drafter, str(position)).inc(drafted)
            self.accepted.labels(stats.drafter, str(position)).inc(accepted)
        if stats.generated_tokens:
            self.per_token.observe(stats.decode_seconds / stats.generated_tokens)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
