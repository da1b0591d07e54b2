"""SGD, momentum, Adam and AdamW written once over the op set: the same math on every backend.

An optimizer is pure: ``init(ops, params)`` gives its state (a flat dict of arrays, so a
checkpoint saves it as safetensors) and ``update(ops, params, grads, state)`` returns new
params and state, so it runs inside ``jax.jit`` and ``tf.function``. The rules are
PyTorch's (``torch.optim.SGD``, ``Adam``, ``AdamW``) with the same defaults, so a loss curve
from ``xdevice.fit`` matches one from a plain torch loop.

>>> from xdevice import backend
>>> ops = backend("numpy").ops
>>> sgd = SGD(lr=0.5)
>>> params, state = sgd.update(ops, {"w": ops.asarray([1.0])}, {"w": ops.asarray([2.0])}, sgd.init(ops, {}))
>>> params["w"].tolist()
[0.0]
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from xdevice._errors import ConfigurationError, message

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "optimizer"]


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """The base: a learning rate and a pure update rule."""

    lr: float = 1e-3

    def init(self, ops: Any, params: dict[str, Any]) -> dict[str, Any]:
        """The state before the first step: ``step`` (int32 scalar) plus per-parameter slots."""
        state = {"step": ops.zeros((), "int32")}
        for slot in self.slots:
            for name, value in params.items():
                state[f"{slot}/{name}"] = ops.zeros(ops.shape(value), ops.dtype(value))
        return state

    #: names of the per-parameter state arrays (``state["m/<param>"]``)
    slots: ClassVar[tuple[str, ...]] = ()

    def update(self, ops: Any, params: dict[str, Any], grads: dict[str, Any], state: dict[str, Any]
               ) -> tuple[dict[str, Any], dict[str, Any]]:
        step = ops.add(state["step"], ops.asarray(1, "int32"))
        new_params, new_state = {}, {"step": step}
        for name, value in params.items():
            slots = {slot: state[f"{slot}/{name}"] for slot in self.slots}
            new_params[name], slots = self.rule(ops, value, ops.cast(grads[name], ops.dtype(value)), slots, step)
            new_state.update({f"{slot}/{name}": array for slot, array in slots.items()})
        return new_params, new_state

    def rule(self, ops: Any, param: Any, grad: Any, slots: dict[str, Any], step: Any) -> tuple[Any, dict]:
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        """What a checkpoint records to rebuild this optimizer."""
        return {"name": type(self).__name__, **dataclasses.asdict(self)}


@dataclasses.dataclass(frozen=True)
class SGD(Optimizer):
    """Stochastic gradient descent; with ``momentum`` > 0, heavy-ball momentum (PyTorch's rule:
    ``buf = momentum * buf + g``; ``nesterov`` uses ``g + momentum * buf``); ``weight_decay``
    is added to the gradient (L2)."""

    lr: float = 1e-2
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0

    @property  # type: ignore[override]
    def slots(self) -> tuple[str, ...]:
        return ("momentum",) if self.momentum else ()

    def rule(self, ops, param, grad, slots, step):
        if self.weight_decay:
            grad = ops.add(grad, ops.multiply(param, self.weight_decay))
        if self.momentum:
            buf = ops.add(ops.multiply(slots["momentum"], self.momentum), grad)
            slots = {"momentum": buf}
            grad = ops.add(grad, ops.multiply(buf, self.momentum)) if self.nesterov else buf
        return ops.subtract(param, ops.multiply(grad, self.lr)), slots


@dataclasses.dataclass(frozen=True)
class Adam(Optimizer):
    """Adam with bias correction (PyTorch's ``Adam``); ``weight_decay`` is L2 on the gradient."""

    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0

    slots = ("m", "v")

    def rule(self, ops, param, grad, slots, step):
        if self.weight_decay:
            grad = ops.add(grad, ops.multiply(param, self.weight_decay))
        return self._adam(ops, param, grad, slots, step)

    def _adam(self, ops, param, grad, slots, step):
        m = ops.add(ops.multiply(slots["m"], self.beta1), ops.multiply(grad, 1 - self.beta1))
        v = ops.add(ops.multiply(slots["v"], self.beta2), ops.multiply(ops.square(grad), 1 - self.beta2))
        t = ops.cast(step, ops.dtype(param))
        correction1 = ops.subtract(ops.asarray(1.0, ops.dtype(param)), ops.power(ops.asarray(self.beta1, ops.dtype(param)), t))
        correction2 = ops.subtract(ops.asarray(1.0, ops.dtype(param)), ops.power(ops.asarray(self.beta2, ops.dtype(param)), t))
        # PyTorch's order of operations: lr / c1 * m / (sqrt(v) / sqrt(c2) + eps)
        denominator = ops.add(ops.divide(ops.sqrt(v), ops.sqrt(correction2)), self.eps)
        change = ops.multiply(ops.divide(ops.asarray(self.lr, ops.dtype(param)), correction1), ops.divide(m, denominator))
        return ops.subtract(param, change), {"m": m, "v": v}


@dataclasses.dataclass(frozen=True)
class AdamW(Adam):
    """Adam with decoupled weight decay (PyTorch's ``AdamW``: ``param *= 1 - lr * weight_decay``
    before the Adam step; default ``weight_decay`` 0.01)."""

    weight_decay: float = 1e-2

    def rule(self, ops, param, grad, slots, step):
        if self.weight_decay:
            param = ops.multiply(param, 1 - self.lr * self.weight_decay)
        return self._adam(ops, param, grad, slots, step)


_NAMES = {"sgd": SGD, "momentum": lambda **kw: SGD(**{"momentum": 0.9, **kw}), "adam": Adam, "adamw": AdamW}


def optimizer(value: str | Optimizer, **options: Any) -> Optimizer:
    """An optimizer from a name (``"sgd"``, ``"momentum"``, ``"adam"``, ``"adamw"``) or as given.

    >>> optimizer("momentum", lr=0.1)
    SGD(lr=0.1, momentum=0.9, nesterov=False, weight_decay=0.0)
    """
    if isinstance(value, Optimizer):
        return value
    if value not in _NAMES:
        raise ConfigurationError(message("Unknown optimizer", received=value, choices=sorted(_NAMES),
                                         fix="pass one of these names or an xdevice.training optimizer"))
    kind = {"momentum": SGD}.get(value, _NAMES[value])
    valid = [f.name for f in dataclasses.fields(kind)]
    unknown = [k for k in options if k not in valid]
    if unknown:
        raise ConfigurationError(message(f"Unknown option for optimizer {value!r}", received=unknown[0],
                                         choices=valid))
    return _NAMES[value](**options)
