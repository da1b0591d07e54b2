"""A zoo model as ``(apply_fn, params)``: a pure function and a flat dict of arrays."""

from __future__ import annotations

from typing import Any

from xdevice.backends._functional import functional_from_native, functional_to_native


class Native:
    def to_native(self, name: str, spec: dict, apply, params: dict[str, Any], trainable: list[str]) -> Any:
        return functional_to_native(self, name, spec, apply, params, trainable)

    def from_native(self, native: Any):
        return functional_from_native(self, native)
