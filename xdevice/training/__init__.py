"""Training on any backend: ``fit``, ``Trainer``, optimizers, losses, data and checkpoints.

- ``trainer.py``: the step written once, ``Trainer`` and ``fit``;
- ``programs.py``: zoo models, torch modules, Keras/tf.Module and JAX pairs seen the same way;
- ``optimizers.py``: SGD, momentum, Adam, AdamW over the op set (PyTorch's math);
- ``losses.py``: cross-entropy, MSE, accuracy; ``data.py``: batches and the prefetcher;
- ``schedules.py``: learning-rate schedules; ``precision.py``: float16's loss scaling;
- ``callbacks.py``: progress, early stopping, best checkpoint, CSV and TensorBoard logging;
- ``checkpoint.py``: safetensors + JSON; ``history.py``: history, plot;
- ``replication.py``: ``replicate``, over the hooks every backend's engine fills in;
- ``launch.py``: ``xdevice launch``, the environment it gives each process.

The program and replicas contracts that backends build on live in
``xdevice.backends.training``; each backend's ``training.py`` adapts its own models.

Importing this package imports no framework.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "SGD",
    "Adam",
    "AdamW",
    "Batches",
    "BestCheckpoint",
    "CSVLogger",
    "Callback",
    "EarlyStopping",
    "History",
    "LossScale",
    "Optimizer",
    "Replicas",
    "TensorBoard",
    "Trainer",
    "constant",
    "cosine",
    "estimate_memory",
    "exponential",
    "fit",
    "one_cycle",
    "replicate",
    "step_decay",
]

_HOMES = {
    "Trainer": "trainer",
    "fit": "trainer",
    "SGD": "optimizers",
    "Adam": "optimizers",
    "AdamW": "optimizers",
    "Optimizer": "optimizers",
    "Batches": "data",
    "History": "history",
    "Replicas": "replication",
    "replicate": "replication",
    "LossScale": "precision",
    **{name: "callbacks" for name in ("Callback", "EarlyStopping", "BestCheckpoint", "CSVLogger", "TensorBoard")},
    **{name: "schedules" for name in ("constant", "cosine", "exponential", "one_cycle", "step_decay")},
    "estimate_memory": "memory",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'xdevice.training' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"xdevice.training.{_HOMES[name]}"), name)
