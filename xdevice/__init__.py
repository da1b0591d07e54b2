"""xdevice: write deep-learning code once; run it on PyTorch, JAX or TensorFlow, on any device.

Importing xdevice imports no framework (not even numpy): each backend is resolved on
first use. The public API is re-exported here from private modules.

>>> import xdevice
>>> "numpy" in xdevice.backends()
True
"""

from typing import TYPE_CHECKING, Any

from xdevice import backends  # the callable package: xdevice.backends() lists installed ones
from xdevice._configure import configure, current_config
from xdevice._device import Device, device
from xdevice._discovery import devices, find
from xdevice._errors import (
    BackendUnavailable,
    ConfigurationError,
    ConversionError,
    DeviceNotFound,
    InferenceError,
    InputError,
    ParityError,
    UnsupportedOp,
    XDeviceError,
)
from xdevice._memory import memory_stats
from xdevice._placement import DeviceFallbackWarning, Placement, current_device, on
from xdevice._processes import join_processes
from xdevice._registry import backend
from xdevice._seed import seed
from xdevice._tensors import HostCopyWarning, backend_of, convert, device_of, to_device
from xdevice._tolerance import Comparison, compare
from xdevice._types import Applied, Config, ConfigReport, MemoryStats

if TYPE_CHECKING:  # loaded on first use by __getattr__ below
    from xdevice.testing import ParityReport, parity

__version__ = "0.1.0"

__all__ = [
    "Applied",
    "Comparison",
    "BackendUnavailable",
    "Config",
    "ConfigReport",
    "ConfigurationError",
    "ConversionError",
    "Device",
    "DeviceFallbackWarning",
    "HostCopyWarning",
    "DeviceNotFound",
    "InferenceError",
    "InputError",
    "MemoryStats",
    "ParityError",
    "ParityReport",
    "Placement",
    "Trainer",
    "UnsupportedOp",
    "XDeviceError",
    "backend",
    "backend_of",
    "backends",
    "compare",
    "configure",
    "convert",
    "current_config",
    "current_device",
    "device",
    "device_of",
    "devices",
    "estimate_memory",
    "find",
    "fit",
    "join_processes",
    "memory_stats",
    "on",
    "parity",
    "replicate",
    "seed",
    "to_device",
]


def __getattr__(name: str) -> Any:
    """``fit``, ``Trainer``, ``replicate`` and ``estimate_memory`` load the training package on
    first use, not at ``import xdevice``; ``parity`` and ``ParityReport`` load
    ``xdevice.testing``, which sits above the zoo."""
    if name in ("fit", "Trainer"):
        from xdevice.training import trainer

        return getattr(trainer, name)
    if name == "replicate":
        from xdevice.training.replication import replicate

        return replicate
    if name == "estimate_memory":
        from xdevice.training.memory import estimate_memory

        return estimate_memory
    if name in ("parity", "ParityReport"):
        from xdevice import testing

        return getattr(testing, name)
    raise AttributeError(f"module 'xdevice' has no attribute {name!r}")
