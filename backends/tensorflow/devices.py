"""TensorFlow devices: logical devices, which ``cpu_devices`` multiplies.

Listing logical devices starts TensorFlow's runtime, after which device and memory
settings raise. ``runtime_started`` reads the eager context's handle, which is private;
if a release changes it we assume "not started" and wrap TensorFlow's own RuntimeError.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from xdevice._configure import AppliesPendingConfiguration
from xdevice._device import Device, device
from xdevice._errors import ConfigurationError, message
from xdevice._types import Applied, Config


class Devices(AppliesPendingConfiguration):  # creating the backend applies pending settings
    def version(self) -> str:
        return tf.__version__

    def runtime_started(self) -> bool:
        try:
            from tensorflow.python.eager import context
        except ImportError:
            return False
        return getattr(context.context(), "_context_handle", None) is not None

    def list_devices(self) -> list[Device]:
        return [
            self.device_from_native(d)
            for d in tf.config.list_logical_devices()
            if d.device_type in ("CPU", "GPU", "TPU")
        ]

    def device_from_native(self, native: Any) -> Device:
        return device(native.name)  # a LogicalDevice or PhysicalDevice names itself TF's way

    def native_device(self, device: Device) -> str:
        return f"/{device.kind.upper()}:{device.index}"

    def configure_devices(self, config: Config) -> list[Applied]:
        if config.cpu_devices is None:
            return []
        cpu = tf.config.list_physical_devices("CPU")[0]
        with _wrapped("cpu_devices"):
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(config.cpu_devices)]
            )
        return [
            Applied(
                "tensorflow", "cpu_devices", config.cpu_devices, "applied", f"{config.cpu_devices} logical CPU devices"
            )
        ]


class _wrapped:
    """Turn TensorFlow's late-configuration RuntimeError into a ConfigurationError."""

    def __init__(self, setting: str):
        self.setting = setting

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, traceback) -> None:
        if isinstance(error, RuntimeError):
            raise ConfigurationError(
                message(
                    f"TensorFlow already started, so {self.setting} cannot change",
                    received=str(error),
                    fix="call xdevice.configure(...) before the first TensorFlow computation",
                )
            ) from error
