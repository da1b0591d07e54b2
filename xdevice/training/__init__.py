"""Training on any backend: ``fit``, ``Trainer``, optimizers, losses, data and checkpoints.

- ``trainer.py``: the step written once, ``Trainer`` and ``fit``;
- ``programs.py``: zoo models, torch modules, Keras/tf.Module and JAX pairs seen the same way;
- ``optimizers.py``: SGD, momentum, Adam, AdamW over the op set (PyTorch's math);
- ``losses.py``: cross-entropy, MSE, accuracy; ``data.py``: batches and the prefetcher;
- ``checkpoint.py``: safetensors + JSON; ``history.py``: history, progress, plot;
- ``replication.py``: ``replicate``, over the hooks every backend's engine fills in;
- ``launch.py``: ``xdevice launch``, the environment it gives each process.

The program and replicas contracts that backends build on live in
``xdevice.backends.training``; each backend's ``training.py`` adapts its own models.

Importing this package imports no framework.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SGD", "Adam", "AdamW", "Batches", "History", "Optimizer", "Replicas", "Trainer", "fit", "replicate"]

_HOMES = {"Trainer": "trainer", "fit": "trainer", "SGD": "optimizers", "Adam": "optimizers",
          "AdamW": "optimizers", "Optimizer": "optimizers", "Batches": "data", "History": "history",
          "Replicas": "replication", "replicate": "replication"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'xdevice.training' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"xdevice.training.{_HOMES[name]}"), name)
