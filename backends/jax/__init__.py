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

__all__ = ["JaxBackend"]


class JaxBackend(Devices, Memory, Placement, Autodiff, Native, Export, Replication, Backend):
    name = "jax"
    title = "JAX"
    supports_memory_limit = True
    supports_preallocation = True
    supports_virtual_devices = True
    supports_replication = True
    ops = JaxOps()
