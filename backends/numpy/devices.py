"""NumPy devices: exactly one, the CPU."""

from __future__ import annotations

from typing import Any

import numpy as np

from xdevice._configure import AppliesPendingConfiguration
from xdevice._device import Device
from xdevice._types import Applied, Config


class Devices(AppliesPendingConfiguration):  # creating the backend applies pending settings
    def version(self) -> str:
        return np.__version__

    def runtime_started(self) -> bool:
        return False  # nothing in numpy is fixed at start-up

    def list_devices(self) -> list[Device]:
        return [Device("cpu", 0)]

    def native_device(self, device: Device) -> str:
        return "cpu"

    def device_from_native(self, native: Any) -> Device:
        return Device("cpu", 0)  # numpy owns no device object: only its one CPU is ever named

    def configure_devices(self, config: Config) -> list[Applied]:
        if config.cpu_devices is None:
            return []
        return [
            Applied(
                "numpy",
                "cpu_devices",
                config.cpu_devices,
                "unsupported",
                "the numpy reference backend has a single CPU device",
            )
        ]
