"""``remat``: recomputing each block's activations in the backward pass changes no output and no
gradient, ``fit(..., remat=True)`` trains, a model without blocks refuses it, and the memory
estimate counts what it keeps."""

from __future__ import annotations

import numpy as np
import pytest

from xdevice import ConfigurationError, fit, models
from xdevice.training.memory import estimate_memory


def outputs_and_gradients(backend, name: str, remat: bool):
    """``(outputs, updated buffers, gradients)`` of one training forward of ``name``'s SMALL
    configuration, as numpy; the gradient is of the outputs' sum of squares."""
    model = models.build(name, backend=backend.name, seed=0, remat=remat, **models.definition(name).SMALL)
    ops = backend.ops

    def objective(params, x):
        out, updates = model.apply(ops, params, x, train=True)
        return ops.sum(ops.multiply(out, out)), (out, updates)

    x = ops.asarray(model.example_input(2, seed=0))
    (_, (out, updates)), grads = backend.value_and_grad(objective, model.params, x, has_aux=True)
    numpy = lambda tree: {k: ops.to_numpy(v) for k, v in tree.items()}
    return ops.to_numpy(out), numpy(updates), numpy(grads)


@pytest.mark.realworld_on("jax", "tensorflow")
@pytest.mark.parametrize("name", ["gpt2", "resnet50"])
def test_remat_changes_no_output_and_no_gradient(backend, name):
    out, updates, grads = outputs_and_gradients(backend, name, remat=False)
    out_remat, updates_remat, grads_remat = outputs_and_gradients(backend, name, remat=True)
    np.testing.assert_array_equal(out_remat, out)  # the same ops in the same order
    assert list(updates_remat) == list(updates)  # resnet50's running statistics leave its blocks
    for key in updates:
        np.testing.assert_array_equal(updates_remat[key], updates[key])
    assert list(grads_remat) == list(grads)
    for key in grads:
        np.testing.assert_allclose(grads_remat[key], grads[key], rtol=1e-5, atol=1e-6, err_msg=key)


def test_torch_keeps_less_for_the_backward_pass_with_remat():
    torch = pytest.importorskip("torch")

    def saved(remat: bool) -> int:
        model = models.build("gpt2", backend="torch", remat=remat, **{**models.definition("gpt2").SMALL, "blocks": 4})
        x = torch.as_tensor(model.example_input(2, seed=0))
        params = {k: v.detach().requires_grad_(v.is_floating_point()) for k, v in model.params.items()}
        sizes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.nbytes) or t, lambda t: t):
            model.apply(model.ops, params, x, train=True)[0].square().sum()
        return sum(sizes)

    assert saved(True) < saved(False) / 2


def test_inference_and_generation_do_not_recompute():
    model = models.build("gpt2", seed=0, remat=True, **models.definition("gpt2").SMALL)
    plain = models.build("gpt2", seed=0, **models.definition("gpt2").SMALL)
    ids = model.example_input(2, seed=0)[:, :5]
    np.testing.assert_array_equal(model(ids), plain(ids))
    np.testing.assert_array_equal(model.generate(ids, max_new_tokens=3), plain.generate(ids, max_new_tokens=3))


def test_fit_with_remat_lowers_the_loss_on_torch():
    pytest.importorskip("torch")
    model = models.build("gpt2", backend="torch", seed=1, **models.definition("gpt2").SMALL)
    x = model.example_input(8, seed=0)
    history = fit(model, (x, np.roll(x, -1, axis=1)), lr=0.01, epochs=5, batch_size=8, verbose=0, remat=True)
    assert history.steps[-1] < 0.95 * history.steps[0], history.steps
    assert model.spec["remat"] is False  # set for the run only


def test_fit_refuses_remat_for_a_model_without_blocks():
    model = models.build("mlp", inputs=4, hidden=[8], classes=2)
    with pytest.raises(ConfigurationError, match=r"remat=True .* Expected a zoo model built as one of .*gpt2"):
        fit(model, (np.zeros((4, 4), "float32"), np.zeros(4, "int64")), remat=True, verbose=0)


def test_the_memory_estimate_counts_less_activation_memory_with_remat():
    config = {**models.definition("gpt2").SMALL, "blocks": 6}
    kept = estimate_memory("gpt2", batch=4, measure=False, **config)
    recomputed = estimate_memory("gpt2", batch=4, measure=False, remat=True, **config)
    activations = "activations (forward)"
    assert recomputed.parts[activations] < kept.parts[activations] / 2
    assert {k: v for k, v in recomputed.parts.items() if k != activations} == {
        k: v for k, v in kept.parts.items() if k != activations
    }
