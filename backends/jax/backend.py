"""``JaxBackend``: the mixins of this folder assembled into one backend."""

from xdevice.backends.base import Backend
from xdevice.backends.jax import TITLE
from xdevice.backends.jax.autodiff import Autodiff
from xdevice.backends.jax.devices import Devices
from xdevice.backends.jax.export import Export
from xdevice.backends.jax.memory import Memory
from xdevice.backends.jax.numerics import Numerics
from xdevice.backends.jax.ops import JaxOps
from xdevice.backends.jax.placement import Placement
from xdevice.backends.jax.replication import Replication

__all__ = ["JaxBackend"]


class JaxBackend(Devices, Memory, Numerics, Placement, Autodiff, Export, Replication, Backend):
    name = "jax"
    title = TITLE
    accepts = {
        "array": "jax.Array",
        "model": "a function, or an (apply_fn, params) pair of a pytree",
        "device": "jax.Device",
    }
    saved_format = ".jax"
    supports_memory_limit = True
    supports_preallocation = True
    supports_virtual_devices = True
    supports_replication = True
    supports_tensor_parallel = True
    supports_processes = True
    ops = JaxOps()
