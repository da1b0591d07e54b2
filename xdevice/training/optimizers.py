"""SGD, momentum, Adam and AdamW written once over the op set: the same math on every backend.

An optimizer is pure: ``init(ops, params)`` gives its state (a flat dict of arrays, so a
checkpoint saves it as safetensors) and ``update(ops, params, grads, state)`` returns new
params and state, so it runs inside ``jax.jit`` and ``tf.function``. The rules are
PyTorch's (``torch.optim.SGD``, ``Adam``, ``AdamW``) with the same defaults, so a loss curve
from ``xdevice.fit`` matches one from a plain torch loop. The math is written once, in the op
set (``Ops.sgd_update`` / ``Ops.adam_update``, over every parameter at once); a backend may
fuse it (PyTorch: ``torch._foreach_*`` in place when the trainer passes ``inplace=True``;
``jax.jit`` and ``tf.function`` fuse the composite themselves).

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
from xdevice.training.schedules import Schedule, schedule

__all__ = ["ALIASES", "SGD", "Adam", "AdamW", "Optimizer", "option_names", "optimizer"]


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """The base: a learning rate (a number, or a schedule: ``xdevice.training.schedules``) and a
    pure update rule."""

    lr: float | Schedule = 1e-3

    def __post_init__(self):
        schedule(self.lr)  # a bad rate is refused here, with the fix

    @property
    def schedule(self) -> Schedule:
        """The rate of each step (a constant one for a number)."""
        return schedule(self.lr)

    def init(self, ops: Any, params: dict[str, Any]) -> dict[str, Any]:
        """The state before the first step: ``step`` (int32 scalar) plus per-parameter slots."""
        state = {"step": ops.zeros((), "int32")}
        for slot in self.slots:
            for name, value in params.items():
                state[f"{slot}/{name}"] = ops.zeros(ops.shape(value), ops.dtype(value))
        return state

    #: names of the per-parameter state arrays (``state["m/<param>"]``)
    slots: ClassVar[tuple[str, ...]] = ()

    def update(
        self,
        ops: Any,
        params: dict[str, Any],
        grads: dict[str, Any],
        state: dict[str, Any],
        *,
        lr: Any = None,
        inplace: bool = False,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """New params and state after one step at rate ``lr`` (a number, or a scalar array
        inside a compiled step; default: ``self.lr`` when it is a number; the trainer passes
        its schedule's rate). With ``inplace`` a backend may write the new values into the
        arrays given (the trainer passes it: it keeps no old values)."""
        if lr is None:
            if isinstance(self.lr, Schedule):
                raise ConfigurationError(
                    message(
                        "This optimizer's lr is a schedule, so update needs the step's rate",
                        fix="update(..., lr=optimizer.schedule(step)), or train with xdevice.fit / Trainer",
                    )
                )
            lr = self.lr
        step = ops.add(state["step"], ops.asarray(1, "int32"))
        names = list(params)
        slots = {slot: [state[f"{slot}/{name}"] for name in names] for slot in self.slots}
        new_params, new_slots = self.apply(
            ops, [params[n] for n in names], [grads[n] for n in names], slots, step, lr, inplace
        )
        new_state = {"step": step}
        for slot, arrays in new_slots.items():
            new_state.update({f"{slot}/{name}": array for name, array in zip(names, arrays)})
        return dict(zip(names, new_params)), new_state

    def apply(
        self, ops: Any, params: list, grads: list, slots: dict[str, list], step: Any, lr: Any, inplace: bool
    ) -> tuple[list, dict[str, list]]:
        """The rule over every parameter at once, through the op set's update for it (which a
        backend may fuse): ``(new params, new slots)``."""
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        """What a checkpoint records to rebuild this optimizer."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if not isinstance(self.lr, (int, float)):
            fields["lr"] = self.schedule.config()
        return {"name": type(self).__name__, **fields}


@dataclasses.dataclass(frozen=True)
class SGD(Optimizer):
    """Stochastic gradient descent; with ``momentum`` > 0, heavy-ball momentum (PyTorch's rule:
    ``buf = momentum * buf + g``; ``nesterov`` uses ``g + momentum * buf``); ``weight_decay``
    is added to the gradient (L2)."""

    lr: float = 1e-2
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0

    @property
    def slots(self) -> tuple[str, ...]:  # type: ignore[override]  # the base's class constant, computed here
        return ("momentum",) if self.momentum else ()

    def apply(self, ops, params, grads, slots, step, lr, inplace):
        params, buffers = ops.sgd_update(
            params,
            grads,
            slots.get("momentum"),
            lr=lr,
            momentum=self.momentum,
            nesterov=self.nesterov,
            weight_decay=self.weight_decay,
            inplace=inplace,
        )
        return params, ({"momentum": buffers} if self.momentum else {})


@dataclasses.dataclass(frozen=True)
class Adam(Optimizer):
    """Adam with bias correction (PyTorch's ``Adam``); ``weight_decay`` is L2 on the gradient."""

    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0

    slots = ("m", "v")
    decoupled: ClassVar[bool] = False  # AdamW decays the params, not the gradient

    def apply(self, ops, params, grads, slots, step, lr, inplace):
        params, m, v = ops.adam_update(
            params,
            grads,
            slots["m"],
            slots["v"],
            step,
            lr=lr,
            beta1=self.beta1,
            beta2=self.beta2,
            eps=self.eps,
            weight_decay=self.weight_decay,
            decoupled=self.decoupled,
            inplace=inplace,
        )
        return params, {"m": m, "v": v}


@dataclasses.dataclass(frozen=True)
class AdamW(Adam):
    """Adam with decoupled weight decay (PyTorch's ``AdamW``: ``param *= 1 - lr * weight_decay``
    before the Adam step; default ``weight_decay`` 0.01)."""

    weight_decay: float = 1e-2
    decoupled: ClassVar[bool] = True


# name -> (class, its defaults for that name)
_NAMES: dict[str, tuple[type[Optimizer], dict[str, Any]]] = {
    "sgd": (SGD, {}),
    "momentum": (SGD, {"momentum": 0.9}),
    "adam": (Adam, {}),
    "adamw": (AdamW, {}),
}


#: other names for an option (Keras's and Optax's ``learning_rate``)
ALIASES = {"learning_rate": "lr"}


def option_names(value: str | Optimizer) -> list[str]:
    """The options of the optimizer ``value`` names, aliases included (an optimizer object's
    fields, which it carries itself).

    >>> option_names("sgd")
    ['lr', 'momentum', 'nesterov', 'weight_decay', 'learning_rate']
    """
    kind = type(value) if isinstance(value, Optimizer) else _kind(value)[0]
    return [f.name for f in dataclasses.fields(kind)] + list(ALIASES)


def optimizer(value: str | Optimizer, **options: Any) -> Optimizer:
    """An optimizer from a name (``"sgd"``, ``"momentum"``, ``"adam"``, ``"adamw"``) or as given.

    ``learning_rate`` is accepted for ``lr``.

    >>> optimizer("momentum", learning_rate=0.1)
    SGD(lr=0.1, momentum=0.9, nesterov=False, weight_decay=0.0)
    """
    if isinstance(value, Optimizer):
        if options:
            raise ConfigurationError(
                message(
                    "An optimizer object carries its own settings",
                    received=sorted(options),
                    fix=f"{type(value).__name__}(..., {next(iter(options))}=...), or pass the optimizer's name "
                    f"({type(value).__name__.lower()!r}) with the options",
                )
            )
        return value
    kind, defaults = _kind(value)
    for alias, name in ALIASES.items():
        if alias in options:
            if name in options:
                raise ConfigurationError(
                    message(f"{alias} is another name for {name}: pass one of them", received=f"{alias}= and {name}=")
                )
            options[name] = options.pop(alias)
    valid = [f.name for f in dataclasses.fields(kind)]
    unknown = [k for k in options if k not in valid]
    if unknown:
        raise ConfigurationError(message(f"Unknown option for optimizer {value!r}", received=unknown[0], choices=valid))
    return kind(**{**defaults, **options})


def _kind(value: str) -> tuple[type[Optimizer], dict[str, Any]]:
    if not isinstance(value, str) or value not in _NAMES:
        raise ConfigurationError(
            message(
                "Unknown optimizer",
                received=value,
                choices=sorted(_NAMES),
                fix="pass one of these names or an xdevice.training optimizer",
            )
        )
    return _NAMES[value]
