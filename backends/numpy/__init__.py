"""The numpy reference backend: CPU only, the ground truth that parity is measured against."""

from xdevice.backends.base import Backend
from xdevice.backends.numpy.autodiff import Autodiff, TapedOps
from xdevice.backends.numpy.devices import Devices
from xdevice.backends.numpy.export import Export
from xdevice.backends.numpy.memory import Memory
from xdevice.backends.numpy.native import Native
from xdevice.backends.numpy.placement import Placement

__all__ = ["NumpyBackend"]


class NumpyBackend(Devices, Memory, Placement, Autodiff, Native, Export, Backend):
    name = "numpy"
    title = "NumPy"
    has_default_device = False  # numpy arrays always live in host memory
    ops = TapedOps()  # records a gradient tape whenever an input is a Var
