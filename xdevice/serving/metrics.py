"""Prometheus metrics with Triton's names, per model and version (``GET /metrics``).

``nv_inference_count / nv_inference_exec_count`` is the mean batch size: requests counted
once each, executions once per (possibly merged) batch.
"""

from __future__ import annotations

import collections
import threading

__all__ = ["Metrics", "Registry"]

_COUNTERS = {
    "nv_inference_request_success": "Successful inference requests",
    "nv_inference_request_failure": "Failed inference requests",
    "nv_inference_count": "Inferences performed (a batch of n rows counts n)",
    "nv_inference_exec_count": "Model executions (batches) performed",
    "nv_inference_request_duration_us": "Cumulative end-to-end request time, microseconds",
    "nv_inference_queue_duration_us": "Cumulative time requests waited in the queue, microseconds",
    "nv_inference_compute_infer_duration_us": "Cumulative model execution time, microseconds",
}
_GAUGES = {"nv_inference_pending_request_count": "Requests waiting in the queue"}


class Metrics:
    """The counters of one model version (thread safe)."""

    def __init__(self):
        self.values: dict[str, float] = collections.defaultdict(float)
        self.lock = threading.Lock()

    def add(self, name: str, amount: float) -> None:
        with self.lock:
            self.values[name] += amount

    def request(self, ok: bool, seconds: float) -> None:
        self.add("nv_inference_request_success" if ok else "nv_inference_request_failure", 1)
        self.add("nv_inference_request_duration_us", seconds * 1e6)

    def pending(self, change: int) -> None:
        self.add("nv_inference_pending_request_count", change)

    def queued(self, seconds: float) -> None:
        self.add("nv_inference_queue_duration_us", seconds * 1e6)

    def executed(self, rows: int, seconds: float) -> None:
        self.add("nv_inference_count", rows)
        self.add("nv_inference_exec_count", 1)
        self.add("nv_inference_compute_infer_duration_us", seconds * 1e6)


class Registry:
    """Every model version's ``Metrics``, rendered in the Prometheus text format."""

    def __init__(self):
        self.models: dict[tuple[str, str], Metrics] = {}

    def of(self, model: str, version: str) -> Metrics:
        return self.models.setdefault((model, version), Metrics())

    def render(self) -> str:
        lines = []
        for kind, family in (("counter", _COUNTERS), ("gauge", _GAUGES)):
            for name, text in family.items():
                lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
                for (model, version), metrics in sorted(self.models.items()):
                    value = metrics.values.get(name, 0.0)
                    lines.append(f'{name}{{model="{model}",version="{version}"}} {value:.0f}')
        return "\n".join(lines) + "\n"
