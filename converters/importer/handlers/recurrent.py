"""ONNX handlers: recurrent layers (RNN, GRU, LSTM), both directions, with sequence lengths,
initial states, clipping and every activation ONNX names.

A plain LSTM, or a GRU with ``linear_before_reset`` (what PyTorch and Keras export), runs
through the op set's ``lstm`` / ``gru`` (one fused kernel or scan where the framework has
one), its gates reordered; everything else steps through time here. The reordering reads the
weights alone: registered with ``prepares``, an imported model does it once per state of the
weights, not in every call.
"""

from __future__ import annotations

import numpy as np

from xdevice.converters.importer.handlers._nn import _rank, _unsupported
from xdevice.converters.importer.registry import handler, prepares

# -- recurrent layers -------------------------------------------------------------------------


def _affine(ops, x, alpha, beta):
    return ops.add(ops.multiply(x, alpha), beta)


#: ONNX's recurrent activation names (lower-cased) -> (function, default alpha, default beta)
_ACTIVATIONS = {
    "sigmoid": (lambda ops, x, a, b: ops.sigmoid(x), None, None),
    "tanh": (lambda ops, x, a, b: ops.tanh(x), None, None),
    "relu": (lambda ops, x, a, b: ops.relu(x), None, None),
    "affine": (_affine, 1.0, 0.0),
    "leakyrelu": (lambda ops, x, a, b: ops.where(ops.less(x, 0), ops.multiply(x, a), x), 0.01, None),
    "thresholdedrelu": (lambda ops, x, a, b: ops.where(ops.greater(x, a), x, 0.0), 1.0, None),
    "scaledtanh": (lambda ops, x, a, b: ops.multiply(ops.tanh(ops.multiply(x, b)), a), 1.0, 1.0),
    "hardsigmoid": (lambda ops, x, a, b: ops.clip(_affine(ops, x, a, b), 0.0, 1.0), 0.2, 0.5),
    "elu": (
        lambda ops, x, a, b: ops.where(ops.less(x, 0), ops.multiply(ops.subtract(ops.exp(x), 1.0), a), x),
        1.0,
        None,
    ),
    "softsign": (lambda ops, x, a, b: ops.divide(x, ops.add(ops.abs(x), 1.0)), None, None),
    "softplus": (lambda ops, x, a, b: ops.softplus(x), None, None),
}


def _activations(node, defaults: list[str], directions: int):
    """One list of callables ``f(ops, x)`` per direction; ``activation_alpha`` and
    ``activation_beta`` are consumed in order by the activations that take them."""
    names = list(node.attr("activations", None) or defaults * directions)
    alphas = list(node.attr("activation_alpha", None) or [])
    betas = list(node.attr("activation_beta", None) or [])
    funcs = []
    for name in names:
        key = name.lower()
        if key not in _ACTIVATIONS:
            _unsupported(node, "activation", name, sorted(_ACTIVATIONS))
        fn, alpha, beta = _ACTIVATIONS[key]
        if alpha is not None:
            alpha = alphas.pop(0) if alphas else alpha
        if beta is not None:
            beta = betas.pop(0) if betas else beta
        funcs.append(lambda ops, x, fn=fn, a=alpha, b=beta: fn(ops, x, a, b))
    per = len(defaults)
    if len(funcs) != per * directions:
        _unsupported(node, "number of activations", len(funcs), [str(per * directions)])
    return [funcs[d * per : (d + 1) * per] for d in range(directions)]


def _reverse_steps(ops, x, lengths):
    """``x`` (T, B, ...) with each batch entry's first ``lengths[b]`` steps reversed (the
    padding after them stays in place), or the whole time axis when no lengths."""
    if lengths is None:
        return ops.flip(x, (0,))  # a tuple: the torch backend rejects an int axis
    steps = ops.shape(x)[0]
    t = ops.asarray(np.arange(steps).reshape(steps, 1), dtype="int64")
    index = ops.where(ops.less(t, lengths), ops.subtract(ops.subtract(lengths, 1), t), t)  # (T, B)
    index = ops.reshape(index, (*ops.shape(index), *([1] * (_rank(ops, x) - 2))))
    return ops.take_along_axis(x, ops.broadcast_to(index, ops.shape(x)), axis=0)


def _recurrent(ctx, node, x, w, r, b, lengths, states, step, defaults, gates: int):
    """Shared driver of RNN, GRU and LSTM: layout, directions, sequence lengths, clipping.

    ``step(ops, acts, x_proj_t, states, r, rb) -> states`` computes one step where
    ``x_proj_t = x_t @ W^T + Wb`` and ``states[0]`` is the hidden state. Past a batch
    entry's length the states hold and the output is zero."""
    ops = ctx.ops
    layout = node.attr("layout", 0)
    if layout:
        x = ops.transpose(x, (1, 0, 2))
        states = [None if s is None else ops.transpose(s, (1, 0, 2)) for s in states]
    steps, batch = ops.shape(x)[:2]
    directions = ops.shape(w)[0]
    hidden = ops.shape(r)[-1]
    dtype = ops.dtype(x)
    direction = node.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        _unsupported(node, "direction", direction, ["forward", "reverse", "bidirectional"])
    acts = _activations(node, defaults, directions)
    clip = node.attr("clip", None)
    if lengths is not None:
        lengths = ops.reshape(ops.cast(lengths, "int64"), (1, -1))  # (1, B)
    ys, finals = [], []
    for d in range(directions):
        reverse = direction == "reverse" or d == 1
        xs = _reverse_steps(ops, x, lengths) if reverse else x
        wb = ops.take(b, d, axis=0) if b is not None else None
        proj = ops.matmul(xs, ops.swap_last(ops.take(w, d, axis=0)))  # (T, B, gates*H)
        if wb is not None:
            proj = ops.add(proj, ops.slice(wb, [0], [gates * hidden]))
        rb = ops.slice(wb, [gates * hidden], [2 * gates * hidden]) if wb is not None else None
        rd = ops.swap_last(ops.take(r, d, axis=0))
        current = [ops.zeros((batch, hidden), dtype) if s is None else ops.take(s, d, axis=0) for s in states]
        outputs = []
        for t in range(steps):
            new = step(ops, acts[d], ops.take(proj, t, axis=0), current, rd, rb, clip, d)
            if lengths is not None:
                alive = ops.reshape(ops.less(t, lengths), (-1, 1))
                new = [ops.where(alive, n, c) for n, c in zip(new, current)]
                outputs.append(ops.where(alive, new[0], ops.zeros((), dtype)))
            else:
                outputs.append(new[0])
            current = new
        y = ops.stack(outputs, axis=0)  # (T, B, H)
        ys.append(_reverse_steps(ops, y, lengths) if reverse else y)
        finals.append(current)
    y = ops.stack(ys, axis=1)  # (T, dirs, B, H)
    last = [ops.stack([f[i] for f in finals], axis=0) for i in range(len(states))]  # (dirs, B, H)
    if layout:
        y = ops.transpose(y, (2, 0, 1, 3))
        last = [ops.transpose(s, (1, 0, 2)) for s in last]
    return (y, *last)


def _plain(node, defaults: list[str], has_lengths: bool, directions: int) -> bool:
    """Whether the node computes what the op set's fused layer computes: default
    activations, no clipping, every sequence at full length."""
    names = [n.lower() for n in (node.attr("activations", None) or defaults * directions)]
    return (
        not has_lengths
        and node.attr("clip", None) is None
        and not node.attr("activation_alpha", None)
        and not node.attr("activation_beta", None)
        and names == [n.lower() for n in defaults] * directions
    )


def _gates(ops, m, order: tuple[int, ...]):
    """``m``'s gate blocks along axis 0 (or a bias's) put in the op set's ``order``."""
    blocks = ops.split(m, len(order), axis=0)
    return ops.concat([blocks[i] for i in order], axis=0)


def _given(node, position: int) -> bool:
    """Whether the node names an input at ``position`` (ONNX leaves an optional one out, or
    names it "")."""
    return position < len(node.inputs) and bool(node.inputs[position])


def _fused_weights(ops, w, r, b, order: tuple[int, ...], summed: bool) -> tuple:
    """Per direction, one after the other: ``w_ih (in, G*H)`` and ``w_hh (H, G*H)`` with the
    gates in the op set's ``order``, then the input and recurrent biases (zeros without ``b``),
    or their sum where ``summed``. Only the weights are read: see ``prepares``."""
    hidden = ops.shape(r)[-1]
    size = len(order) * hidden
    found: list = []
    for d in range(ops.shape(w)[0]):
        w_ih = ops.swap_last(_gates(ops, ops.take(w, d, axis=0), order))
        w_hh = ops.swap_last(_gates(ops, ops.take(r, d, axis=0), order))
        if b is None:
            wb = rb = ops.zeros((size,), ops.dtype(w))
        else:
            bias = ops.take(b, d, axis=0)
            wb, rb = (_gates(ops, ops.slice(bias, [i * size], [(i + 1) * size]), order) for i in (0, 1))
        found += [w_ih, w_hh, ops.add(wb, rb)] if summed else [w_ih, w_hh, wb, rb]
    return tuple(found)


def _fused(ctx, node, x, r, states, weights: tuple, layer):
    """Both directions and both layouts around one call per direction of
    ``layer(ops, x (B, T, in), initial states, *that direction's weights)
    -> (outputs (B, T, H), *final states)``, ``weights`` as ``_fused_weights`` makes them."""
    ops = ctx.ops
    layout = node.attr("layout", 0)
    xs = x if layout else ops.transpose(x, (1, 0, 2))  # (B, T, in)
    if layout:
        states = [None if s is None else ops.transpose(s, (1, 0, 2)) for s in states]
    batch, hidden, dtype = ops.shape(xs)[0], ops.shape(r)[-1], ops.dtype(x)
    directions = ops.shape(r)[0]
    per = len(weights) // directions
    reverse_only = node.attr("direction", "forward") == "reverse"
    ys, finals = [], []
    for d in range(directions):
        reverse = reverse_only or d == 1
        initial = [ops.zeros((batch, hidden), dtype) if s is None else ops.take(s, d, axis=0) for s in states]
        mine = weights[d * per : (d + 1) * per]
        out, *last = layer(ops, ops.flip(xs, (1,)) if reverse else xs, initial, *mine)
        ys.append(ops.flip(out, (1,)) if reverse else out)
        finals.append(last)
    y = ops.stack(ys, axis=2)  # (B, T, dirs, H)
    last = [ops.stack([f[i] for f in finals], axis=1) for i in range(len(states))]  # (B, dirs, H)
    if not layout:
        y = ops.transpose(y, (1, 2, 0, 3))  # (T, dirs, B, H)
        last = [ops.transpose(s, (1, 0, 2)) for s in last]
    return (y, *last)


def _clip(ops, x, clip):
    return x if clip is None else ops.clip(x, -clip, clip)


def _rnn_step(ops, acts, xp, states, rd, rb, clip, d):
    gates = ops.add(xp, ops.matmul(states[0], rd))
    if rb is not None:
        gates = ops.add(gates, rb)
    return [acts[0](ops, _clip(ops, gates, clip))]


@handler("RNN", since=1)
def rnn(ctx, node, x, w, r, b=None, sequence_lens=None, initial_h=None):
    """``H = f(X W^T + H R^T + Wb + Rb)``, ``f`` defaulting to Tanh."""
    return _recurrent(ctx, node, x, w, r, b, sequence_lens, [initial_h], _rnn_step, ["Tanh"], 1)


def _gru_step_factory(linear_before_reset: bool):
    def step(ops, acts, xp, states, rd, rb, clip, d):
        f, g = acts
        h = states[0]
        xz, xr, xh = ops.split(xp, 3, axis=-1)
        rz, rr, rh = ops.split(rd, 3, axis=-1)
        bz, br, bh = ops.split(rb, 3, axis=-1) if rb is not None else (None, None, None)
        plus = lambda a, bias: a if bias is None else ops.add(a, bias)
        z = f(ops, _clip(ops, plus(ops.add(xz, ops.matmul(h, rz)), bz), clip))
        reset = f(ops, _clip(ops, plus(ops.add(xr, ops.matmul(h, rr)), br), clip))
        if linear_before_reset:
            candidate = ops.add(xh, ops.multiply(reset, plus(ops.matmul(h, rh), bh)))
        else:
            candidate = plus(ops.add(xh, ops.matmul(ops.multiply(reset, h), rh)), bh)
        candidate = g(ops, _clip(ops, candidate, clip))
        return [ops.add(ops.multiply(ops.subtract(1.0, z), candidate), ops.multiply(z, h))]

    return step


_GRU_ORDER = (1, 0, 2)  # z r h -> r z n
_LSTM_ORDER = (0, 2, 3, 1)  # i o f c -> i f g o


def _gru_fuses(node, has_lengths: bool, directions: int) -> bool:
    return bool(node.attr("linear_before_reset", 0)) and _plain(node, ["Sigmoid", "Tanh"], has_lengths, directions)


@prepares("GRU", inputs=(1, 2, 3))
def gru_weights(ctx, node, w, r, b=None):
    """A fused GRU's weights in the op set's layout (see ``_fused_weights``); None where the
    node steps through time here."""
    if not _gru_fuses(node, _given(node, 4), ctx.ops.shape(w)[0]):
        return None
    return _fused_weights(ctx.ops, w, r, b, _GRU_ORDER, summed=False)


@handler("GRU", since=1)
def gru(ctx, node, x, w, r, b=None, sequence_lens=None, initial_h=None):
    """ONNX's GRU with gates ``z, r, h`` in W, R and B (not the op set's ``r, z, n``);
    ``linear_before_reset`` applies the reset gate after ``H R_h^T + Rb_h``."""
    if _gru_fuses(node, sequence_lens is not None, ctx.ops.shape(w)[0]):
        weights = ctx.prepared or _fused_weights(ctx.ops, w, r, b, _GRU_ORDER, summed=False)
        return _fused(
            ctx,
            node,
            x,
            r,
            [initial_h],
            weights,
            lambda ops, xs, init, wi, wh, wb, rb: ops.gru(xs, init[0], wi, wh, wb, rb),
        )
    step = _gru_step_factory(bool(node.attr("linear_before_reset", 0)))
    return _recurrent(ctx, node, x, w, r, b, sequence_lens, [initial_h], step, ["Sigmoid", "Tanh"], 3)


def _lstm_fuses(node, has_lengths: bool, has_peepholes: bool, directions: int) -> bool:
    return (
        not has_peepholes
        and not node.attr("input_forget", 0)
        and _plain(node, ["Sigmoid", "Tanh", "Tanh"], has_lengths, directions)
    )


@prepares("LSTM", inputs=(1, 2, 3))
def lstm_weights(ctx, node, w, r, b=None):
    """A fused LSTM's weights in the op set's layout, its two biases summed (see
    ``_fused_weights``); None where the node steps through time here."""
    if not _lstm_fuses(node, _given(node, 4), _given(node, 7), ctx.ops.shape(w)[0]):
        return None
    return _fused_weights(ctx.ops, w, r, b, _LSTM_ORDER, summed=True)


@handler("LSTM", since=1)
def lstm(ctx, node, x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None):
    """ONNX's LSTM with gates ``i, o, f, c`` in W, R and B (not the op set's ``i, f, g, o``),
    peepholes ``P = [Pi, Po, Pf]`` and ``input_forget`` coupling ``f = 1 - i``."""
    ops = ctx.ops
    couple = bool(node.attr("input_forget", 0))
    if _lstm_fuses(node, sequence_lens is not None, p is not None, ops.shape(w)[0]):
        weights = ctx.prepared or _fused_weights(ops, w, r, b, _LSTM_ORDER, summed=True)
        return _fused(
            ctx,
            node,
            x,
            r,
            [initial_h, initial_c],
            weights,
            lambda ops, xs, init, wi, wh, bias: ops.lstm(xs, *init, wi, wh, bias),
        )

    def step(ops, acts, xp, states, rd, rb, clip, d):
        f, g, h_act = acts
        h, c = states
        gates = ops.add(xp, ops.matmul(h, rd))
        if rb is not None:
            gates = ops.add(gates, rb)
        gi, go, gf, gc = ops.split(gates, 4, axis=-1)
        pi, po, pf = ops.split(ops.take(p, d, axis=0), 3) if p is not None else (None, None, None)
        peep = lambda a, weight, state: a if weight is None else ops.add(a, ops.multiply(weight, state))
        i = f(ops, _clip(ops, peep(gi, pi, c), clip))
        forget = ops.subtract(1.0, i) if couple else f(ops, _clip(ops, peep(gf, pf, c), clip))
        c_new = ops.add(ops.multiply(forget, c), ops.multiply(i, g(ops, _clip(ops, gc, clip))))
        o = f(ops, _clip(ops, peep(go, po, c_new), clip))
        return [ops.multiply(o, h_act(ops, c_new)), c_new]

    del ops
    return _recurrent(
        ctx, node, x, w, r, b, sequence_lens, [initial_h, initial_c], step, ["Sigmoid", "Tanh", "Tanh"], 4
    )
