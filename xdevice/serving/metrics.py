"""Per model version: what was served and how long each part took, for ``/metrics`` and the
statistics extension alike.

:class:`Stats` keeps Triton's statistics (``GET /v2/models/{m}/stats``, gRPC
``ModelStatistics``): success and failure counts and durations, and the queue,
compute-input, compute-infer and compute-output durations, per model and per batch size.
:class:`Registry` exposes the same numbers to Prometheus through ``prometheus_client``, with
Triton's metric names (``nv_inference_count / nv_inference_exec_count`` is the mean batch
size). prometheus_client writes a counter as ``<name>_total``; Triton's names have no suffix
and dashboards built for Triton query them as they are, so the families are written untyped.
"""

from __future__ import annotations

import collections
import threading
import time

__all__ = ["Stats", "Registry"]

#: Triton's metric -> (help, the Stats value it shows)
_METRICS = {
    "nv_inference_request_success": ("Successful inference requests", lambda s: s.count["success"]),
    "nv_inference_request_failure": ("Failed inference requests", lambda s: s.count["fail"]),
    "nv_inference_count": ("Inferences performed (a batch of n rows counts n)", lambda s: s.inference_count),
    "nv_inference_exec_count": ("Model executions (batches) performed", lambda s: s.execution_count),
    "nv_inference_request_duration_us": (
        "Cumulative end-to-end request time, microseconds",
        lambda s: (s.ns["success"] + s.ns["fail"]) / 1e3,
    ),
    "nv_inference_queue_duration_us": (
        "Cumulative time requests waited in the queue, microseconds",
        lambda s: s.ns["queue"] / 1e3,
    ),
    "nv_inference_compute_input_duration_us": (
        "Cumulative time preparing inputs, microseconds",
        lambda s: s.ns["compute_input"] / 1e3,
    ),
    "nv_inference_compute_infer_duration_us": (
        "Cumulative model execution time, microseconds",
        lambda s: s.ns["compute_infer"] / 1e3,
    ),
    "nv_inference_compute_output_duration_us": (
        "Cumulative time preparing outputs, microseconds",
        lambda s: s.ns["compute_output"] / 1e3,
    ),
    "nv_inference_pending_request_count": ("Requests waiting in the queue", lambda s: s.pending),
}
_PHASES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


class Stats:
    """The numbers of one model version (thread safe); durations in nanoseconds."""

    def __init__(self):
        self.count: dict[str, int] = collections.Counter()
        self.ns: dict[str, int] = collections.Counter()
        self.batches: dict[int, dict[str, list[int]]] = {}  # batch size -> phase -> [count, ns]
        self.inference_count = self.execution_count = self.pending = 0
        self.last_inference = 0  # ms since the epoch
        self.lock = threading.Lock()

    def request(self, ok: bool, seconds: float) -> None:
        with self.lock:
            phase = "success" if ok else "fail"
            self.count[phase] += 1
            self.ns[phase] += int(seconds * 1e9)
            if ok:
                self.last_inference = int(time.time() * 1000)

    def waiting(self, change: int) -> None:
        with self.lock:
            self.pending += change

    def queued(self, seconds: float) -> None:
        self._phase("queue", seconds)

    def phase(self, name: str, seconds: float) -> None:
        """A request's ``compute_input`` or ``compute_output`` time (decoding, encoding)."""
        self._phase(name, seconds)

    def executed(self, rows: int, seconds: float, requests: int = 1) -> None:
        """One run of the model over ``rows`` rows gathered from ``requests`` requests."""
        ns = int(seconds * 1e9)
        with self.lock:
            self.inference_count += rows
            self.execution_count += 1
            self.count["compute_infer"] += requests
            self.ns["compute_infer"] += ns * requests
            entry = self.batches.setdefault(rows, {"compute_infer": [0, 0]})["compute_infer"]
            entry[0] += 1
            entry[1] += ns

    def _phase(self, name: str, seconds: float) -> None:
        with self.lock:
            self.count[name] += 1
            self.ns[name] += int(seconds * 1e9)

    def snapshot(self, name: str, version: str) -> dict:
        """Triton's statistics for this version, as the HTTP extension returns them."""
        with self.lock:
            return {
                "name": name,
                "version": version,
                "last_inference": self.last_inference,
                "inference_count": self.inference_count,
                "execution_count": self.execution_count,
                "inference_stats": {phase: {"count": self.count[phase], "ns": self.ns[phase]} for phase in _PHASES}
                | {"cache_hit": {"count": 0, "ns": 0}, "cache_miss": {"count": 0, "ns": 0}},
                "batch_stats": [
                    {"batch_size": size, **{phase: {"count": c, "ns": ns} for phase, (c, ns) in phases.items()}}
                    for size, phases in sorted(self.batches.items())
                ],
                "memory_usage": [],
            }


class Registry:
    """Every model version's :class:`Stats`, and a ``prometheus_client`` registry showing them."""

    def __init__(self):
        from prometheus_client import CollectorRegistry

        self.models: dict[tuple[str, str], Stats] = {}
        self.prometheus = CollectorRegistry(auto_describe=False)
        self.prometheus.register(self)

    def of(self, model: str, version: str) -> Stats:
        return self.models.setdefault((model, version), Stats())

    def collect(self):  # the prometheus_client Collector protocol
        from prometheus_client.core import Metric

        for name, (text, value) in _METRICS.items():
            family = Metric(name, text, "unknown")
            for (model, version), stats in sorted(self.models.items()):
                family.add_sample(name, {"model": model, "version": version}, float(value(stats)))
            yield family

    def render(self) -> bytes:
        """The Prometheus text format."""
        from prometheus_client import generate_latest

        return generate_latest(self.prometheus)
