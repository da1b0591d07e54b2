"""Logic more than one backend needs, written once; each backend supplies only its hooks."""

from __future__ import annotations

import ctypes
from typing import Any

from xdevice._device import Device
from xdevice._errors import ConversionError, message
from xdevice._types import Applied, Config, How, MemoryStats

__all__ = ["dlpack_data_pointer", "memory_not_applied", "cpu_only_stats", "map_leaves", "ml_dtype", "is_numpy_bfloat16",
           "flat_outputs", "as_function", "exporter_failed"]


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


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
    return [Applied(backend, setting, getattr(config, setting), how, why)
            for setting in ("memory_growth", "memory_limit") if getattr(config, setting) is not None]


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


def ml_dtype(name: str = "bfloat16") -> Any:
    """numpy's dtype for ``name`` (bfloat16, float8, int4...) from ``ml_dtypes`` (installed with
    JAX and TensorFlow)."""
    try:
        import ml_dtypes
    except ImportError as error:
        raise ConversionError(message(
            f"numpy has no {name} type without ml_dtypes", received=f"a {name} array",
            fix="pip install ml_dtypes")) from error
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


def as_function(target: Any) -> Any:
    """A functional model as one callable of its inputs: ``(apply_fn, params)`` becomes
    ``lambda *xs: apply_fn(params, *xs)`` (params closed over, so an exporter bakes them in
    as initializers); a plain function is itself."""
    if isinstance(target, tuple) and len(target) == 2 and callable(target[0]) and not callable(target[1]):
        apply_fn, params = target
        return lambda *xs: apply_fn(params, *xs)
    if callable(target):
        return target
    raise ConversionError(message(
        "Cannot export this object", expected="an (apply_fn, params) pair or a function of arrays",
        received=type(target).__qualname__))


def exporter_failed(exporter: str, error: BaseException, fix: str) -> ConversionError:
    """The ConversionError for a third-party exporter that raised: its own summary (first
    lines only: the traceback stays on ``__cause__``) and what to try."""
    summary = " ".join(str(error).split("\n")[:6]).strip()
    if len(summary) > 800:
        summary = summary[:800] + " ..."
    return ConversionError(message(f"{exporter} could not export the model",
                                   received=f"{type(error).__name__}: {summary}", fix=fix))
