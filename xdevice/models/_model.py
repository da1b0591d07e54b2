"""The ``Model`` object: one zoo definition, its weights, and the backend and device it runs on.

Weights are kept in the backend's own arrays, on the model's device. Saving writes
safetensors with the spec in the file's metadata; nothing is ever pickled.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
from collections.abc import Callable
from typing import Any

from xdevice import _registry
from xdevice._device import Device
from xdevice._discovery import find
from xdevice._errors import ConfigurationError, ConversionError, message

__all__ = ["NAMES", "Model", "build", "load", "definition"]

#: The reference models, in the order they are shown.
NAMES = ("mlp", "cnn", "resnet", "lstm", "transformer")
_FORMAT = "xdevice.model/1"


def definition(name: str):
    """The module that defines zoo model ``name`` (DEFAULTS, parameters, apply, example_input)."""
    if name not in NAMES:
        raise ConfigurationError(message("Unknown model", expected="a zoo model name", received=name, choices=NAMES))
    return importlib.import_module(f"xdevice.models.{name}")


class Model:
    """A zoo model bound to a backend and a device: call it like a function.

    Attributes:
        name: the zoo name (``"cnn"``).
        spec: hyper-parameters (the definition's defaults, updated with what was asked).
        params: every named array, trainable ones and buffers, in the backend's arrays.
        trainable: names of the parameters training updates by gradient.
        backend: the backend's name; ``device``: where the arrays live.
    """

    def __init__(self, name: str, spec: dict, params: dict[str, Any], backend: str, device: Device):
        self.name, self.spec, self.params = name, spec, params
        self.backend, self.device = backend, device
        table = definition(name).parameters(spec)
        self.trainable = [key for key, param in table.items() if param.trainable]
        self.buffers = [key for key, param in table.items() if not param.trainable]

    @property
    def __xdevice_backend__(self) -> str:
        return self.backend  # the registry's owner() reads it: a zoo model is its backend's model

    @property
    def ops(self):
        return _registry.backend(self.backend).ops

    @property
    def apply(self) -> Callable[..., Any]:
        """``apply(ops, params, x, train=False)``: the pure function, spec already bound."""
        return functools.partial(definition(self.name).apply, spec=self.spec)

    def __call__(self, x: Any, train: bool = False) -> Any:
        """The model's output for ``x`` (numpy or the backend's array); with ``train=True``,
        ``(output, updated buffers)`` (batch statistics are used and the buffers are not
        changed in place: assign them if you want them kept)."""
        backend = _registry.backend(self.backend)
        x = backend.to_device(self.ops.asarray(x), self.device)
        return self.apply(self.ops, self.params, x, train=train)

    def example_input(self, batch: int = 8, seed: int = 0):
        """A numpy batch of the input this model takes (synthetic, from ``seed``)."""
        import numpy as np

        return definition(self.name).example_input(self.spec, batch, np.random.default_rng(seed))

    def numpy_params(self) -> dict[str, Any]:
        """Every parameter and buffer as a numpy array (a copy)."""
        return {key: self.ops.to_numpy(value) for key, value in self.params.items()}

    def to(self, backend: str | None = None, device: Any = None, dtype: str | None = None) -> Model:
        """The same weights as a model on another backend, device or float dtype."""
        return _place(
            self.name,
            self.spec,
            self.numpy_params(),
            backend or self.backend,
            device if device is not None else (self.device if backend in (None, self.backend) else "cpu"),
            dtype,
        )

    def save(self, path: str | os.PathLike) -> None:
        """Write safetensors: every array, plus the name and spec as JSON metadata."""
        from safetensors.numpy import save_file

        header = json.dumps({"format": _FORMAT, "model": self.name, "spec": self.spec})
        save_file(
            {k: v.astype("float32") for k, v in self.numpy_params().items()}, str(path), metadata={"xdevice": header}
        )

    def __repr__(self) -> str:
        count = sum(int(__import__("math").prod(self.ops.shape(self.params[k]))) for k in self.trainable)
        return f"<xdevice model {self.name!r}: {count:,} parameters on {self.backend} {self.device}>"


def build(
    name: str, backend: str = "numpy", device: Any = "cpu", seed: int = 0, dtype: str = "float32", **spec: Any
) -> Model:
    """A zoo model with weights drawn from ``seed``, on ``backend`` and ``device``.

    The same name, spec and seed give the same weights on every backend.

    Args:
        name: one of ``NAMES``.
        backend, device: where it runs.
        seed: the numpy seed for every weight.
        dtype: the float dtype of the weights.
        **spec: hyper-parameters overriding the definition's ``DEFAULTS``.

    >>> model = build("mlp", hidden=[16], seed=0)
    >>> model(model.example_input(2)).shape
    (2, 10)
    """
    module = definition(name)
    unknown = sorted(set(spec) - set(module.DEFAULTS))
    if unknown:
        raise ConfigurationError(
            message(f"Unknown hyper-parameter for {name!r}", received=unknown[0], choices=sorted(module.DEFAULTS))
        )
    full = {**module.DEFAULTS, **spec}
    from xdevice.models._init import initialise

    return _place(name, full, initialise(module.parameters(full), seed), backend, device, dtype)


def load(path: str | os.PathLike, backend: str = "numpy", device: Any = "cpu", dtype: str = "float32") -> Model:
    """A model saved with ``Model.save``, on ``backend`` and ``device``.

    Raises:
        ConversionError: the file is not an xdevice model or does not match its spec.
    """
    from safetensors import safe_open
    from safetensors.numpy import load_file

    try:
        with safe_open(str(path), "np") as handle:
            header = json.loads((handle.metadata() or {}).get("xdevice", "null"))
        arrays = load_file(str(path))
    except (OSError, ValueError, Exception) as error:  # safetensors raises its own error types
        raise ConversionError(
            message(
                "Cannot read the model file",
                received=f"{path}: {error}",
                fix="check the path; files come from Model.save",
            )
        ) from error
    if not header or header.get("format") != _FORMAT:
        raise ConversionError(
            message("Not an xdevice model file", expected=f"metadata format {_FORMAT!r}", received=str(path))
        )
    expected = definition(header["model"]).parameters(header["spec"])
    wrong = sorted(set(expected) ^ set(arrays)) or [k for k, p in expected.items() if tuple(arrays[k].shape) != p.shape]
    if wrong:
        raise ConversionError(message("The weights do not match the model's spec", received=wrong[:5]))
    return _place(header["model"], header["spec"], arrays, backend, device, dtype)


def _place(name: str, spec: dict, arrays: dict, backend: str, device: Any, dtype: str | None) -> Model:
    target = _registry.backend(backend)
    where = find(device, backend=backend)
    table = definition(name).parameters(spec)
    params = {}
    for key in table:
        value = arrays[key]
        if dtype is not None:
            value = value.astype("float64" if dtype == "float64" else "float32")
        array = target.ops.asarray(value)
        if dtype is not None and dtype != target.ops.dtype(array):
            array = target.ops.cast(array, dtype)
        params[key] = target.to_device(array, where)
    return Model(name, spec, params, backend, where)
