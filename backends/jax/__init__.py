"""The JAX backend. Importing this package imports jax (which starts no runtime)."""

from xdevice.backends.base import Backend
from xdevice.backends.jax.autodiff import Autodiff
from xdevice.backends.jax.devices import Devices
from xdevice.backends.jax.export import Export
from xdevice.backends.jax.memory import Memory
from xdevice.backends.jax.native import Native
from xdevice.backends.jax.ops import JaxOps
from xdevice.backends.jax.placement import Placement
from xdevice.backends.jax.replication import Replication
from xdevice.training.launch import join_launched_group

__all__ = ["JaxBackend"]


class JaxBackend(Devices, Memory, Placement, Autodiff, Native, Export, Replication, Backend):
    name = "jax"
    title = "JAX"
    supports_memory_limit = True
    supports_preallocation = True
    supports_virtual_devices = True
    supports_replication = True
    supports_processes = True
    ops = JaxOps()

    def __init__(self):
        # jax.distributed.initialize must come before JAX's first computation, and xdevice
        # computes nothing with JAX before this: join the processes xdevice launch started now
        join_launched_group("jax")
