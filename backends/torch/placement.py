"""PyTorch tensors: ``Tensor.to`` moves, ``torch.device`` is the default-device context."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from xdevice._device import Device
from xdevice.backends._dtypes import is_numpy_bfloat16, ml_dtype

__all__ = ["Placement", "host_array", "through_pinned_memory"]


class Placement:
    native_device: Callable[[Device], torch.device]  # devices.py's, in the assembled backend
    device_from_native: Callable[[torch.device], Device]

    def owns(self, x: Any) -> str | None:
        if isinstance(x, torch.Tensor):
            return "array"
        if isinstance(x, torch.nn.Module):
            return "model"
        return "device" if isinstance(x, torch.device) else None

    def device_of(self, x: Any) -> Device:
        return self.device_from_native(x.device)

    def to_device(self, x: Any, device: Device) -> Any:
        target = self.native_device(device)
        if through_pinned_memory(x.device.type, target.type):
            # a pageable host tensor is staged by the driver, synchronously; a pinned one is
            # copied by DMA on the stream, so a prefetched batch overlaps the running step
            return x.pin_memory().to(target, non_blocking=True)
        return x.to(target)

    def default_device(self, device: Device) -> contextlib.AbstractContextManager[Any]:
        return self.native_device(device)  # a torch.device is itself a (thread-local) context

    def from_dlpack(self, x: Any) -> Any:
        if is_numpy_bfloat16(x):  # numpy cannot export bfloat16 through DLPack
            return torch.from_dlpack(x.view("int16")).view(torch.bfloat16)
        return torch.from_dlpack(x)

    def dlpack_export(self, x: Any, stream: int | None, max_version: tuple[int, int] | None) -> Any:
        """``x``'s DLPack capsule for a consumer that reads on ``stream`` (None: one that
        cannot name its stream, like TensorFlow). Torch exports only from its current GPU,
        so the tensor's own device is entered; a consumer with no stream gets the tensor
        once torch's current stream has finished writing it (a side stream included)."""
        if x.device.type != "cuda":
            return x.__dlpack__(max_version=max_version)
        with torch.cuda.device(x.device):
            if stream is None:
                torch.cuda.current_stream().synchronize()
                stream = -1  # done above: no cross-stream wait left to ask for
            return x.__dlpack__(stream=stream, max_version=max_version)

    def data_pointer(self, x: Any) -> int:
        return int(x.data_ptr())

    def to_numpy(self, x: Any) -> Any:
        return host_array(x)

    def zeros(self, shape: tuple[int, ...], dtype: str = "float32") -> Any:
        return torch.zeros(shape, dtype=getattr(torch, dtype))

    def is_dense(self, x: Any) -> bool:
        return bool(x.is_contiguous())

    def dense(self, x: Any) -> Any:
        return x.contiguous()


def through_pinned_memory(source: str, target: str) -> bool:
    """Whether a tensor on torch device type ``source`` goes to ``target`` through pinned
    (page-locked) host memory and a non-blocking copy: host to CUDA only. Pure.

    >>> through_pinned_memory("cpu", "cuda"), through_pinned_memory("cpu", "meta")
    (True, False)
    """
    return source == "cpu" and target == "cuda"


def host_array(x: torch.Tensor, copy: bool = False) -> Any:
    """``x`` as a numpy array on the host, detached; a copy when asked or when ``x`` is
    off the CPU (otherwise it shares the tensor's memory)."""
    x = x.detach().to("cpu", copy=copy)
    if x.dtype == torch.bfloat16 or (x.is_floating_point() and x.element_size() == 1):
        # numpy has no bfloat16 or float8 of its own: ml_dtypes' types read the same bits
        bits = x.view(torch.int16 if x.dtype == torch.bfloat16 else torch.uint8).numpy()
        return bits.view(ml_dtype(str(x.dtype).removeprefix("torch.")))
    return x.numpy()
