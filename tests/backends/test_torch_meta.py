"""The torch op set makes every tensor where the model's tensors are, never silently on the CPU.

torch's ``meta`` device stands in for CUDA: a tensor that lands on the CPU while the weights
and the input are on ``meta`` meets them in an op and raises a device mismatch, as it would on
a GPU. Every zoo model, at a small size, is moved to ``meta`` whole (``to_native(...).to("meta")``)
and must run there, forward and backward.

``Model.generate`` itself is not run: it reads each step's tokens on the host (the stop rule),
and ``meta`` tensors hold no values. Its compiled step is: the prompt, then one token, through
the key/value cache, as ``generate`` calls it.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from xdevice import models

torch = pytest.importorskip("torch")

from xdevice.backends.torch.ops import TorchOps  # noqa: E402 (after the skip: it imports torch)

#: every zoo model at a size that runs in a second
SMALL = {
    "mlp": {"inputs": 16, "hidden": [8]},
    "cnn": {},
    "resnet": {},
    "lstm": {"vocab": 50},
    "transformer": {},
    **{name: models.definition(name).SMALL for name in models.PRETRAINED},
}

META = torch.device("meta")


def test_every_zoo_model_has_a_small_configuration_here():
    assert set(SMALL) == set(models.NAMES + models.PRETRAINED)


def on_meta(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    """Zoo model ``name`` as a torch module on ``meta``, and an example input there."""
    model = models.build(name, backend="torch", seed=0, **SMALL[name])
    module = models.to_native(model).to(META)
    return module, torch.as_tensor(model.example_input(2)).to(META)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_a_zoo_model_on_meta_runs_its_forward_there(name):
    module, x = on_meta(name)
    module.eval()

    with torch.no_grad():
        y = module(x)

    assert y.device == META


@pytest.mark.parametrize("name", sorted(SMALL))
def test_a_zoo_model_on_meta_trains_there(name):
    module, x = on_meta(name)
    module.train()  # batch statistics, dropout keys, and the buffers written back

    module(x).float().sum().backward()

    grads = [p.grad for p in module.parameters() if p.grad is not None]  # bert's pooler is unused
    assert grads and all(g.device == META for g in grads)
    assert all(b.device == META for b in module.buffers())


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_a_decoder_generates_through_its_cache_on_meta(name):
    from xdevice.models._generate import new_cache

    definition, ops = models.definition(name), TorchOps()
    module, _ = on_meta(name)
    params = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    rows, prompt, new = 2, 5, 3
    with TorchOps.new_tensors_on(META), torch.no_grad():  # generate makes its cache on the weights' device
        cache = {
            **new_cache(ops, definition.cache_layout(module.spec), rows, prompt + new, "float32"),
            "index": ops.asarray(np.int32(0)),
            "mask": ops.asarray(np.ones((rows, prompt + new), bool)),
        }
        positions = ops.expand_dims(ops.arange(prompt), 0)
        ids = ops.asarray(np.ones((rows, prompt), np.int32))
        logits, cache = definition.apply(ops, params, ids, module.spec, cache=cache, positions=positions)
        token = ops.argmax(ops.squeeze(logits, 1), axis=-1)
        cache = {**cache, "index": ops.asarray(np.int32(prompt))}
        step = ops.expand_dims(ops.cast(token, "int32"), 1)
        logits, cache = definition.apply(ops, params, step, module.spec, cache=cache, positions=step)

    assert logits.device == META
    assert all(t.device == META for part in ("keys", "values") for t in cache[part])


def test_tensors_made_from_nothing_go_where_new_tensors_on_says():
    ops = TorchOps()

    with TorchOps.new_tensors_on(META):
        made = [
            ops.zeros((2,)),
            ops.ones((2,)),
            ops.full((2,), 3.0),
            ops.arange(4),
            ops.asarray(np.ones(2, np.float32)),
            ops.asarray([1, 2]),
            ops.random_key(3),
        ]
        with TorchOps.new_tensors_on(None):
            inner = ops.zeros((2,))
        after_inner = ops.zeros((2,))
    outside = ops.zeros((2,))

    assert [t.device for t in made] == [META] * len(made)
    assert inner.device == torch.device("cpu") and after_inner.device == META
    assert outside.device == torch.device("cpu")


def test_without_new_tensors_on_they_follow_torchs_default_device():
    with torch.device(META):  # what xdevice.on(...) enters for torch
        assert TorchOps().zeros((2,)).device == META


def test_new_tensors_on_holds_for_its_own_thread_only():
    seen = []
    with TorchOps.new_tensors_on(META):
        worker = threading.Thread(target=lambda: seen.append(TorchOps().zeros((1,)).device))
        worker.start()
        worker.join()

    assert seen == [torch.device("cpu")]


def test_one_hot_and_random_draws_follow_their_input():
    ops = TorchOps()
    key = ops.random_key(7).to(META)
    x = torch.ones((3, 4), device=META)

    drawn = [
        ops.one_hot(torch.tensor([0, 2], device=META), 3),
        ops.uniform(key, (3,)),
        ops.normal(key, (3,)),
        ops.dropout(key, x, 0.5),
        *ops.split_key(key),
    ]

    assert [t.device for t in drawn] == [META] * len(drawn)


@pytest.mark.parametrize("name", ["lstm", "gpt2"])
def test_a_zoo_model_called_on_its_device_makes_its_tensors_there(name, monkeypatch):
    """``Model.__call__`` runs the definition under ``new_tensors_on`` the model's device (fit's
    step does too, in ``Program.forward``): with ``meta`` standing in for that device, the LSTM's
    first state and gpt2's causal mask are made there, not on the CPU."""
    import xdevice

    model = models.build(name, backend="torch", seed=0, **SMALL[name])
    backend = xdevice.backend("torch")
    monkeypatch.setattr(backend, "native_device", lambda device: META)
    monkeypatch.setattr(backend, "to_device", lambda array, device: torch.as_tensor(array).to(META))
    model.params = {key: value.to(META) for key, value in model.params.items()}

    with torch.no_grad():
        y = model(model.example_input(2))

    assert y.device == META
