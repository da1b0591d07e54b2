"""Optimizer updates over many tensors at once, with PyTorch's rules: SGD, Adam/AdamW, clipping.

``xdevice.training.optimizers`` calls them once a step over every parameter; a backend may
fuse one (PyTorch: ``torch._foreach_*`` in place).
"""

from __future__ import annotations

import functools
from typing import Any

from xdevice.backends.composite import HALF_DTYPES, CompositeOps
from xdevice.backends.primitives import Array

__all__ = ["OptimizerUpdates"]


def _in_dtype(ops: Any, lr: Any, dtype: str) -> Any:
    """A learning rate for parameters of ``dtype``: a number as it is, a scalar array (a
    schedule's rate inside a compiled step) cast to that dtype."""
    return lr if isinstance(lr, (int, float)) else ops.cast(lr, dtype)


class OptimizerUpdates(CompositeOps):
    """The optimizer updates of the op set (``Ops.sgd_update``, ``Ops.adam_update``...)."""

    def sgd_update(
        self,
        params: list[Array],
        grads: list[Array],
        buffers: list[Array] | None,
        *,
        lr: float,
        momentum: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
        inplace: bool = False,
    ) -> tuple[list[Array], list[Array] | None]:
        """One step of ``torch.optim.SGD`` over every tensor: ``(params, momentum buffers)``.

        ``buffers`` are the momentum buffers (None without momentum). With ``inplace`` a backend
        may write the results into ``params`` and ``buffers`` and return those: the caller
        promises to keep no old values (the trainer does); the math is the same either way.
        """
        new_params, new_buffers = [], []
        for i, (param, grad) in enumerate(zip(params, grads)):
            grad = self.cast(grad, self.dtype(param))
            rate = _in_dtype(self, lr, self.dtype(param))
            if weight_decay:
                grad = self.add(grad, self.multiply(param, weight_decay))
            if momentum:
                assert buffers is not None  # the optimizer keeps one buffer per parameter with momentum
                buffer = self.add(self.multiply(buffers[i], momentum), grad)
                new_buffers.append(buffer)
                grad = self.add(grad, self.multiply(buffer, momentum)) if nesterov else buffer
            new_params.append(self.subtract(param, self.multiply(grad, rate)))
        return new_params, new_buffers if momentum else None

    def clip_by_global_norm(self, grads: list[Array], max_norm: float) -> list[Array]:
        """``grads`` scaled by ``min(1, max_norm / (norm + 1e-6))``, ``norm`` the L2 norm of them
        all together: ``torch.nn.utils.clip_grad_norm_``'s rule."""
        if not grads:
            return grads
        squares = [self.sum(self.square(self.cast(g, "float32") if self.dtype(g) in HALF_DTYPES else g)) for g in grads]
        total = self.sqrt(functools.reduce(self.add, squares))
        scale = self.minimum(self.divide(max_norm, self.add(total, 1e-6)), 1.0)
        return [self.multiply(g, self.cast(scale, self.dtype(g))) for g in grads]  # one scale, any dtype

    def clip_by_value(self, grads: list[Array], limit: float) -> list[Array]:
        """Each gradient element clamped to ``[-limit, limit]``: ``clip_grad_value_``'s rule."""
        return [self.clip(g, -limit, limit) for g in grads]

    def adam_update(
        self,
        params: list[Array],
        grads: list[Array],
        m: list[Array],
        v: list[Array],
        step: Array,
        *,
        lr: float,
        beta1: float,
        beta2: float,
        eps: float,
        weight_decay: float = 0.0,
        decoupled: bool = False,
        inplace: bool = False,
    ) -> tuple[list[Array], list[Array], list[Array]]:
        """One step of ``torch.optim.Adam`` (``decoupled``: ``AdamW``) over every tensor, at
        ``step`` (counted from 1): ``(params, m, v)``. Bias corrections are computed once per
        step and dtype. ``inplace`` as in :meth:`sgd_update`."""
        corrections: dict[str, tuple[Array, Array]] = {}
        new_params, new_m, new_v = [], [], []
        for param, grad, m_i, v_i in zip(params, grads, m, v):
            dtype = self.dtype(param)
            if dtype not in corrections:
                t, one = self.cast(step, dtype), self.asarray(1.0, dtype)
                corrections[dtype] = (
                    self.subtract(one, self.power(self.asarray(beta1, dtype), t)),
                    self.subtract(one, self.power(self.asarray(beta2, dtype), t)),
                )
            correction1, correction2 = corrections[dtype]
            grad = self.cast(grad, dtype)
            rate = _in_dtype(self, lr, dtype)
            if weight_decay and decoupled:
                param = self.multiply(
                    param,
                    1 - lr * weight_decay
                    if isinstance(lr, (int, float))
                    else self.subtract(1.0, self.multiply(rate, weight_decay)),
                )
            elif weight_decay:
                grad = self.add(grad, self.multiply(param, weight_decay))
            m_i = self.add(self.multiply(m_i, beta1), self.multiply(grad, 1 - beta1))
            v_i = self.add(self.multiply(v_i, beta2), self.multiply(self.square(grad), 1 - beta2))
            # PyTorch's order of operations: lr / c1 * m / (sqrt(v) / sqrt(c2) + eps)
            denominator = self.add(self.divide(self.sqrt(v_i), self.sqrt(correction2)), eps)
            change = self.multiply(self.divide(self.asarray(rate, dtype), correction1), self.divide(m_i, denominator))
            new_params.append(self.subtract(param, change))
            new_m.append(m_i)
            new_v.append(v_i)
        return new_params, new_m, new_v
