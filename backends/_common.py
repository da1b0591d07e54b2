"""Logic more than one backend needs, written once; each backend supplies only its hooks."""

from __future__ import annotations

import ctypes
from typing import Any

from xdevice._device import Device
from xdevice._errors import ConversionError, message
from xdevice._types import Applied, Config, How, MemoryStats

__all__ = [
    "dlpack_data_pointer",
    "memory_not_applied",
    "cpu_only_stats",
    "map_leaves",
    "ml_dtype",
    "is_numpy_bfloat16",
    "flat_outputs",
    "output_names",
    "record_output_names",
    "OUTPUT_NAMES",
    "as_function",
    "exporter_failed",
    "Inputs",
    "call_with",
]

#: where a backend's export_onnx leaves the source's output names for core to apply
OUTPUT_NAMES = "xdevice:output_names"


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def dlpack_data_pointer(capsule: Any) -> int:
    """The first element's address in an unconsumed DLPack capsule (DLManagedTensor).

    For frameworks with no public pointer API (TensorFlow): the capsule is only read,
    never consumed, and frees itself as usual.
    """
    tensor = _DLTensor.from_address(_get_pointer(capsule, b"dltensor"))
    return int(tensor.data or 0) + int(tensor.byte_offset)


def memory_not_applied(backend: str, config: Config, how: How, why: str) -> list[Applied]:
    """One report row per requested memory setting that did not apply, saying why."""
    return [
        Applied(backend, setting, getattr(config, setting), how, why)
        for setting in ("memory_growth", "memory_limit")
        if getattr(config, setting) is not None
    ]


def cpu_only_stats(backend: str, device: Device) -> MemoryStats:
    """CPU memory is the process's, not a framework allocator's: nothing to count."""
    return MemoryStats(device, backend, in_use=None, peak=None, limit=None)


def map_leaves(fn: Any, tree: Any) -> Any:
    """``tree`` (dicts, lists, tuples) with ``fn`` applied to every other value in it."""
    if isinstance(tree, dict):
        return {key: map_leaves(fn, value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(map_leaves(fn, value) for value in tree)
    return fn(tree)


class Inputs(tuple):
    """Example inputs as a model takes them, flat: a tuple of the arrays (in order), which
    also knows their ``names`` and how to ``rebuild`` the structure they came in.

    Positional inputs (one array, or a tuple or list of them) are named ``input`` /
    ``input_<i>``; named inputs (a dict, as Hugging Face models take keyword arguments and
    Keras and JAX models one dict) are named by their key, nested values by their path
    (``"image.0"``). Each framework decides what a dict means: PyTorch passes it as keyword
    arguments, Keras and JAX as one argument.

    >>> inputs = Inputs.of({"ids": 1, "mask": 2})
    >>> tuple(inputs), inputs.names, inputs.rebuild([3, 4])
    ((1, 2), ('ids', 'mask'), {'ids': 3, 'mask': 4})
    """

    names: tuple[str, ...]
    structure: Any  # the given structure with each leaf replaced by its position

    @classmethod
    def of(cls, given: Any, convert: Any = None) -> Inputs:
        """``given`` flattened; ``convert`` (e.g. to numpy) is applied to each leaf."""
        leaves: list = []
        names: list[str] = []

        def walk(value: Any, path: str) -> Any:
            if isinstance(value, dict):
                return {k: walk(v, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return type(value)(walk(v, f"{path}.{i}" if path else str(i)) for i, v in enumerate(value))
            leaves.append(convert(value) if convert else value)
            names.append(path)
            return len(leaves) - 1

        if isinstance(given, dict):
            structure = walk(given, "")
        else:
            items = tuple(given) if isinstance(given, (tuple, list)) else (given,)
            structure = tuple(walk(v, "input" if len(items) == 1 else f"input_{i}") for i, v in enumerate(items))
        made = cls(leaves)
        made.names, made.structure = tuple(names), structure
        return made

    @property
    def named(self) -> bool:
        """Whether the inputs came as a dict (keyword or dict inputs)."""
        return isinstance(self.structure, dict)

    def rebuild(self, leaves: Any) -> Any:
        """The structure the inputs came in, holding ``leaves`` (same order) instead."""
        leaves = list(leaves)
        return map_leaves(lambda position: leaves[position], self.structure)

    def replaced(self, leaves: Any) -> Inputs:
        """The same names and structure over other arrays (another batch, say)."""
        made = type(self)(leaves)
        made.names, made.structure = self.names, self.structure
        return made


def ml_dtype(name: str = "bfloat16") -> Any:
    """numpy's dtype for ``name`` (bfloat16, float8, int4...) from ``ml_dtypes`` (installed with
    JAX and TensorFlow)."""
    try:
        import ml_dtypes
    except ImportError as error:
        raise ConversionError(
            message(
                f"numpy has no {name} type without ml_dtypes", received=f"a {name} array", fix="pip install ml_dtypes"
            )
        ) from error
    return getattr(ml_dtypes, name)


def is_numpy_bfloat16(x: Any) -> bool:
    """Whether ``x`` is a numpy array of ml_dtypes' bfloat16 (no framework import needed)."""
    dtype = getattr(x, "dtype", None)
    return type(x).__module__ == "numpy" and getattr(dtype, "name", "") == "bfloat16"


# -- ONNX export: what every backend's export.py needs ------------------------------------------


def flat_outputs(y: Any) -> list[Any]:
    """A model's outputs as one flat list, in the order the ONNX graph lists them: an array,
    or tuples, lists and dicts of them (a dict in sorted key order, as ``tf.nest`` and JAX
    trees flatten it; ``torch.export`` would keep insertion order)."""
    if isinstance(y, dict):
        return [leaf for key in sorted(y) for leaf in flat_outputs(y[key])]
    if isinstance(y, (tuple, list)):
        return [leaf for item in y for leaf in flat_outputs(item)]
    return [y]


def output_names(y: Any) -> list[str]:
    """A name for each of ``flat_outputs(y)``: ``output`` / ``output_<i>`` for positional
    outputs, the key path for a dict's (``"logits"``, ``"hidden.0"``)."""
    named: list[tuple[str, bool]] = []

    def walk(value: Any, path: str, keyed: bool) -> None:
        if isinstance(value, dict):
            for key in sorted(value):
                walk(value[key], f"{path}.{key}" if path else str(key), True)
        elif isinstance(value, (tuple, list)):
            for i, item in enumerate(value):
                walk(item, f"{path}.{i}" if path else str(i), keyed)
        else:
            named.append((path, keyed))

    walk(y, "", False)
    if not any(keyed for _, keyed in named):
        return ["output" if len(named) == 1 else f"output_{i}" for i in range(len(named))]
    return [path for path, _ in named]


def record_output_names(proto: Any, names: list[str]) -> None:
    """Leave ``names`` (the source's outputs, flattened) in ``proto`` for export to apply."""
    import json

    proto.metadata_props.add(key=OUTPUT_NAMES, value=json.dumps(list(names)))


def call_with(fn: Any, inputs: Inputs, leaves: Any, *, keywords: bool) -> Any:
    """``fn`` called on ``leaves`` in the structure ``inputs`` came in: positionally, or for
    named inputs as keyword arguments (``keywords``, PyTorch's way) or one dict argument."""
    structure = inputs.rebuild(leaves)
    if not inputs.named:
        return fn(*structure)
    return fn(**structure) if keywords else fn(structure)


def as_function(target: Any) -> Any:
    """A functional model as one callable of its inputs: ``(apply_fn, params)`` becomes
    ``lambda *xs: apply_fn(params, *xs)`` (params closed over, so an exporter bakes them in
    as initializers); a plain function is itself."""
    if isinstance(target, tuple) and len(target) == 2 and callable(target[0]):
        apply_fn, params = target  # params may be callable too (an equinox module is a pytree)
        return lambda *xs: apply_fn(params, *xs)
    if callable(target):
        return target
    raise ConversionError(
        message(
            "Cannot export this object",
            expected="an (apply_fn, params) pair or a function of arrays",
            received=type(target).__qualname__,
        )
    )


def exporter_failed(exporter: str, error: BaseException, fix: str) -> ConversionError:
    """The ConversionError for a third-party exporter that raised: its own summary (first
    lines only: the traceback stays on ``__cause__``) and what to try."""
    summary = " ".join(str(error).split("\n")[:6]).strip()
    if len(summary) > 800:
        summary = summary[:800] + " ..."
    return ConversionError(
        message(f"{exporter} could not export the model", received=f"{type(error).__name__}: {summary}", fix=fix)
    )


def identifier(name: str) -> str:
    """A dimension's name as the frameworks' symbolic shapes take it (a Python identifier)."""
    import re

    found = re.sub(r"\W", "_", str(name))
    return found if found and not found[0].isdigit() else f"d_{found}"
