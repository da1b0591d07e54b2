"""Control flow of the op set: a Python loop and branch; compiling backends override with their own."""

from __future__ import annotations

from collections.abc import Callable

from xdevice.backends.primitives import Array, Primitives

__all__ = ["ControlFlow"]


class ControlFlow(Primitives):
    """``while_loop`` and ``cond`` of the op set."""

    def compiles_loop(self, values: list) -> bool:
        """Whether a loop of known trip count over ``values`` should run as one
        :meth:`while_loop` rather than unrolled (the ONNX importer asks); no by default."""
        return False

    def while_loop(
        self,
        condition: Callable[[tuple, tuple], Array],
        body: Callable[[tuple, tuple], tuple],
        state: tuple,
        operands: tuple = (),
    ) -> tuple:
        """``state = body(state, operands)`` while ``condition(state, operands)`` (a scalar
        bool) holds; the framework's own loop (``lax.while_loop``, ``tf.while_loop``, torch's
        ``while_loop`` operator) where a backend compiles, so a condition known only at run
        time works under compilation. ``body`` keeps every state array's shape and dtype;
        ``operands`` are the arrays both functions read from outside (torch traces nothing
        else)."""
        while bool(self.to_numpy(condition(state, operands))):
            state = tuple(body(state, operands))
        return tuple(state)

    def cond(
        self, predicate: Array, then: Callable[..., tuple], otherwise: Callable[..., tuple], operands: tuple = ()
    ) -> tuple:
        """``then(*operands)`` if the scalar ``predicate`` holds, else ``otherwise(*operands)``:
        the framework's own branch (``lax.cond``, ``tf.cond``, torch's ``cond`` operator)
        where a backend compiles; both branches then return arrays of the same shapes and
        dtypes."""
        return tuple(then(*operands) if bool(self.to_numpy(predicate)) else otherwise(*operands))
