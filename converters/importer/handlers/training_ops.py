"""The ``ai.onnx.preview.training`` domain's optimizer steps (Adagrad, Adam, Momentum).

Each node updates ``n`` tensors at once: its inputs are the learning rate ``R``, the update
count ``T``, then ``n`` tensors of each kind in turn (``X_1..X_n, G_1..G_n, ...``), and its
outputs the new values in the same grouping. ``R`` and ``T`` may be computed at run time, so
the choices on ``T > 0`` are ``where`` on arrays. Every update computes in its tensor's
dtype and returns it in that dtype.
"""

from __future__ import annotations

from xdevice._errors import ConversionError, UnsupportedOp, message
from xdevice.converters.importer.registry import handler

_TRAINING = "ai.onnx.preview.training"


def _groups(node, tensors: tuple, kinds: str) -> list[tuple]:
    """``(X_i, G_i, ...)`` for each tensor the node updates; ``kinds`` names the groups."""
    count = len(kinds)
    if not tensors or len(tensors) % count:
        raise ConversionError(
            message(
                f"{node.op} node {node.name!r} has a wrong number of inputs",
                expected=f"R, T, then {count} groups of equal size ({', '.join(kinds)})",
                received=f"{len(tensors) + 2} inputs",
            )
        )
    n = len(tensors) // count
    return [tuple(tensors[k * n + i] for k in range(count)) for i in range(n)]


def _scalars(ops, r, t, dtype: str):
    """``R`` and ``T`` as scalars of ``dtype``."""
    return ops.reshape(ops.cast(r, dtype), ()), ops.reshape(ops.cast(t, dtype), ())


def _regularized(ops, node, x, g):
    """``norm_coefficient * X + G``: the gradient of ``0.5 * norm_coefficient * ||X||^2`` added."""
    return ops.add(ops.multiply(x, node.attr("norm_coefficient", 0.0)), g)


@handler("Adagrad", since=1, domain=_TRAINING)
def adagrad(ctx, node, r, t, *tensors):
    """``X, G, H`` -> ``X_new, H_new`` for each tensor, with the rate decayed by ``T``."""
    ops = ctx.ops
    decay, epsilon = node.attr("decay_factor", 0.0), node.attr("epsilon", 1e-6)
    xs, hs = [], []
    for x, g, h in _groups(node, tensors, "XGH"):
        dtype = ops.dtype(x)
        rate, step = _scalars(ops, r, t, dtype)
        rate = ops.divide(rate, ops.add(ops.multiply(step, decay), 1.0))
        g = _regularized(ops, node, x, ops.cast(g, dtype))
        h_new = ops.add(ops.cast(h, dtype), ops.multiply(g, g))
        xs.append(ops.subtract(x, ops.divide(ops.multiply(g, rate), ops.add(ops.sqrt(h_new), epsilon))))
        hs.append(ops.cast(h_new, ops.dtype(h)))
    return tuple(xs + hs)


@handler("Adam", since=1, domain=_TRAINING)
def adam(ctx, node, r, t, *tensors):
    """``X, G, V, H`` -> ``X_new, V_new, H_new`` for each tensor; from ``T = 1`` on, the rate
    carries the bias correction ``sqrt(1 - beta^T) / (1 - alpha^T)``."""
    ops = ctx.ops
    alpha, beta = node.attr("alpha", 0.9), node.attr("beta", 0.999)
    epsilon, post = node.attr("epsilon", 1e-6), node.attr("norm_coefficient_post", 0.0)
    xs, vs, hs = [], [], []
    for x, g, v, h in _groups(node, tensors, "XGVH"):
        dtype = ops.dtype(x)
        rate, step = _scalars(ops, r, t, dtype)
        started = ops.greater(step, 0)
        correction = ops.divide(
            ops.sqrt(ops.subtract(1.0, ops.power(beta, step))),
            ops.where(started, ops.subtract(1.0, ops.power(alpha, step)), 1.0),  # T = 0 would divide by 0
        )
        rate = ops.where(started, ops.multiply(rate, correction), rate)
        g = _regularized(ops, node, x, ops.cast(g, dtype))
        v_new = ops.add(ops.multiply(ops.cast(v, dtype), alpha), ops.multiply(g, 1.0 - alpha))
        h_new = ops.add(ops.multiply(ops.cast(h, dtype), beta), ops.multiply(ops.multiply(g, g), 1.0 - beta))
        x_new = ops.subtract(x, ops.multiply(rate, ops.divide(v_new, ops.add(ops.sqrt(h_new), epsilon))))
        xs.append(ops.multiply(x_new, 1.0 - post))
        vs.append(ops.cast(v_new, ops.dtype(v)))
        hs.append(ops.cast(h_new, ops.dtype(h)))
    return tuple(xs + vs + hs)


@handler("Momentum", since=1, domain=_TRAINING)
def momentum(ctx, node, r, t, *tensors):
    """``X, G, V`` -> ``X_new, V_new`` for each tensor, standard or Nesterov momentum; at
    ``T = 0`` the gradient enters the momentum with weight 1 instead of ``beta``."""
    ops = ctx.ops
    mode = node.attr("mode", "standard")
    if mode not in ("standard", "nesterov"):
        raise UnsupportedOp(
            message(f"Momentum node {node.name!r} has an unknown mode", received=mode, choices=["standard", "nesterov"])
        )
    alpha, beta = node.attr("alpha"), node.attr("beta")
    xs, vs = [], []
    for x, g, v in _groups(node, tensors, "XGV"):
        dtype = ops.dtype(x)
        rate, step = _scalars(ops, r, t, dtype)
        g = _regularized(ops, node, x, ops.cast(g, dtype))
        weight = ops.add(ops.multiply(ops.cast(ops.greater(step, 0), dtype), beta - 1.0), 1.0)  # beta, or 1
        v_new = ops.add(ops.multiply(ops.cast(v, dtype), alpha), ops.multiply(g, weight))
        direction = v_new if mode == "standard" else ops.add(g, ops.multiply(v_new, alpha))
        xs.append(ops.subtract(x, ops.multiply(direction, rate)))
        vs.append(ops.cast(v_new, ops.dtype(v)))
    return tuple(xs + vs)
