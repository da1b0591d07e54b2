"""1x1 convolutions (ResNet's bottleneck and shortcut layers) against the numpy reference.

JAX computes an unpadded 1x1 convolution as a matrix product over channels of every
stride-th pixel instead of a convolution; these cases pin its values and gradients,
strided over odd sizes, in one, two and three spatial dimensions, with and without bias.
"""

from __future__ import annotations

import pytest

from . import test_ops  # its checks, called per case (a module import keeps pytest from collecting them twice)
from .op_cases import Case, args, normal

POINTWISE = [
    Case("conv2d-1x1", "conv", args(normal(2, 6, 5, 4), normal(3, 6, 1, 1)), {}, (0, 1)),
    Case(
        "conv2d-1x1-stride2-odd",
        "conv",
        args(normal(2, 4, 7, 5), normal(6, 4, 1, 1), normal(6)),
        {"stride": 2},
        (0, 1, 2),
    ),
    Case("conv2d-1x1-stride-2x3", "conv", args(normal(1, 3, 8, 9), normal(2, 3, 1, 1)), {"stride": (2, 3)}, (0, 1)),
    Case("conv1d-1x1-stride3", "conv", args(normal(2, 3, 10), normal(4, 3, 1)), {"stride": 3}, (0, 1)),
    Case(
        "conv3d-1x1x1", "conv", args(normal(1, 2, 3, 4, 5), normal(3, 2, 1, 1, 1), normal(3)), {"stride": 2}, (0, 1, 2)
    ),
    Case("conv2d-1x1-padded", "conv", args(normal(1, 2, 4, 4), normal(3, 2, 1, 1)), {"padding": 1}, (0, 1)),
]


@pytest.mark.parametrize("case", POINTWISE, ids=[c.id for c in POINTWISE])
def test_pointwise_conv_matches_the_numpy_reference(backend, case):
    test_ops.test_op_matches_the_numpy_reference(backend, case)


@pytest.mark.parametrize("case", POINTWISE, ids=[c.id for c in POINTWISE])
def test_pointwise_conv_gradient_matches_the_numpy_reference(backend, case):
    test_ops.test_op_gradient_matches_the_numpy_reference(backend, case)
