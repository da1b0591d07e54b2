"""PyTorch devices: ``cpu`` plus CUDA (or ROCm, or Apple MPS) GPUs.

Listing GPUs starts nothing: until the CUDA driver started, xdevice asks
``torch.cuda.device_count``, which counts them through NVML, never ``torch.cuda.is_available()``,
whose ``cuInit`` would fix the visible GPUs before ``configure(visible=...)`` could choose them.
PyTorch has no virtual CPU devices; ``cpu_devices=N`` is recorded for ``replicate``, which
starts N worker processes on gloo instead.
"""

from __future__ import annotations

import torch

from xdevice import _discovery
from xdevice._configure import AppliesPendingConfiguration
from xdevice._device import Device, device_from_parts
from xdevice._types import Applied, Config


class Devices(AppliesPendingConfiguration):  # creating the backend applies pending settings
    def version(self) -> str:
        return torch.__version__

    def runtime_started(self) -> bool:
        return torch.cuda.is_initialized()

    def list_devices(self) -> list[Device]:
        found = [Device("cpu", 0)]
        if _cuda_available():
            found += [Device("gpu", i, **self._facts(i)) for i in range(torch.cuda.device_count())]
        elif _mps_available():
            found.append(Device("gpu", 0, name="Apple MPS", vendor="apple"))
        return found

    def native_device(self, device: Device) -> torch.device:
        found = _native.get(device)
        if found is None:
            if device.kind == "cpu":
                found = torch.device("cpu")
            elif device.kind == "gpu" and not _cuda_available() and _mps_available():
                found = torch.device("mps", device.index)
            else:
                found = torch.device("cuda", device.index)
            _native[device] = found
        return found

    def device_from_native(self, native: torch.device) -> Device:
        found = _named.get(native)
        if found is None:
            found = _named[native] = device_from_parts(native.type, native.index or 0, native)
        return found

    def configure_devices(self, config: Config) -> list[Applied]:
        if config.cpu_devices is None:
            return []
        return [
            Applied(
                "torch",
                "cpu_devices",
                config.cpu_devices,
                "advisory",
                f"PyTorch has no in-process virtual devices, so devices=[...] cannot replicate in one "
                f"process; for {config.cpu_devices} replicas run the script without devices= under "
                f"`xdevice launch --nproc-per-node {config.cpu_devices} your_script.py` (one gloo process each)",
            )
        ]

    def gpu_libraries(self) -> dict[str, str]:
        version = torch.backends.cudnn.version() if _cuda_available() else None
        return {"cudnn": str(version)} if version else {}

    @staticmethod
    def _facts(index: int) -> dict:
        if not torch.cuda.is_initialized():
            return {}  # properties would start CUDA; core fills them in from NVML
        props = torch.cuda.get_device_properties(index)
        vendor = "amd" if torch.version.hip else "nvidia"
        return dict(
            name=props.name,
            vendor=vendor,
            memory_total=int(props.total_memory),
            compute_capability=(props.major, props.minor),
        )


# both directions, remembered: device_of and to_device are hot calls (torch.device is hashable)
_native: dict[Device, torch.device] = {}
_named: dict[torch.device, Device] = {}


def _cuda_available() -> bool:
    """``torch.cuda.is_available()`` without starting the CUDA driver before ``configure`` could
    set the visible GPUs: until it started, NVML counts them (what ``PYTORCH_NVML_BASED_CUDA_CHECK=1``
    makes ``is_available`` do; torch asks CUDA only where NVML fails); once it started, CUDA itself,
    which then costs nothing and also sees a driver too old for this build."""
    if torch.cuda.is_initialized() or _discovery.cuda_driver_started():
        return torch.cuda.is_available()
    return torch.cuda.device_count() > 0


def _mps_available() -> bool:
    return bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()
