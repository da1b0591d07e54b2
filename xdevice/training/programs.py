"""What a trainer trains, whatever it was written in: one :class:`Program` per model.

A program (``xdevice.backends.training.Program``) holds trainable ``params`` and ``buffers``,
a pure ``forward(params, buffers, x, train) -> (outputs, buffers)``, and ``write_back`` to put
trained values into the user's own object. Here, in core:

- a zoo :class:`~xdevice.models.Model` (any backend), trained in place;
- an imported ONNX model (``from_onnx``), its weights trained in place;
- :func:`staged`: a sequential model split layer-wise over devices, one program per stage.

Every other model is the framework's own, and its program comes from that backend's
``training.py``, loaded through the registry for the backend that owns the model: a
``torch.nn.Module``, a Keras model or ``tf.Module``, a JAX ``(apply, params)`` pair.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from xdevice import _registry
from xdevice._device import Device
from xdevice._discovery import find
from xdevice._errors import ConfigurationError, message
from xdevice.backends.training import PRECISIONS, Program

__all__ = ["PRECISIONS", "Program", "program", "staged"]

_TRAINABLE = (
    "a zoo model, a model imported with from_onnx, a torch.nn.Module, a keras.Model / tf.Module, "
    "a flax.nnx or equinox module, or a JAX (apply, params) pair with any pytree of params"
)


class _Zoo(Program):
    fused_by_parts = True  # the transformers' apply takes attn.qkv as (width, 3, width) too (models/_attention.py)

    def __init__(self, model, device: Device):
        if device != model.device:
            model.params, model.device = model.to(device=device).params, device
        super().__init__(
            model.backend,
            device,
            {k: model.params[k] for k in model.trainable},
            {k: model.params[k] for k in model.buffers},
        )
        self.model = model

    def run(self, params, buffers, x, train):
        if not train:
            return self.model.apply(self.ops, {**params, **buffers}, x, train=False), buffers
        out, updates = self.model.apply(self.ops, {**params, **buffers}, x, train=True)
        return out, {**buffers, **updates}

    def write_back(self) -> None:
        self.model.params = {**self.params, **self.buffers}

    def result(self) -> Any:
        return self.model


class _Stages(Program):
    """A sequential model split layer-wise: stage ``i`` (its params, its forward) on device ``i``.

    The activations cross to the next stage's device between stages (a differentiable copy in
    every framework), and the outputs come back to the first device, where the batch and the
    labels are. Each stage's forward is compiled on its own (``jax.jit`` cannot compile one
    program over arrays committed to different devices); the whole step runs eagerly.
    Params are named ``stage<i>/<name>``.
    """

    compiles_whole = False

    def __init__(self, stages: list[Program]):
        names = {p.backend.name for p in stages}
        if len(names) != 1:
            raise ConfigurationError(message("Every stage must come from the same framework", received=sorted(names)))
        self.stages = stages
        super().__init__(
            stages[0].backend.name,
            stages[0].device,
            {f"stage{i}/{k}": v for i, p in enumerate(stages) for k, v in p.params.items()},
            {f"stage{i}/{k}": v for i, p in enumerate(stages) for k, v in p.buffers.items()},
        )
        self.forwards: dict[tuple[int, bool], Callable[..., Any]] = {}  # (stage, train) -> its compiled forward
        self.whole = None

    def _part(self, tree: dict, i: int) -> dict:
        prefix = f"stage{i}/"
        return {k[len(prefix) :]: v for k, v in tree.items() if k.startswith(prefix)}

    def run(self, params, buffers, x, train):
        new_buffers = {}
        for i, stage in enumerate(self.stages):
            if (i, train) not in self.forwards:
                self.forwards[i, train] = self.backend.jit(lambda p, b, x, s=stage, t=train: s.run(p, b, x, t))
            x = self.backend.to_device(x, stage.device)
            x, b = self.forwards[i, train](self._part(params, i), self._part(buffers, i), x)
            new_buffers.update({f"stage{i}/{k}": v for k, v in b.items()})
        return self.backend.to_device(x, self.device), new_buffers

    def device_for(self, name: str) -> Device | None:
        for i, stage in enumerate(self.stages):
            if f"stage{i}/" in name:
                return stage.device
        return None

    def write_back(self) -> None:
        for i, stage in enumerate(self.stages):
            stage.params, stage.buffers = self._part(self.params, i), self._part(self.buffers, i)
            stage.write_back()
        self.params = {f"stage{i}/{k}": v for i, p in enumerate(self.stages) for k, v in p.params.items()}

    def result(self) -> Any:
        return self.whole if self.whole is not None else [stage.result() for stage in self.stages]


def staged(model: Any, devices: list[Any]) -> Program:
    """The :class:`_Stages` program of a sequential ``model`` over ``devices`` (one stage each):
    a model its backend's ``training.split`` can cut (a ``torch.nn.Sequential``, into
    contiguous runs of layers with about equal parameter counts), or a list of stage models
    of one framework (torch modules, JAX ``(apply, params)`` pairs, Keras models /
    ``tf.Module`` s already built on their devices)."""
    whole = None
    if not isinstance(model, list):
        backend = _owner(model)
        cut = getattr(_registry.extension(backend.name, "training"), "split", None)
        if cut is None:
            raise ConfigurationError(
                message(
                    "A layer-wise split needs a sequential model",
                    received=type(model).__qualname__,
                    expected="a torch.nn.Sequential, or a list of stages (torch modules, JAX (apply, params) "
                    "pairs, or Keras models built on their devices)",
                    fix="pass the model's stages as a list, one per device",
                )
            )
        whole, model = model, cut(backend, model, [find(d, backend=backend.name) for d in devices])
    if len(model) != len(devices):
        raise ConfigurationError(
            message(
                "One device per stage", expected=f"{len(model)} devices", received=f"{len(devices)}: {list(devices)}"
            )
        )
    programs = []
    for i, (stage, where) in enumerate(zip(model, devices)):
        try:
            programs.append(program(stage, where))
        except ConfigurationError as error:
            raise ConfigurationError(f"Stage {i}: {error}") from error
    result = _Stages(programs)
    result.whole = whole  # the user's model, now across devices, still runs as one
    return result


class _Imported(Program):
    """An imported ONNX model (``from_onnx``): its weights (``params``) trained, its constants
    fixed; the graph's first output is the prediction."""

    def __init__(self, model, device: Device | None):
        if device is not None and device != model.device:
            raise ConfigurationError(
                message(
                    "An imported model trains on the device it was imported to",
                    expected=str(model.device),
                    received=str(device),
                    fix=f"from_onnx(..., backend={model.backend.name!r}, device={str(device)!r})",
                )
            )
        super().__init__(model.backend.name, model.device, dict(model.params), {})
        self.model = model

    def run(self, params, buffers, x, train):
        return self.model.apply(params, *(x if isinstance(x, (tuple, list)) else (x,)))[0], buffers

    def write_back(self) -> None:
        self.model.params = dict(self.params)

    def result(self) -> Any:
        return self.model


def program(model: Any, device: Any = None) -> Program:
    """The :class:`Program` for ``model`` (zoo model, imported ONNX model, torch module,
    Keras/tf.Module, JAX pair)."""
    from xdevice.models import Model

    if isinstance(model, Model):
        return _Zoo(model, find(device, backend=model.backend) if device is not None else model.device)
    imported = sys.modules.get("xdevice.converters.importer.model")  # not loaded: no model can be one
    if imported is not None and isinstance(model, imported.ImportedModel):
        return _Imported(model, None if device is None else find(device, backend=model.backend.name))
    backend = _owner(model)
    adapters = _registry.extension(backend.name, "training")
    if adapters is None:
        raise ConfigurationError(
            message(
                f"{backend.title} models other than the zoo's cannot be trained",
                received=type(model).__qualname__,
                expected=_TRAINABLE,
            )
        )
    return adapters.program(backend, model, None if device is None else find(device, backend=backend.name))


def _owner(model: Any):
    found = _registry.owner(model)
    if found is None or found[1] != "model":
        raise ConfigurationError(
            message(
                "Cannot train this object",
                received=type(model).__qualname__,
                expected=_TRAINABLE,
                choices=_registry.accepted("model"),
            )
        )
    return found[0]
