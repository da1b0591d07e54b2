"""``TorchBackend``: the mixins of this folder assembled into one backend."""

from xdevice.backends.base import Backend
from xdevice.backends.torch import TITLE
from xdevice.backends.torch.autodiff import Autodiff
from xdevice.backends.torch.devices import Devices
from xdevice.backends.torch.export import Export
from xdevice.backends.torch.memory import Memory
from xdevice.backends.torch.native import Native
from xdevice.backends.torch.numerics import Numerics
from xdevice.backends.torch.ops import TorchOps
from xdevice.backends.torch.placement import Placement
from xdevice.backends.torch.replication import Replication

__all__ = ["TorchBackend"]


class TorchBackend(Devices, Memory, Numerics, Placement, Autodiff, Native, Export, Replication, Backend):
    name = "torch"
    title = TITLE
    accepts = {"array": "torch.Tensor", "model": "torch.nn.Module", "device": "torch.device"}
    saved_format = ".pt2"
    supports_memory_limit = True
    supports_processes = True
    supports_tensor_parallel = True  # across launched processes, with DTensor (replication.py)
    fsdp_first_axis = True  # FSDP2's fully_shard: torch.chunk along dim 0
    ops = TorchOps()
