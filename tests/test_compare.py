"""``xdevice.compare`` says why it failed: arrays it cannot compare element by element
report both sides in ``reason`` (a report of many tensors still lists them all)."""

import numpy as np
import pytest

import xdevice


def test_arrays_of_different_shapes_are_not_ok_and_say_both_shapes():
    result = xdevice.compare(np.zeros((2, 3)), np.zeros((3, 4)))
    assert not result.ok
    assert result.reason == "The shapes differ: actual (2, 3), expected (3, 4); compare arrays of the same shape"
    assert result.describe() == result.reason
    assert "reason='The shapes differ" in repr(result)


def test_the_same_values_in_another_layout_suggest_a_reshape():
    result = xdevice.compare(np.zeros((2, 3)), np.zeros(6))
    assert not result.ok and result.reason.endswith("(the same values in another layout? .reshape() one side)")


def test_arrays_that_are_not_numbers_are_named_by_dtype():
    result = xdevice.compare(np.array(["a", "b"]), np.zeros(2))
    assert not result.ok
    assert result.reason == "The actual array has dtype <U1, not a number (actual <U1, expected float64)"


@pytest.mark.parametrize("actual", [[1.0, 2.0], [1.0, 3.0]])
def test_a_comparison_of_matching_shapes_has_no_reason(actual):
    assert xdevice.compare(actual, [1.0, 2.0]).reason == ""
