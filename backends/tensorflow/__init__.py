"""The TensorFlow backend. Importing this package imports tensorflow (no runtime start)."""

from xdevice.backends.base import Backend
from xdevice.backends.tensorflow.autodiff import Autodiff
from xdevice.backends.tensorflow.devices import Devices
from xdevice.backends.tensorflow.export import Export
from xdevice.backends.tensorflow.memory import Memory
from xdevice.backends.tensorflow.native import Native
from xdevice.backends.tensorflow.ops import TensorflowOps
from xdevice.backends.tensorflow.placement import Placement
from xdevice.backends.tensorflow.replication import Replication
from xdevice.training.launch import join_launched_group

__all__ = ["TensorflowBackend"]


class TensorflowBackend(Devices, Memory, Placement, Autodiff, Native, Export, Replication, Backend):
    name = "tensorflow"
    title = "TensorFlow"
    supports_memory_limit = True
    supports_preallocation = True
    supports_virtual_devices = True
    supports_replication = True
    supports_processes = True
    ops = TensorflowOps()

    def __init__(self):
        # MultiWorkerMirroredStrategy configures TF's collectives, which must precede the first
        # computation: join the workers xdevice launch started now
        join_launched_group("tensorflow")
