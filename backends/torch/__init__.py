"""The PyTorch backend. Importing this package imports torch."""

from xdevice.backends.base import Backend
from xdevice.backends.torch.autodiff import Autodiff
from xdevice.backends.torch.devices import Devices
from xdevice.backends.torch.export import Export
from xdevice.backends.torch.memory import Memory
from xdevice.backends.torch.native import Native
from xdevice.backends.torch.ops import TorchOps
from xdevice.backends.torch.placement import Placement
from xdevice.backends.torch.replication import Replication

__all__ = ["TorchBackend"]


class TorchBackend(Devices, Memory, Placement, Autodiff, Native, Export, Replication, Backend):
    name = "torch"
    title = "PyTorch"
    supports_memory_limit = True
    supports_processes = True
    ops = TorchOps()
