"""What a trainer trains, whatever it was written in: parameters, buffers and a forward pass.

A *program* is the one shape every model takes inside the trainer: trainable ``params`` and
``buffers`` (dicts of the backend's arrays on the training device), a pure
``forward(params, buffers, x, train) -> (outputs, buffers)``, and ``write_back`` to put trained
values into the user's own object. Adapters:

- a zoo :class:`~xdevice.models.Model` (any backend); trained in place;
- a ``torch.nn.Module`` (``torch.func.functional_call``; buffers such as batch-norm
  statistics update as in ``module.train()``); trained in place;
- a Keras model or ``tf.Module``: its ``trainable_variables`` are the params, assigned after
  each step; called with ``training=`` when it takes it;
- a JAX ``(apply, params)`` pair, ``params`` a (possibly nested) dict: a new pair comes back;
- :func:`staged`: a sequential model split layer-wise over devices, one program per stage.

``precision="bfloat16"`` casts params and inputs to bfloat16 inside ``forward`` and the
outputs back to float32, so gradients reach the float32 master weights.
"""

from __future__ import annotations

import inspect
from typing import Any

from xdevice import _registry
from xdevice._device import Device
from xdevice._discovery import find
from xdevice._errors import ConfigurationError, message

__all__ = ["Program", "program", "staged"]

PRECISIONS = ("float32", "bfloat16")


class Program:
    """Base: a zoo-style forward over ``backend``'s op set."""

    compiles_whole = True  # the whole training step compiles as one program (jax.jit, tf.function)

    def __init__(self, backend: str, device: Device, params: dict, buffers: dict):
        self.backend = _registry.backend(backend)
        self.ops = self.backend.ops
        self.device, self.params, self.buffers = device, params, buffers
        self.precision = "float32"

    def forward(self, params: dict, buffers: dict, x: Any, train: bool) -> tuple[Any, dict]:
        if self.precision == "bfloat16":
            params = {k: self._low(v) for k, v in params.items()}
            x = self._low(x)
        out, buffers = self.run(params, buffers, x, train)
        if self.precision == "bfloat16":
            out = self.ops.cast(out, "float32")
        return out, buffers

    def _low(self, value: Any) -> Any:
        return self.ops.cast(value, "bfloat16") if self.ops.dtype(value) == "float32" else value

    def run(self, params: dict, buffers: dict, x: Any, train: bool) -> tuple[Any, dict]:
        raise NotImplementedError

    def write_back(self) -> None:
        """Put ``self.params`` and ``self.buffers`` into the user's object."""

    def device_for(self, name: str) -> Device | None:
        """Where the array called ``name`` (a param, buffer or optimizer slot ``slot/param``)
        lives; None: where it was made (an uncommitted scalar such as the step count)."""
        return self.device

    def result(self) -> Any:
        """The trained object to hand back (the user's own, or a new JAX pair)."""
        raise NotImplementedError

    def set_precision(self, precision: str) -> None:
        if precision not in PRECISIONS:
            raise ConfigurationError(message("Unknown precision", received=precision, choices=PRECISIONS))
        if precision == "bfloat16" and self.backend.name == "numpy":
            raise ConfigurationError(message(
                "The numpy reference backend has no bfloat16 compute", received="precision='bfloat16'",
                choices=["torch", "jax", "tensorflow"], fix="train on another backend, or use float32"))
        self.precision = precision


class _Zoo(Program):
    def __init__(self, model, device: Device):
        if device != model.device:
            model.params, model.device = model.to(device=device).params, device
        super().__init__(model.backend, device, {k: model.params[k] for k in model.trainable},
                         {k: model.params[k] for k in model.buffers})
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


class _Torch(Program):
    def __init__(self, module, device: Device | None):
        if device is not None:
            module.to(_registry.backend("torch").native_device(device))
        first = next(iter(module.parameters()), None)
        where = find(first.device if first is not None else "cpu", backend="torch")
        super().__init__("torch", where, {k: v.detach() for k, v in module.named_parameters()},
                         dict(module.named_buffers()))
        self.module = module

    def run(self, params, buffers, x, train):
        import torch

        self.module.train(train)
        if self.precision == "bfloat16":  # buffers too (batch-norm statistics meet bf16 inputs)
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
        import torch

        with torch.no_grad():
            for name, value in self.module.named_parameters():
                value.copy_(self.params[name])

    def result(self) -> Any:
        return self.module


class _TensorFlow(Program):
    def __init__(self, module, device: Device | None):
        variables = _tf_variables(module)
        if not variables:
            raise ConfigurationError(message("The TensorFlow model has no trainable variables",
                                             fix="build it first (call it once on an example batch)"))
        where = find(variables[0].device or "cpu", backend="tensorflow")
        if device is not None and device != where:  # TF places a variable when it is made, once
            raise ConfigurationError(message(
                "The TensorFlow model's variables are not on the device asked for", expected=str(device),
                received=str(where), fix=f"build the model under tf.device('{device}'), or leave device= out"))
        params = {_variable_name(v, i): v for i, v in enumerate(variables)}
        super().__init__("tensorflow", where, params, {})
        self.module, self.variables = module, variables
        self.takes_training = "training" in inspect.signature(module.__call__).parameters or \
            hasattr(module, "compute_output_shape")  # a Keras layer or model

    def run(self, params, buffers, x, train):
        out = self.module(x, training=train) if self.takes_training else self.module(x)
        return out, buffers

    def write_back(self) -> None:
        for name, variable in zip(self.params, self.variables):
            if self.params[name] is not variable:
                variable.assign(self.params[name])
        self.params = dict(zip(self.params, self.variables))

    def set_precision(self, precision: str) -> None:
        if precision == "bfloat16":
            raise ConfigurationError(message(
                "bfloat16 for a Keras/tf.Module model is set when the model is built",
                received="precision='bfloat16'",
                fix="build it under keras.mixed_precision.set_global_policy('mixed_bfloat16') and pass "
                    "precision='float32', or train a zoo model"))
        super().set_precision(precision)

    def result(self) -> Any:
        return self.module


class _Jax(Program):
    def __init__(self, apply, params: dict, device: Device | None):
        import jax

        flat = _flatten(params)
        first = next(iter(jax.tree_util.tree_leaves(params)))  # numpy leaves: JAX's default device
        where = device or find(first.devices().pop() if hasattr(first, "devices") else jax.local_devices()[0],
                               backend="jax")
        backend = _registry.backend("jax")
        super().__init__("jax", where, {k: backend.to_device(backend.ops.asarray(v), where)
                                        for k, v in flat.items()}, {})
        self.apply, self.nested = apply, _is_nested(params)

    def run(self, params, buffers, x, train):
        return self.apply(_unflatten(params) if self.nested else params, x), buffers

    def result(self) -> Any:
        return self.apply, _unflatten(self.params) if self.nested else dict(self.params)


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
            raise ConfigurationError(message("Every stage must come from the same framework",
                                             received=sorted(names)))
        self.stages = stages
        super().__init__(stages[0].backend.name, stages[0].device,
                         {f"stage{i}/{k}": v for i, p in enumerate(stages) for k, v in p.params.items()},
                         {f"stage{i}/{k}": v for i, p in enumerate(stages) for k, v in p.buffers.items()})
        self.forwards, self.whole = {}, None

    def _part(self, tree: dict, i: int) -> dict:
        prefix = f"stage{i}/"
        return {k[len(prefix):]: v for k, v in tree.items() if k.startswith(prefix)}

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
    a ``torch.nn.Sequential`` (split into contiguous runs of layers with about equal parameter
    counts), or a list of stage models of one framework (torch modules, JAX ``(apply, params)``
    pairs, Keras models / ``tf.Module`` s already built on their devices)."""
    split_from = None
    if not isinstance(model, list):
        if _kind(model) != "torch" or not _is_sequential(model):
            raise ConfigurationError(message(
                "A layer-wise split needs a sequential model", received=type(model).__qualname__,
                expected="a torch.nn.Sequential, or a list of stages (torch modules, JAX (apply, params) "
                         "pairs, or Keras models built on their devices)",
                fix="pass the model's stages as a list, one per device"))
        split_from, model = model, _balanced(model, len(devices))
    if len(model) != len(devices):
        raise ConfigurationError(message("One device per stage", expected=f"{len(model)} devices",
                                         received=f"{len(devices)}: {list(devices)}"))
    programs = []
    for i, (stage, where) in enumerate(zip(model, devices)):
        try:
            programs.append(program(stage, where))
        except ConfigurationError as error:
            raise ConfigurationError(f"Stage {i}: {error}") from error
    result = _Stages(programs)
    if split_from is not None:  # the user's Sequential, now across devices, still runs as one
        for stage in result.stages:
            _move_inputs(stage.module[0], stage.backend.native_device(stage.device))
        result.whole = split_from
    return result


def _move_inputs(layer: Any, device: Any) -> None:
    old = getattr(layer, "_xdevice_moves_inputs", None)
    if old is not None:  # split again: the new device replaces the old one
        old.remove()
    layer._xdevice_moves_inputs = layer.register_forward_pre_hook(
        lambda module, args: tuple(a.to(device) for a in args))


def _is_sequential(module: Any) -> bool:
    import torch

    return isinstance(module, torch.nn.Sequential)


def _balanced(sequential: Any, count: int) -> list:
    """``count`` contiguous runs of ``sequential``'s layers, each cut where the running parameter
    count comes nearest ``i/count`` of the total (the layers stay the user's own modules)."""
    import torch

    layers = list(sequential)
    if len(layers) < count:
        raise ConfigurationError(message("More stages than layers", expected=f"at most {len(layers)} stages",
                                         received=count))
    sizes = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    before = [sum(sizes[:i]) for i in range(len(layers) + 1)]  # parameters before layer i
    cuts = [0]
    for stage in range(1, count):
        first, last = cuts[-1] + 1, len(layers) - (count - stage)  # each stage keeps a layer
        target = before[-1] * stage / count  # nearest cut; on a tie the later one (a ReLU stays with its layer)
        cuts.append(min(range(first, last + 1), key=lambda i: (abs(before[i] - target), -i)))
    bounds = [*cuts, len(layers)]
    return [torch.nn.Sequential(*layers[a:b]) for a, b in zip(bounds, bounds[1:])]


def program(model: Any, device: Any = None) -> Program:
    """The :class:`Program` for ``model`` (zoo model, torch module, Keras/tf.Module, JAX pair)."""
    from xdevice.models import Model

    if isinstance(model, Model):
        return _Zoo(model, find(device, backend=model.backend) if device is not None else model.device)
    kind = _kind(model)
    where = None if device is None else find(device, backend=kind)
    if kind == "torch":
        return _Torch(model, where)
    if kind == "tensorflow":
        return _TensorFlow(model, where)
    if kind == "jax":
        return _Jax(model[0], model[1], where)
    raise ConfigurationError(message(
        "Cannot train this object", received=type(model).__qualname__,
        expected="a zoo model, a torch.nn.Module, a keras.Model / tf.Module, or a JAX (apply, params) pair"))


def _kind(model: Any) -> str | None:
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and isinstance(model, torch.nn.Module):
        return "torch"
    tf = sys.modules.get("tensorflow")
    if tf is not None and (isinstance(model, tf.Module) or hasattr(model, "trainable_variables")):
        return "tensorflow"
    if isinstance(model, tuple) and len(model) == 2 and callable(model[0]) and isinstance(model[1], dict):
        return "jax"
    return None


def _tf_variables(module: Any) -> list:
    """The ``tf.Variable`` behind each trainable variable (Keras 3 wraps them in its own)."""
    return [getattr(v, "value", v) if not _is_tf_variable(v) else v for v in module.trainable_variables]


def _is_tf_variable(value: Any) -> bool:
    import tensorflow as tf

    return isinstance(value, tf.Variable)


def _variable_name(variable: Any, index: int) -> str:
    name = getattr(variable, "path", None) or variable.name
    return f"{index:03d}:{name.split(':')[0]}"  # names repeat across Keras layers; the index does not


def _is_nested(params: dict) -> bool:
    return any(isinstance(v, dict) for v in params.values())


def _flatten(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "/"))
        else:
            flat[name] = value
    return flat


def _unflatten(flat: dict) -> dict:
    tree: dict = {}
    for name, value in flat.items():
        *path, leaf = name.split("/")
        node = tree
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree
