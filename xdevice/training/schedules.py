"""Learning-rate schedules: the rate of each optimizer step, counted from 0.

A schedule is a pure function of the step count, so a run resumed from a checkpoint (which
records the count and the schedule) continues it exactly. Pass one as an optimizer's
``lr`` (``fit(..., optimizer="adam", lr=cosine(1e-3, total_steps=1000, warmup_steps=100))``),
as Keras and Optax take a schedule for the learning rate; any ``callable(step) -> lr`` works
too. Each rate equals the one PyTorch's ``torch.optim.lr_scheduler`` gives after ``step``
calls of ``scheduler.step()`` with the same settings, one call per optimizer step (the test
compares them); to decay per epoch, count the epoch's steps into ``step_size``.

>>> [round(step_decay(0.1, step_size=2, gamma=0.5)(t), 4) for t in range(5)]
[0.1, 0.1, 0.05, 0.05, 0.025]
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from xdevice._errors import ConfigurationError, message

__all__ = ["Schedule", "constant", "cosine", "exponential", "one_cycle", "schedule", "step_decay"]


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Base: ``schedule(step)`` is the rate of optimizer step ``step`` (0 for the first)."""

    lr: float

    def __call__(self, step: int) -> float:
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        """What a checkpoint records (a resumed run must be given the same schedule)."""
        return {"schedule": type(self).__name__, **dataclasses.asdict(self)}


@dataclasses.dataclass(frozen=True)
class Constant(Schedule):
    """The same rate every step."""

    def __call__(self, step: int) -> float:
        return self.lr


@dataclasses.dataclass(frozen=True)
class StepDecay(Schedule):
    """``lr * gamma ** (step // step_size)``: ``torch.optim.lr_scheduler.StepLR``."""

    step_size: int = 1
    gamma: float = 0.1

    def __call__(self, step: int) -> float:
        return self.lr * self.gamma ** (step // self.step_size)


@dataclasses.dataclass(frozen=True)
class Exponential(Schedule):
    """``lr * gamma ** step``: ``torch.optim.lr_scheduler.ExponentialLR``."""

    gamma: float = 0.99

    def __call__(self, step: int) -> float:
        return self.lr * self.gamma**step


@dataclasses.dataclass(frozen=True)
class Cosine(Schedule):
    """A linear warmup from ``lr * start_factor`` over ``warmup_steps``, then a cosine from
    ``lr`` down to ``min_lr`` at ``total_steps``: ``SequentialLR`` of ``LinearLR`` and
    ``CosineAnnealingLR(T_max=total_steps - warmup_steps, eta_min=min_lr)``."""

    total_steps: int = 1
    warmup_steps: int = 0
    start_factor: float = 1.0 / 3
    min_lr: float = 0.0

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * (self.start_factor + (1 - self.start_factor) * step / self.warmup_steps)
        span = max(self.total_steps - self.warmup_steps, 1)
        done = step - self.warmup_steps  # past total_steps the cosine goes on (back up), as torch's does
        return self.min_lr + (self.lr - self.min_lr) * (1 + math.cos(math.pi * done / span)) / 2


@dataclasses.dataclass(frozen=True)
class OneCycle(Schedule):
    """``torch.optim.lr_scheduler.OneCycleLR`` (``lr`` is its ``max_lr``; the rate alone: the
    momentum is not cycled, as with ``cycle_momentum=False``): from ``lr / div_factor`` up to
    ``lr`` over ``pct_start`` of ``total_steps``, then down to ``lr / div_factor /
    final_div_factor``, by cosine or linearly (``anneal="linear"``)."""

    total_steps: int = 1
    pct_start: float = 0.3
    div_factor: float = 25.0
    final_div_factor: float = 1e4
    anneal: str = "cos"

    def __call__(self, step: int) -> float:
        first = self.lr / self.div_factor
        peak = float(self.pct_start * self.total_steps) - 1  # the step where the rise ends, as torch counts
        if step <= peak:
            start, end, high, low = 0.0, peak, first, self.lr
        else:
            start, end, high, low = peak, self.total_steps - 1, self.lr, first / self.final_div_factor
        pct = (step - start) / (end - start)
        if self.anneal == "cos":
            return low + (high - low) / 2 * (math.cos(math.pi * pct) + 1)
        return (low - high) * pct + high


@dataclasses.dataclass(frozen=True)
class Custom(Schedule):
    """Any ``callable(step) -> lr``; a checkpoint records its name only."""

    function: Callable[[int], float] = dataclasses.field(default=lambda step: 0.0)
    lr: float = 0.0

    def __call__(self, step: int) -> float:
        return float(self.function(step))

    def config(self) -> dict[str, Any]:
        return {"schedule": "Custom", "function": getattr(self.function, "__qualname__", repr(self.function))}


def constant(lr: float) -> Schedule:
    return Constant(_rate(lr))


def step_decay(lr: float, *, step_size: int, gamma: float = 0.1) -> Schedule:
    """``StepLR``: multiply by ``gamma`` every ``step_size`` optimizer steps."""
    return StepDecay(_rate(lr), _count("step_size", step_size), gamma)


def exponential(lr: float, *, gamma: float) -> Schedule:
    """``ExponentialLR``: multiply by ``gamma`` every step."""
    return Exponential(_rate(lr), gamma)


def cosine(
    lr: float, *, total_steps: int, warmup_steps: int = 0, start_factor: float = 1.0 / 3, min_lr: float = 0.0
) -> Schedule:
    """Cosine decay to ``min_lr`` at ``total_steps``, after a linear warmup from ``lr * start_factor``."""
    if warmup_steps and not 0 < start_factor <= 1:
        raise ConfigurationError(
            message(
                "start_factor is the warmup's first rate as a fraction of lr",
                expected="0 < start_factor <= 1",
                received=start_factor,
            )
        )
    if not 0 <= warmup_steps < _count("total_steps", total_steps):
        raise ConfigurationError(
            message(
                "warmup_steps must be fewer than total_steps", expected=f"0 to {total_steps - 1}", received=warmup_steps
            )
        )
    return Cosine(_rate(lr), total_steps, warmup_steps, start_factor, min_lr)


def one_cycle(
    max_lr: float,
    *,
    total_steps: int,
    pct_start: float = 0.3,
    div_factor: float = 25.0,
    final_div_factor: float = 1e4,
    anneal: str = "cos",
) -> Schedule:
    """``OneCycleLR``: up to ``max_lr`` and down again over ``total_steps``."""
    if anneal not in ("cos", "linear"):
        raise ConfigurationError(message("Unknown anneal", received=anneal, choices=["cos", "linear"]))
    if not 0 < pct_start < 1:
        raise ConfigurationError(
            message("pct_start is the fraction of steps spent rising", expected="0 < pct_start < 1", received=pct_start)
        )
    return OneCycle(_rate(max_lr), _count("total_steps", total_steps), pct_start, div_factor, final_div_factor, anneal)


def schedule(lr: Any) -> Schedule:
    """``lr`` as a schedule: a number is constant, a callable is called with the step."""
    if isinstance(lr, Schedule):
        return lr
    if callable(lr):
        return Custom(function=lr)
    return constant(lr)


def _rate(lr: Any) -> float:
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr < 0:
        raise ConfigurationError(
            message(
                "A learning rate is a number of 0 or more",
                received=lr,
                fix="e.g. lr=1e-3, or a schedule such as xdevice.training.cosine(1e-3, total_steps=1000)",
            )
        )
    return float(lr)


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(message(f"{name} is a positive number of optimizer steps", received=value))
    return value
