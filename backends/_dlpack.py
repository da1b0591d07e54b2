"""DLPack read without consuming: the data pointer of a capsule, for frameworks with no pointer API."""

from __future__ import annotations

import ctypes
from typing import Any

__all__ = ["dlpack_data_pointer"]


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
