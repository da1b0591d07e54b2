"""Training precision: its names (``precision_name``) and float16's dynamic loss scaling,
written once over the op set.

``precision=`` takes the names the CLI's ``--precision`` takes: ``float32`` (``fp32``),
``bfloat16`` (``bf16``), ``float16`` (``fp16``, ``half``).

float16 has 5 exponent bits: small gradients underflow to zero. The loss is multiplied by a
scale before the gradient is taken and the gradients divided by it after, in float32 (the
master weights' dtype). A step whose gradients hold an inf or a NaN is skipped (params and
optimizer state unchanged) and the scale backs off; after ``growth_interval`` good steps in a
row it grows. The rule and defaults are ``torch.amp.GradScaler``'s (the test compares the
scales step by step with its update kernel). The scale and the good-step count live in the
optimizer state (``amp/scale``, ``amp/good_steps``), so a checkpoint resumes them.

bfloat16 keeps float32's exponent range, so it needs no scaling.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from xdevice._errors import ConfigurationError, message

__all__ = ["SPELLINGS", "LossScale", "precision_name"]

#: every spelling of a training precision -> its dtype name
SPELLINGS = {
    "float32": "float32",
    "fp32": "float32",
    "f32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "f16": "float16",
    "half": "float16",
}


def precision_name(value: str) -> str:
    """The dtype name of a precision however it is spelled (``"bf16"`` -> ``"bfloat16"``).

    >>> precision_name("fp16")
    'float16'
    """
    name = SPELLINGS.get(value.lower()) if isinstance(value, str) else None
    if name is None:
        raise ConfigurationError(
            message(
                "Unknown precision",
                received=value,
                choices=sorted(set(SPELLINGS.values()), key=list(SPELLINGS.values()).index),
                fix="float32 (fp32), bfloat16 (bf16) or float16 (fp16, half)",
            )
        )
    return name


@dataclasses.dataclass(frozen=True)
class LossScale:
    """``torch.amp.GradScaler``'s settings: ``init_scale``, ``growth_factor``,
    ``backoff_factor``, ``growth_interval``."""

    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000

    def __post_init__(self):
        if not (
            self.init_scale > 0
            and self.growth_factor > 1
            and 0 < self.backoff_factor < 1
            and isinstance(self.growth_interval, int)
            and self.growth_interval >= 1
        ):
            raise ConfigurationError(
                message(
                    "Invalid loss scale settings",
                    received=dataclasses.asdict(self),
                    expected="init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1, growth_interval >= 1",
                    fix="LossScale() has torch.amp.GradScaler's defaults",
                )
            )

    def init(self, ops: Any) -> dict[str, Any]:
        return {"amp/scale": ops.asarray(self.init_scale, "float32"), "amp/good_steps": ops.zeros((), "int32")}

    def all_finite(self, ops: Any, grads: dict[str, Any]) -> Any:
        """A scalar bool: no gradient holds an inf or a NaN (they survive a sum, and then
        ``total - total`` is NaN instead of 0)."""
        total = functools.reduce(ops.add, [ops.sum(ops.cast(g, "float32")) for g in grads.values()])
        return ops.equal(ops.subtract(total, total), 0.0)

    def update(self, ops: Any, state: dict[str, Any], finite: Any) -> dict[str, Any]:
        """The new scale and good-step count after a step (``finite``: its gradients were)."""
        scale, good = state["amp/scale"], state["amp/good_steps"]
        good = ops.where(finite, ops.add(good, ops.asarray(1, "int32")), ops.zeros((), "int32"))
        grow = ops.equal(good, ops.asarray(self.growth_interval, "int32"))
        scale = ops.where(
            finite,
            ops.where(grow, ops.multiply(scale, self.growth_factor), scale),
            ops.multiply(scale, self.backoff_factor),
        )
        good = ops.where(grow, ops.zeros((), "int32"), good)
        return {**state, "amp/scale": scale, "amp/good_steps": good}


def loss_scale(value: Any) -> LossScale:
    """``loss_scale=``: None (the defaults), a :class:`LossScale`, or a dict of its settings."""
    if value is None:
        return LossScale()
    if isinstance(value, LossScale):
        return value
    if isinstance(value, dict):
        valid = [f.name for f in dataclasses.fields(LossScale)]
        unknown = [k for k in value if k not in valid]
        if unknown:
            raise ConfigurationError(message("Unknown loss scale setting", received=unknown[0], choices=valid))
        return LossScale(**value)
    raise ConfigurationError(
        message(
            "loss_scale takes a LossScale or a dict of its settings",
            received=type(value).__name__,
            fix="loss_scale={'init_scale': 1024.0}",
        )
    )
