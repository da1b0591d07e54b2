"""The op registry: one handler per ONNX op and opset version, resolved through onnx.defs.

A handler is a function ``fn(ctx, node, *inputs) -> output | tuple`` registered for the
opset version at which its semantics start::

    @handler("Relu", since=6)
    def relu(ctx, node, x):
        return ctx.ops.relu(x)

For a model's opset, ``onnx.defs.get_schema`` names the op's ``since_version`` there, and
the handler registered with the largest ``since`` not above it runs. So a handler covers
later versions that only widened the types; where the meaning changed, register again at
that version. ``static`` lists input positions that must be known when the graph is
built (shapes, axes, pads...): they arrive as numpy arrays.

A handler whose op does work on its weight inputs alone (an LSTM's gate reordering) registers
that part with ``prepares(op, inputs)``: an imported model runs it once per state
of the weights and the handler finds the result in ``ctx.prepared`` (None when it must do the
work itself); ``ctx.given`` holds the node's inputs before they became the backend's arrays.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable

__all__ = ["Handler", "handler", "prepares", "resolve", "HANDLER_MODULES", "PREPARATIONS"]

#: default-domain op -> (positions of its weight inputs, their preparation), see :func:`prepares`
PREPARATIONS: dict[str, tuple[tuple[int, ...], Callable]] = {}

#: The modules that hold handlers, imported together on first use.
HANDLER_MODULES = (
    "elementwise",
    "tensor",
    "reduce",
    "normalization",
    "softmax",
    "convolution",
    "pooling",
    "attention",
    "recurrent",
    "image",
    "sequence",
    "control",
    "quantize",
    "signal",
    "detection",
    "ml",
    "training_ops",
)

_registry: dict[tuple[str, str], list[Handler]] = {}
_loaded = False


@dataclasses.dataclass(frozen=True)
class Handler:
    op: str
    domain: str
    since: int
    fn: Callable
    static: tuple[int, ...] = ()


def handler(op: str, since: int, *, domain: str = "", static: tuple[int, ...] = ()) -> Callable:
    """Register ``fn`` for ``op`` from opset version ``since`` (see the module docstring)."""

    def register(fn: Callable) -> Callable:
        _registry.setdefault((domain, op), []).append(Handler(op, domain, since, fn, tuple(static)))
        return fn

    return register


def resolve(op: str, domain: str, opset: int) -> tuple[Handler | None, int | None]:
    """The handler for ``op`` in a model of ``opset``, and the schema's since_version.

    Returns ``(None, since)`` when the op exists but no handler covers that version, and
    ``(None, None)`` when the op is unknown to onnx.defs.
    """
    import onnx.defs

    _load()
    domain = "" if domain == "ai.onnx" else domain
    try:
        since = onnx.defs.get_schema(op, opset, domain).since_version
    except onnx.defs.SchemaError:
        return None, None
    candidates = [h for h in _registry.get((domain, op), []) if h.since <= since]
    return (max(candidates, key=lambda h: h.since) if candidates else None), since


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for name in HANDLER_MODULES:
            importlib.import_module(f"xdevice.converters.importer.handlers.{name}")


def prepares(op: str, inputs: tuple[int, ...]) -> Callable:
    """Register ``fn(ctx, node, *weight_inputs) -> tuple of arrays | None`` as the part of the
    default-domain ``op``'s handler that computes on its inputs at positions ``inputs`` alone.
    Where those inputs are weights and constants, an ``ImportedModel`` runs ``fn`` once per
    state of the weights and the handler finds its results in ``ctx.prepared`` (None where it
    did not run); ``fn`` returns None for a node it has nothing to prepare for. Results must
    be what the handler would compute itself, so that a call gives the same values either way.
    """

    def register(fn: Callable) -> Callable:
        PREPARATIONS[op] = (inputs, fn)
        return fn

    return register
