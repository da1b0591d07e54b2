"""``NumpyBackend``: the mixins of this folder assembled into the reference backend."""

import contextlib

from xdevice.backends.base import Backend
from xdevice.backends.numpy import TITLE
from xdevice.backends.numpy.autodiff import Autodiff, TapedOps, kink_margin
from xdevice.backends.numpy.devices import Devices
from xdevice.backends.numpy.export import Export
from xdevice.backends.numpy.memory import Memory
from xdevice.backends.numpy.numerics import Numerics
from xdevice.backends.numpy.placement import Placement

__all__ = ["NumpyBackend"]


class NumpyBackend(Devices, Memory, Numerics, Placement, Autodiff, Export, Backend):
    name = "numpy"
    title = TITLE
    accepts = {
        "array": "numpy.ndarray",
        "model": "(none: a zoo model's (apply_fn, params))",
        "device": "(none: only 'cpu:0')",
    }
    supports_gpu = False
    supports_bfloat16 = False  # ml_dtypes' bfloat16 computes through a slow scalar path
    has_default_device = False  # numpy arrays always live in host memory
    ops = TapedOps()  # records a gradient tape whenever an input is a Var

    def kink_margin(self) -> contextlib.AbstractContextManager[list[float]]:
        return kink_margin()
