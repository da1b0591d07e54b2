"""The TensorFlow backend. Importing this package imports tensorflow (no runtime start)."""

from xdevice.backends.base import Backend
from xdevice.backends.tensorflow.autodiff import Autodiff
from xdevice.backends.tensorflow.devices import Devices
from xdevice.backends.tensorflow.export import Export
from xdevice.backends.tensorflow.memory import Memory
from xdevice.backends.tensorflow.native import Native
from xdevice.backends.tensorflow.ops import TensorflowOps
from xdevice.backends.tensorflow.placement import Placement

__all__ = ["TensorflowBackend"]


class TensorflowBackend(Devices, Memory, Placement, Autodiff, Native, Export, Backend):
    name = "tensorflow"
    title = "TensorFlow"
    supports_memory_limit = True
    supports_preallocation = True
    supports_virtual_devices = True
    ops = TensorflowOps()
