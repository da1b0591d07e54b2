"""A zoo model as a ``torch.nn.Module``: registered parameters and buffers, canonical names."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from xdevice.backends.torch.ops import TorchOps

if TYPE_CHECKING:
    from xdevice._device import Device


class ZooModule(torch.nn.Module):
    """A zoo model as a PyTorch module. ``state_dict()`` keys are the zoo's names.

    In training mode the forward pass normalises with batch statistics and writes the new
    running statistics into the buffers, as ``torch.nn.BatchNorm2d`` does.

    ``module(x, attention_mask=mask)``: the inputs a text model takes besides ``x`` (its
    definition's ``INPUTS``) are keyword arguments, passed on to ``forward`` only when given
    (a ``forward`` that takes them is the one export builds for them).
    """

    def __init__(self, name: str, spec: dict, forward, params: dict[str, Any], trainable: list[str]):
        super().__init__()
        self.model_name, self.spec = name, spec
        self._zoo_forward = forward
        for key, value in params.items():
            owner, leaf = self._owner(key)
            value = value.detach().clone()
            if key in trainable:
                owner.register_parameter(leaf, torch.nn.Parameter(value))
            else:
                owner.register_buffer(leaf, value)

    def _owner(self, key: str) -> tuple[torch.nn.Module, str]:
        *path, leaf = key.split(".")
        owner: torch.nn.Module = self
        for part in path:
            if not hasattr(owner, part):
                owner.add_module(part, torch.nn.Module())
            owner = getattr(owner, part)
        return owner, leaf

    def forward(self, x: Any, **inputs: Any) -> Any:
        weights = {**dict(self.named_parameters()), **dict(self.named_buffers())}
        with TorchOps.new_tensors_on(next(iter(weights.values())).device):
            y, updates = self._zoo_forward(weights, x, self.training, **inputs)
        with torch.no_grad():
            for key, value in updates.items():
                weights[key].copy_(value)
        return y

    def extra_repr(self) -> str:
        return f"zoo model {self.model_name!r}"


class Native:
    device_from_native: Callable[[torch.device], Device]  # devices.py's, in the assembled backend

    def to_native(self, name: str, spec: dict, forward, params: dict[str, Any], trainable: list[str]) -> Any:
        return ZooModule(name, spec, forward, params, trainable)

    def from_native(self, native: Any):
        if not isinstance(native, ZooModule):
            return None
        arrays = {key: value.detach().cpu().numpy() for key, value in native.state_dict().items()}
        where = self.device_from_native(next(iter(native.state_dict().values())).device)
        return native.model_name, native.spec, arrays, where
