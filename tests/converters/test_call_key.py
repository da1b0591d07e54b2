"""The lookup every call of an imported model starts with: inputs like those of an earlier
captured call (same type, shape and dtype) run its program without checks; any other input
is checked and converted as on a first call."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx", reason="ONNX import tests need onnx (pip install onnx)")
from onnx import TensorProto, helper

import xdevice
from tests.converters.graphs import onnx_model
from xdevice.converters.importer import from_onnx
from xdevice.converters.importer.model import _quick_key


def _doubling():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
    return onnx_model([helper.make_node("Add", ["x", "x"], ["y"])], [x], [y])


def test_inputs_with_no_shape_or_dtype_have_no_key():
    assert _quick_key(([1.0, 2.0],)) is None  # a sequence
    assert _quick_key((None,)) is None  # an empty optional
    assert _quick_key((3.0,)) is None  # a Python number
    assert _quick_key((np.zeros(3, np.float32), None)) is None


def test_the_key_tells_inputs_apart_by_type_shape_and_dtype():
    a = np.zeros((2, 3), np.float32)
    keys = {
        _quick_key((a,)),
        _quick_key((np.zeros((1, 3), np.float32),)),
        _quick_key((a.astype(np.float64),)),
        _quick_key((np.float32(0),)),
        _quick_key((a, a)),
    }
    assert len(keys) == 5 and None not in keys
    assert _quick_key((a,)) == _quick_key((np.ones((2, 3), np.float32),))  # the values do not count


def test_an_input_of_another_dtype_is_checked_even_after_a_same_shaped_one_ran(backend):
    imported = from_onnx(_doubling(), backend=backend.name)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for _ in range(2):  # the second call takes the known program where there is one
        np.testing.assert_array_equal(backend.ops.to_numpy(imported(backend.ops.asarray(x))), 2 * x)
    with pytest.raises(xdevice.InputError, match="x"):
        imported(backend.ops.asarray(x.astype(np.int32)))
