"""The ``Model`` object: one zoo definition, its weights, and the backend and device it runs on.

Weights are kept in the backend's own arrays, on the model's device. Saving writes
safetensors with the spec in the file's metadata; nothing is ever pickled.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

from xdevice import _registry
from xdevice._device import Device
from xdevice._discovery import find
from xdevice._errors import ConfigurationError, ConversionError, message
from xdevice.models._fit import build_call, check_input, input_dtype, literal, lossless, takes_tokens

__all__ = ["NAMES", "PRETRAINED", "Model", "build", "describe", "load", "definition"]

#: The small reference models (CIFAR/MNIST-sized), in the order they are shown.
NAMES = ("mlp", "cnn", "resnet", "lstm", "transformer")
#: The real-scale architectures: default configuration the real one, weights from a
#: transformers ``save_pretrained`` folder (``build(name, weights=folder)``).
PRETRAINED = ("resnet50", "vit", "bert", "gpt2", "llama")
_FORMAT = "xdevice.model/1"


def definition(name: str):
    """The module that defines zoo model ``name`` (DEFAULTS, parameters, apply, example_input)."""
    if name not in NAMES + PRETRAINED:
        raise ConfigurationError(
            message("Unknown model", expected="a zoo model name", received=name, choices=NAMES + PRETRAINED)
        )
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

    def __call__(self, x: Any, train: bool = False, **inputs: Any) -> Any:
        """The model's output for ``x`` (numpy or the backend's array); with ``train=True``,
        ``(output, updated buffers)`` (batch statistics are used and the buffers are not
        changed in place: assign them if you want them kept).

        ``x`` is checked first, the same way on every backend (:meth:`check_input`): rows
        of another shape or float64 data for a float32 model are refused with the fix, instead
        of one framework's raw error and another's silent cast. A cast that loses nothing is
        made (float16 or float32 data for a float64 model; float32 data for a half-precision
        one), and a Python list takes the weights' dtype.
        """
        backend, weights = _registry.backend(self.backend), self._float_dtype()
        tokens = takes_tokens(self.name)
        if not hasattr(x, "shape"):  # a list: Python floats carry no precision of their own
            import numpy as np

            x = np.asarray(x)
            if x.dtype.kind == "f" and not tokens:
                x = x.astype("float64" if weights == "float64" else "float32")
        if not tokens and lossless(input_dtype(x, self.ops), weights):
            x = self.ops.cast(self.ops.asarray(x), weights)
        self.check_input(x)
        if inputs:  # checked by name before any is converted
            self._check_inputs(inputs)
        extra = {key: backend.to_device(self.ops.asarray(value), self.device) for key, value in inputs.items()}
        with self.ops.new_tensors_on(backend.native_device(self.device)):  # masks, states: on the model's device
            return self.apply(
                self.ops, self.params, backend.to_device(self.ops.asarray(x), self.device), train=train, **extra
            )

    def _check_inputs(self, inputs: dict[str, Any]) -> None:
        """Keyword inputs besides ``x`` (``attention_mask``) are the ones the definition names."""
        known = getattr(definition(self.name), "INPUTS", ())
        unknown = sorted(set(inputs) - set(known))
        if unknown:
            raise ConfigurationError(
                message(
                    f"Zoo model {self.name!r} takes no input {unknown[0]!r}",
                    expected=f"x and {', '.join(known)}" if known else "x only",
                    received=unknown,
                    choices=list(known) or None,
                )
            )

    def generate(self, ids: Any, max_new_tokens: int = 20, attention_mask: Any = None) -> Any:
        """Greedy generation with a key/value cache (``gpt2``, ``llama``): ``ids`` followed by
        ``max_new_tokens`` new tokens, as transformers' ``generate(do_sample=False)`` gives them.
        See ``xdevice.models._generate``."""
        from xdevice.models._generate import generate

        return generate(self, ids, max_new_tokens=max_new_tokens, attention_mask=attention_mask)

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Write a transformers folder (``config.json`` and ``model.safetensors``) that the
        mirrored class's ``from_pretrained`` loads to the same outputs (real-scale models)."""
        module = definition(self.name)
        if not hasattr(module, "to_transformers"):
            raise ConfigurationError(
                message(
                    f"Zoo model {self.name!r} has no transformers counterpart",
                    expected=f"one of {list(PRETRAINED)}",
                    received=self.name,
                    fix="Model.save(path) writes xdevice's own safetensors file",
                )
            )
        from xdevice.models import _pretrained

        config, tensors = module.to_transformers(self.numpy_params(), self.spec)
        _pretrained.write(path, config, tensors)

    def check_input(self, x: Any) -> None:
        """Check that this model takes ``x`` (numpy or a backend's array): its rows' shape and
        its dtype, before any framework sees it (see ``xdevice.models._fit.check_input``).

        Raises:
            ConfigurationError: rows of another shape (the fix names the build call that fits
                them: ``models.build("mlp", inputs=64)``), float64 for a float32 model, floats
                for token ids or integers for a float model (the fix: ``x.astype(...)``).

        >>> build("mlp").check_input(build("mlp", inputs=64).example_input(2))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        xdevice._errors.ConfigurationError: x does not have the shape ... Fix: models.build("mlp", inputs=64) takes ...
        """
        check_input(x, self.name, self.spec, self.backend, self.ops, self._float_dtype())

    def fitting_build(self, row: tuple[int, ...]) -> str | None:
        """The ``models.build(...)`` call for a model that takes rows of shape ``row`` (the
        input's shape without the batch), or None when this one does or nothing simple does.

        >>> build("mlp").fitting_build((64,))
        'models.build("mlp", inputs=64)'
        >>> build("cnn").fitting_build((1, 8, 8))
        'models.build("cnn", image=[1, 8, 8])'
        """
        found = definition(self.name).fitting(self.spec, tuple(row))
        if found is None or not found.spec:
            return None
        return build_call(self.name, self.spec, found.spec, self.backend)

    def _float_dtype(self) -> str:
        return self.ops.dtype(next(iter(self.params.values()))) if self.params else "float32"

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
    name: str,
    backend: str = "numpy",
    device: Any = "cpu",
    seed: int | None = None,
    dtype: str = "float32",
    weights: str | os.PathLike | None = None,
    **spec: Any,
) -> Model:
    """A zoo model with weights drawn from ``seed``, on ``backend`` and ``device``.

    The same name, spec and seed give the same weights on every backend.

    Args:
        name: one of ``NAMES``.
        backend, device: where it runs.
        seed: the numpy seed for every weight (default: ``xdevice.seed``'s, else 0).
        dtype: the float dtype of the weights.
        weights: a transformers ``save_pretrained`` folder for a real-scale model (``PRETRAINED``):
            the spec comes from its ``config.json``, the weights from its safetensors.
        **spec: hyper-parameters overriding the definition's ``DEFAULTS``.

    >>> model = build("mlp", hidden=[16], seed=0)
    >>> model(model.example_input(2)).shape
    (2, 10)
    """
    module = definition(name)
    if weights is not None:
        return _from_transformers(name, module, weights, backend, device, dtype, spec)
    unknown = sorted(set(spec) - set(module.DEFAULTS))
    if unknown:
        raise ConfigurationError(
            message(f"Unknown hyper-parameter for {name!r}", received=unknown[0], choices=sorted(module.DEFAULTS))
        )
    full = {**module.DEFAULTS, **{k: list(v) if isinstance(v, tuple) else v for k, v in spec.items()}}
    if hasattr(module, "check"):  # what would build a wrong model silently (image=[8, 8]: 8 channels)
        module.check(full)
    from xdevice.models._init import drawn

    if seed is None:
        from xdevice._seed import default_seed

        seed = default_seed()
    # each array placed as it is drawn: numpy never holds the whole model beside the backend's copy
    return _place(name, full, drawn(module.parameters(full), seed), backend, device, dtype)


def _from_transformers(name: str, module: Any, path: Any, backend: str, device: Any, dtype: str, spec: dict) -> Model:
    if not hasattr(module, "params_from_transformers"):
        raise ConfigurationError(
            message(
                f"Zoo model {name!r} loads no transformers checkpoint",
                expected=f"one of {list(PRETRAINED)}",
                received=name,
                fix="models.load(path) reads a file written by Model.save",
            )
        )
    from xdevice.models import _pretrained

    config, tensors = _pretrained.read(path)
    found = config.get("architectures") or [config.get("model_type")]
    if module.TRANSFORMERS_CLASS not in found and config.get("model_type") != module.MODEL_TYPE:
        raise ConversionError(
            message(
                f"The folder does not hold the architecture {name!r} mirrors",
                expected=f"{module.TRANSFORMERS_CLASS} (model_type {module.MODEL_TYPE!r})",
                received=f"{found} (model_type {config.get('model_type')!r})",
                choices=[each for each in PRETRAINED if definition(each).MODEL_TYPE == config.get("model_type")]
                or None,
            )
        )
    found_spec = module.spec_from_config(config)
    # options config.json does not hold (bert's output, remat) may be given; its sizes may not
    clashing, unknown = sorted(set(spec) & set(found_spec)), sorted(set(spec) - set(module.DEFAULTS))
    if clashing or unknown:
        raise ConfigurationError(
            message(
                "With weights=, the configuration comes from the folder's config.json"
                if clashing
                else f"Unknown hyper-parameter for {name!r}",
                received=clashing or unknown,
                choices=sorted(set(module.DEFAULTS) - set(found_spec)) or None,
                fix="leave those out, or edit config.json" if clashing else None,
            )
        )
    full = {**module.DEFAULTS, **found_spec, **spec}
    if hasattr(module, "check"):
        module.check(full)
    arrays = module.params_from_transformers(tensors, full)
    table = module.parameters(full)
    missing = [key for key in table if key not in arrays]
    wrong = [key for key in table if key in arrays and tuple(arrays[key].shape) != table[key].shape]
    if missing or wrong:
        raise ConversionError(
            message(
                "The checkpoint's tensors do not match its config.json",
                expected=f"{len(table)} tensors of the shapes the config implies",
                received=f"missing {missing[:3]}, wrong shape {wrong[:3]}",
            )
        )
    return _place(name, full, arrays, backend, device, dtype)


def describe(name: str | None = None) -> str:
    """Zoo model ``name`` (every one without it) for people: what it is, its input and
    output, and each hyper-parameter with its default and meaning, as ``models.build`` takes
    them. ``xdevice models`` prints it.

    >>> print(describe("mlp"))  # doctest: +ELLIPSIS
    mlp: a multilayer perceptron, 784-512-512-10 with ReLU (MNIST-sized).
      input:  float[rows, inputs]: one feature vector per row (default float32[rows, 784])
    ...
        inputs   784         features per row (64 for 8x8 images flattened)
    ...
    """
    if name is None:
        return "\n\n".join(describe(each) for each in NAMES + PRETRAINED)
    module = definition(name)
    import numpy as np

    summary = " ".join((module.__doc__ or name).split("\n\n")[0].split()).replace("``", "")
    example = module.example_input(module.DEFAULTS, 1, np.random.default_rng(0))
    kind = "float32" if example.dtype.kind == "f" else example.dtype.name
    default = f"{kind}[rows, {', '.join(map(str, example.shape[1:]))}]"
    values = {key: literal(value) for key, value in module.DEFAULTS.items()}
    key_width, value_width = max(map(len, values)), max(map(len, values.values()))
    lines = [
        f"{summary.rstrip('.')}.",
        f"  input:  {module.INPUT} (default {default})",
        f"  output: {module.OUTPUT}",
        f'  hyper-parameters (models.build("{name}", name=value, ...)):',
        *(f"    {key:<{key_width}}  {values[key]:<{value_width}}  {module.HYPERPARAMETERS[key]}" for key in values),
    ]
    return "\n".join(lines)


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


def _place(
    name: str, spec: dict, arrays: dict | Iterator[tuple[str, Any]], backend: str, device: Any, dtype: str | None
) -> Model:
    """The model of ``arrays`` on ``backend`` and ``device``: numpy arrays by name (copied), or
    freshly drawn ``(name, array)`` pairs in the table's order, each placed (on the CPU, PyTorch
    keeps the array itself) and let go of before the next is drawn."""
    target = _registry.backend(backend)
    where = find(device, backend=backend)
    table = definition(name).parameters(spec)
    given = isinstance(arrays, dict)  # the caller's arrays are copied; drawn ones are the model's own
    pairs = ((key, arrays[key]) for key in table) if isinstance(arrays, dict) else arrays
    params = {}
    for key, value in pairs:
        if dtype is not None:
            value = value.astype("float64" if dtype == "float64" else "float32", copy=given)
        array = target.ops.asarray(value)
        if dtype is not None and dtype != target.ops.dtype(array):
            array = target.ops.cast(array, dtype)
        params[key] = target.to_device(array, where)
    return Model(name, spec, params, backend, where)
