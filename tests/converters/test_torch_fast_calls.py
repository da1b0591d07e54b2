"""A captured torch graph calls its common ops through torch's own bindings (``torch.add``),
not ``torch.ops.aten`` overloads, and computes exactly what the aten graph computes."""

from __future__ import annotations

import numpy as np
import pytest

from xdevice import models
from xdevice.converters import export
from xdevice.converters.importer import from_onnx

torch = pytest.importorskip("torch")
pytest.importorskip("onnx", reason="ONNX import tests need onnx (pip install onnx)")

from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402  after the skip without torch

from xdevice.backends.torch.autodiff import fast_calls, simplify  # noqa: E402  after the skip without torch


def _block(x, w, b, mask):
    """Ops a transformer block captures: addmm, views, permutes, layer norm, gelu, where, any."""
    y = torch.nn.functional.layer_norm(x, (x.shape[-1],))
    y = torch.nn.functional.gelu(torch.addmm(b, y.reshape(-1, y.shape[-1]), w)).reshape(x.shape)
    heads = y.view(x.shape[0], x.shape[1], 2, -1).permute(0, 2, 1, 3)
    keep = mask.any(dim=-1, keepdim=True)
    return torch.where(keep, heads * 2.0 + 1, 0.0).sum(dim=1), keep


def _args():
    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.normal(size=(3, 5, 8)).astype(np.float32))
    w, b = (torch.as_tensor(rng.normal(size=s).astype(np.float32)) for s in ((8, 8), (8,)))
    mask = torch.as_tensor(rng.random((3, 2, 5, 1)) < 0.5)
    return x, w, b, mask


def test_the_rewritten_graph_calls_torch_bindings_and_computes_the_same():
    args = _args()
    program = make_fx(_block, tracing_mode="fake")(*args)
    simplify(program)
    expected = program(*args)
    aten_calls = sum(isinstance(n.target, torch._ops.OpOverload) for n in program.graph.nodes)
    rewritten = fast_calls(program)
    assert rewritten >= 8 and "torch.ops.aten.addmm" not in program.code and "torch.addmm(" in program.code
    assert sum(isinstance(n.target, torch._ops.OpOverload) for n in program.graph.nodes) == aten_calls - rewritten
    for got, want in zip(program(*args), expected, strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_gradients_flow_through_the_rewritten_graph():
    x, w, b, mask = _args()
    w.requires_grad_(True)
    program = make_fx(_block, tracing_mode="fake")(x, w.detach(), b, mask)
    fast_calls(program)
    program(x, w, b, mask)[0].sum().backward()
    reference = w.detach().clone().requires_grad_(True)
    _block(x, reference, b, mask)[0].sum().backward()
    torch.testing.assert_close(w.grad, reference.grad)


def test_the_imported_zoo_transformer_runs_torch_bindings_and_matches_the_zoo():
    model = models.build("transformer", seed=0)
    placed = model.to("torch")
    imported = from_onnx(export(placed, example_inputs=model.example_input(2)).model, backend="torch")
    x = model.example_input(3, seed=1)
    got = imported(torch.as_tensor(x))
    [program] = imported._programs.values()  # the call's captured program
    calls = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert torch.addmm in calls and torch._scaled_dot_product_flash_attention_for_cpu in calls
    assert torch.ops.aten.addmm.default not in calls and torch.ops.aten.view.default not in calls
    with torch.no_grad():
        zoo = placed(torch.as_tensor(x))
    np.testing.assert_allclose(got.detach().numpy(), zoo.numpy(), rtol=0, atol=1e-6)
