"""PyTorch models in the trainer: a ``torch.nn.Module`` as a program, and a
``torch.nn.Sequential`` split into stages. The trainer loads this module through the
registry; the backend never imports it.

A module trains in place through ``torch.func.functional_call``: its parameters are the
program's params and its buffers (batch-norm statistics) update as in ``module.train()``.
Under ``strategy="fsdp"`` across processes its parameters become this rank's shards.

:func:`output_shape` is the trainer's shape evaluation: a forward pass on fake tensors
(``torch._subclasses.FakeTensorMode``, what ``torch.export`` traces on), which computes nothing
and holds no array of the weights' size, split or whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.tensor import DTensor

from xdevice._device import Device
from xdevice._discovery import find
from xdevice._errors import ConfigurationError, message
from xdevice.backends.training import Program

__all__ = ["ModuleProgram", "output_shape", "program", "split"]


class ModuleProgram(Program):
    def __init__(self, backend: Any, module: torch.nn.Module, device: Device | None):
        if device is not None:
            module.to(backend.native_device(device))
        first = next(iter(module.parameters()), None)
        where = find(first.device if first is not None else "cpu", backend="torch")
        super().__init__(
            "torch", where, {k: v.detach() for k, v in module.named_parameters()}, dict(module.named_buffers())
        )
        self.module = module

    def run(self, params, buffers, x, train):
        self.module.train(train)
        if self.precision != "float32":  # buffers too (batch-norm statistics meet half inputs)
            buffers_used = {k: self._low(v) for k, v in buffers.items()}
        else:
            buffers_used = buffers
        out = torch.func.functional_call(self.module, {**params, **buffers_used}, (x,))
        if buffers_used is not buffers:
            with torch.no_grad():
                for key, value in buffers_used.items():
                    if value is not buffers[key]:
                        buffers[key].copy_(value)
        return out, buffers

    def write_back(self) -> None:
        """The trained values into the module's parameters; under ``strategy="fsdp"`` across
        processes they are this rank's shards (DTensors), and the module holds the shards
        until ``trainer.gather()`` writes the whole values back."""
        with torch.no_grad():
            for name, value in list(self.module.named_parameters()):
                new = self.params[name]
                if isinstance(new, DTensor) == isinstance(value, DTensor):
                    value.copy_(new)
                else:  # shards for whole values, or back: the parameter itself is replaced
                    owner, _, leaf = name.rpartition(".")
                    replaced = torch.nn.Parameter(new.detach().clone(), requires_grad=value.requires_grad)
                    self.module.get_submodule(owner).register_parameter(leaf, replaced)

    def result(self) -> Any:
        return self.module


def program(backend: Any, model: Any, device: Device | None) -> Program:
    """The program of a ``torch.nn.Module`` (moved to ``device`` when one is given)."""
    return ModuleProgram(backend, model, device)


def output_shape(backend: Any, fn: Callable[..., Any], *args: Any) -> tuple[int, ...]:
    """The shape of the tensor ``fn(*args)`` returns (``args``: tensors and dicts of them), from
    ``fn`` run on fake tensors of the arguments' whole shapes, dtypes and devices: torch's shape
    propagation, with no arithmetic and no memory for the arguments. A DTensor (a shard, or a
    tensor-parallel split) counts as the whole tensor it is part of, so nothing is gathered.
    ``fn`` runs on the real arguments instead where its output's shape depends on their values
    (a ``.item()``, a ``nonzero``), an op has no fake kernel, or tracing fails for any other
    reason (a user's module doing something fake tensors cannot follow).

    >>> import torch
    >>> output_shape(None, lambda w, x: x @ w, torch.ones(4, 3), torch.ones(2, 4))
    (2, 3)
    """
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):  # constants made inside fn stay real
            out = fn(*(_fake(a) for a in args))
    except Exception:  # noqa: BLE001 - any op fake tensors cannot trace: the real pass says what is wrong, if anything
        out = fn(*args)
    return tuple(int(n) for n in out.shape)


def _fake(tree: Any) -> Any:
    """``tree``'s tensors as uninitialised ones of their whole shapes (fake, inside the mode)."""
    if isinstance(tree, dict):
        return {k: _fake(v) for k, v in tree.items()}
    if isinstance(tree, torch.Tensor):
        return torch.empty(tuple(tree.shape), dtype=tree.dtype, device=tree.device)
    return tree


def split(backend: Any, model: Any, devices: list[Device]) -> list[Any]:
    """A ``torch.nn.Sequential`` as ``len(devices)`` contiguous runs of its layers, each cut
    where the running parameter count comes nearest ``i/len(devices)`` of the total (the
    layers stay the user's own modules). The first layer of each run moves its input to that
    run's device, so the user's Sequential still runs as one module afterwards."""
    if not isinstance(model, torch.nn.Sequential):
        raise ConfigurationError(
            message(
                "A layer-wise split needs a sequential model",
                received=type(model).__qualname__,
                expected="a torch.nn.Sequential, or a list of stages (torch modules, JAX (apply, params) "
                "pairs, or Keras models built on their devices)",
                fix="pass the model's stages as a list, one per device",
            )
        )
    stages = _balanced(model, len(devices))
    for stage, where in zip(stages, devices):
        _move_inputs(stage[0], backend.native_device(where))
    return stages


def _move_inputs(layer: Any, device: Any) -> None:
    old = getattr(layer, "_xdevice_moves_inputs", None)
    if old is not None:  # split again: the new device replaces the old one
        old.remove()
    layer._xdevice_moves_inputs = layer.register_forward_pre_hook(
        lambda module, args: tuple(a.to(device) for a in args)
    )


def _balanced(sequential: torch.nn.Sequential, count: int) -> list[torch.nn.Sequential]:
    layers = list(sequential)
    if len(layers) < count:
        raise ConfigurationError(
            message("More stages than layers", expected=f"at most {len(layers)} stages", received=count)
        )
    sizes = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    before = [sum(sizes[:i]) for i in range(len(layers) + 1)]  # parameters before layer i
    cuts = [0]
    for stage in range(1, count):
        first, last = cuts[-1] + 1, len(layers) - (count - stage)  # each stage keeps a layer
        target = before[-1] * stage / count  # nearest cut; on a tie the later one (a ReLU stays with its layer)
        cuts.append(min(range(first, last + 1), key=lambda i: (abs(before[i] - target), -i)))
    bounds = [*cuts, len(layers)]
    return [torch.nn.Sequential(*layers[a:b]) for a, b in zip(bounds, bounds[1:])]
