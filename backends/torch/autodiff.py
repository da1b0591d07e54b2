"""Gradients through torch autograd; ``jit`` is the identity because torch runs eagerly."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from xdevice._errors import XDeviceError, message
from xdevice.backends._model_io import map_leaves

if TYPE_CHECKING:
    from xdevice.backends.torch.ops import TorchOps


class Autodiff:
    ops: ClassVar[TorchOps]  # the assembled backend's

    def value_and_grad(
        self, fn: Callable[..., Any], params: dict[str, Any], *args: Any, has_aux: bool = False
    ) -> tuple[Any, dict[str, Any]]:
        # fresh leaves: the caller's tensors keep their own requires_grad and .grad untouched
        leaves = {name: self.ops.asarray(value).detach() for name, value in params.items()}
        for leaf in leaves.values():
            leaf.requires_grad_(leaf.is_floating_point() or leaf.is_complex())  # ints get zeros
        with torch.enable_grad():  # a caller's no_grad must not silence the gradient
            out = fn(leaves, *args)
        out, aux = out if has_aux else (out, None)
        value, grads = self._grad(out, leaves)
        return ((value, detached(aux)) if has_aux else value), grads

    def _grad(self, out: Any, leaves: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        if not isinstance(out, torch.Tensor) or not out.requires_grad:  # params not used at all
            return out, {name: torch.zeros_like(leaf) for name, leaf in leaves.items()}
        if out.numel() != 1:
            raise XDeviceError(message("value_and_grad needs a scalar", received=f"shape {tuple(out.shape)}"))
        wanted = [name for name, leaf in leaves.items() if leaf.requires_grad]
        grads = dict(zip(wanted, torch.autograd.grad(out, [leaves[n] for n in wanted], allow_unused=True)))
        return out.detach(), {
            name: torch.zeros_like(leaf) if grads.get(name) is None else grads[name] for name, leaf in leaves.items()
        }

    def jit(self, fn: Callable[..., Any], donate: tuple[int, ...] = ()) -> Callable[..., Any]:
        return fn

    def capture(self, fn: Callable[..., Any], *example_args: Any) -> Callable[..., Any]:
        from torch.fx.experimental.proxy_tensor import make_fx

        leaves = torch.utils._pytree.tree_leaves(example_args)
        if not all(isinstance(leaf, torch.Tensor) for leaf in leaves):  # a constant would be baked in
            raise XDeviceError(
                message(
                    "Only tensors can be arguments of a captured torch program",
                    received=sorted({type(leaf).__name__ for leaf in leaves}),
                )
            )
        program = make_fx(fn, tracing_mode="fake")(*example_args)  # fake tensors: no data read, none baked
        simplify(program)
        return program

    def capture_for_calls(self, fn: Callable[..., Any], *example_args: Any) -> Callable[..., Any]:
        """:meth:`capture` for a program that is only called (an imported model's per-call
        program): its common ops called through torch's own bindings (:func:`fast_calls`), while
        a program handed to a user keeps the aten ops ``torch.export`` writes."""
        program = self.capture(fn, *example_args)
        fast_calls(program)
        return program


def simplify(program: torch.fx.GraphModule) -> int:
    """Drop the steps of a captured aten graph that compute nothing, in place; returns how many
    nodes went. Each remaining node costs a Python-level dispatch per call, which is most of a
    small model's time: constants are read as they are (not copied by ``lift_fresh_copy`` on
    every call), a transpose of a transpose, a view / expand / reshape / same-dtype copy to the
    shape and dtype its input already has, and a view of a view of a contiguous tensor are
    skipped, unused results (a layer norm's saved statistics) are not computed, and a matrix
    product plus a bias (an ONNX ``Gemm``'s, or ``MatMul`` then ``Add``) is one ``addmm``, as
    ``nn.Linear`` runs. A value that is written in place, or returned, keeps its own copy.
    """
    aten = torch.ops.aten
    reshapes = (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.expand.default)
    before = len(program.graph.nodes)
    for node in list(program.graph.nodes):
        source = node.args[0] if node.op == "call_function" and node.args else None
        if not isinstance(source, torch.fx.Node) or _written(node) or _written(source):
            continue
        target, value, given = node.target, node.meta.get("val"), source.meta.get("val")
        if not isinstance(value, torch.Tensor) or not isinstance(given, torch.Tensor):
            continue
        replacement = None
        if target is aten.lift_fresh_copy.default or (
            target is aten._to_copy.default and set(node.kwargs) <= {"dtype"} and value.dtype == given.dtype
        ):
            replacement = None if _returned(node) else source
        elif target is aten.t.default and source.target is aten.t.default:
            replacement = source.args[0]
        elif target in reshapes and value.shape == given.shape and value.dtype == given.dtype:
            replacement = source
        elif target in reshapes[:3] and source.target in reshapes[:3] and _contiguous(source.args[0]):
            node.args = (source.args[0], *node.args[1:])  # one view from the contiguous base
        elif target is aten.add.Tensor and not node.kwargs and _bias_of(node) is not None:
            with program.graph.inserting_before(node):  # a dense layer: one kernel, as nn.Linear runs
                replacement = program.graph.call_function(aten.addmm.default, (_bias_of(node), *source.args))
            replacement.meta["val"] = value
        if isinstance(replacement, torch.fx.Node):
            node.replace_all_uses_with(replacement)
    program.graph.eliminate_dead_code()
    program.recompile()
    return before - len(program.graph.nodes)


def fast_calls(program: torch.fx.GraphModule) -> int:
    """Call the common aten ops of a captured graph through torch's own Python bindings
    (``torch.add``, ``Tensor.view``), in place; returns how many nodes now do. A captured
    graph calls ``torch.ops.aten.add.Tensor``: an ``OpOverload``, whose Python ``__call__`` and
    attribute chain cost more than a ``torch.add`` call: at batch 1 that dispatch is most of an
    imported model's time (the zoo transformer runs about 120 ops per call; its row of
    ``benchmarks/convert.py`` compares the imported model with the zoo's). Each binding below
    takes the overload's arguments as they are and, given arguments of the types the trace
    recorded, dispatches to that same overload; ops not listed keep their ``OpOverload``. Run
    it after :func:`simplify`, which reads aten targets."""
    found = 0
    for node in program.graph.nodes:
        fast = _FAST.get(node.target) if node.op == "call_function" else None
        if fast is not None:
            node.target = fast
            found += 1
    if found:
        program.recompile()
    return found


def _fast_bindings() -> dict[Any, Any]:
    aten = torch.ops.aten
    # overloads whose torch.<name> binding takes the same arguments: (op name).(overload)
    same_name = (
        "add.Tensor sub.Tensor mul.Tensor div.Tensor addmm.default mm.default bmm.default permute.default "
        "where.self eq.Tensor eq.Scalar ne.Tensor ne.Scalar lt.Tensor lt.Scalar gt.Tensor gt.Scalar le.Scalar "
        "ge.Scalar logical_not.default logical_or.default logical_and.default bitwise_not.default "
        "bitwise_or.Tensor bitwise_and.Tensor any.dim amax.default sum.dim_IntList mean.dim "
        "index_select.default unsqueeze.default squeeze.dim native_layer_norm.default "
        "split_with_sizes.default scalar_tensor.default clone.default cat.default select.int tanh.default "
        "sigmoid.default relu.default exp.default neg.default sqrt.default rsqrt.default _softmax.default "
        "_scaled_dot_product_flash_attention_for_cpu.default"
    ).split()
    table: dict[Any, Any] = {}
    for spec in same_name:
        name, overload = spec.split(".")
        binding = getattr(torch, name, None)
        if binding is not None and hasattr(aten, name):
            table[getattr(getattr(aten, name), overload)] = binding
    table[aten.gelu.default] = torch._C._nn.gelu
    table[aten.view.default] = torch.Tensor.view
    table[aten.expand.default] = torch.Tensor.expand
    return table


def _bias_of(node: torch.fx.Node) -> torch.fx.Node | None:
    """The bias of ``add(mm(a, b), bias)`` (``node`` the add) when the two make one ``addmm``:
    the product read only by the add, the bias a vector of its columns in its dtype."""
    product, bias = node.args if len(node.args) == 2 else (None, None)
    if not isinstance(product, torch.fx.Node) or product.target is not torch.ops.aten.mm.default:
        return None
    if len(product.users) != 1 or not isinstance(bias, torch.fx.Node):
        return None
    made, added = product.meta.get("val"), bias.meta.get("val")
    fits = isinstance(made, torch.Tensor) and isinstance(added, torch.Tensor)
    return bias if fits and added.shape == made.shape[-1:] and added.dtype == made.dtype else None


def _written(node: torch.fx.Node) -> bool:
    """Whether an op writes into ``node``'s value (an in-place or ``out=`` op reads it)."""
    for user in node.users:
        schema = getattr(user.target, "_schema", None)
        if schema is not None and schema.is_mutable:
            return True
    return False


def _returned(node: torch.fx.Node) -> bool:
    return any(user.op == "output" for user in node.users)


def _contiguous(node: Any) -> bool:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(value, torch.Tensor) and value.is_contiguous()


_FAST = _fast_bindings()


def detached(tree: Any) -> Any:
    """``tree`` (dicts, lists, tuples) with every tensor in it detached from the graph."""
    return map_leaves(lambda value: value.detach() if isinstance(value, torch.Tensor) else value, tree)
