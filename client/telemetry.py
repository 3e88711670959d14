"""A client's Prometheus metrics: throughput, loss, step progress, and GPU memory when present.

They describe this client's own data (samples per step, training loss), so ``/metrics`` listens on
the client's own host unless told otherwise (``DEFAULT_HOST``; ``--metrics-host`` widens it).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

DEFAULT_HOST = "127.0.0.1"  # this host only: the samples and loss are the client's own figures
HOST_HELP = (
    "address the metrics endpoint listens on (default $LORM_METRICS_HOST or 127.0.0.1, this host only); "
    "/metrics tells this client's samples per step, training loss, task, round and GPU memory to whoever "
    "reaches it: widen it (0.0.0.0) only for a scraper on a trusted network"
)


class _GpuCollector(Collector):
    """GPU memory read at scrape time; nothing at all on a host without CUDA."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def collect(self) -> Iterable:
        if self.device.type != "cuda" or not torch.cuda.is_available():
            return
        for name, doc, read in (
            ("lorm_client_gpu_memory_allocated_bytes", "tensor memory allocated now", torch.cuda.memory_allocated),
            (
                "lorm_client_gpu_memory_max_allocated_bytes",
                "peak tensor memory since start",
                torch.cuda.max_memory_allocated,
            ),
            (
                "lorm_client_gpu_memory_reserved_bytes",
                "memory held by the caching allocator",
                torch.cuda.memory_reserved,
            ),
        ):
            yield GaugeMetricFamily(name, doc, value=float(read(self.device)))


class ClientMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.samples = Counter(
            "lorm_client_samples", "samples processed (epochs x shard for training)", ["phase"], registry=r
        )
        self.samples_per_second = Gauge(
            "lorm_client_samples_per_second", "throughput of the last step", ["phase"], registry=r
        )
        self.loss = Gauge("lorm_client_train_loss", "mean training loss of the last local epoch", registry=r)
        self.steps = Counter("lorm_client_steps", "steps completed and sent", ["phase"], registry=r)
        self.task = Gauge("lorm_client_task", "task of the last step", registry=r)
        self.round = Gauge("lorm_client_round", "round of the last step", registry=r)

    def watch_device(self, device: torch.device) -> None:
        self.registry.register(_GpuCollector(device))

    def step_done(
        self, phase: str, task: int, round_: int, samples: int, seconds: float, loss: float | None = None
    ) -> None:
        self.steps.labels(phase=phase).inc()
        self.samples.labels(phase=phase).inc(samples)
        if seconds > 0:
            self.samples_per_second.labels(phase=phase).set(samples / seconds)
        if loss is not None and loss == loss:  # NaN: the step trained nothing
            self.loss.set(loss)
        self.task.set(task)
        self.round.set(round_)

    def serve(self, port: int, host: str = DEFAULT_HOST) -> int:
        """Expose ``/metrics`` over HTTP on ``host:port``; returns the bound port."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server.server_port
