"""``gpt2``: a transformers GPT2LMHeadModel folder loads on every backend with the same logits,
save_pretrained round-trips, what the zoo does not compute is refused, parity, and training."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import xdevice
from xdevice import ConfigurationError, fit, models
from xdevice.models import gpt2

from .reference import logits, randomised, relative

#: a tiny GPT2Config: 2 blocks, width 32, 4 heads, 32 positions, 96 token ids
CONFIG = {
    "vocab_size": 96,
    "n_positions": 32,
    "n_embd": 32,
    "n_head": 4,
    "n_layer": 2,
    "n_inner": 64,
    "bos_token_id": None,
    "eos_token_id": None,
}
IDS = np.random.default_rng(1).integers(0, 96, size=(3, 10))
MASK = (np.arange(10)[None, :] >= np.array([[0], [3], [6]])).astype(np.int64)  # rows 1 and 2 padded on the left


def transformers_model(seed: int = 0, **overrides):
    """A GPT2LMHeadModel with random weights: GPT-2's 0.02 initialisation plus noise of 0.2,
    so the logits spread and greedy generation does not repeat one token."""
    import torch
    import transformers

    torch.manual_seed(seed)
    return randomised(transformers.GPT2LMHeadModel(transformers.GPT2Config(**{**CONFIG, **overrides})), 0.2)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """``(folder, transformers model)``: the model saved by ``save_pretrained``."""
    model = transformers_model()
    folder = tmp_path_factory.mktemp("gpt2")
    model.save_pretrained(folder)
    return folder, model


def test_a_transformers_folder_gives_its_logits_on_every_backend(backend, saved):
    folder, reference = saved
    model = models.build("gpt2", backend=backend.name, weights=folder)
    assert relative(backend.ops.to_numpy(model(IDS)), logits(reference, IDS)) <= 1e-4


def test_padding_masks_the_same_keys_as_transformers(backend, saved):
    import transformers

    folder, _ = saved
    # eager attention: its padded query rows attend uniformly, as the zoo's (SDPA's are zeros)
    eager = transformers.GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
    model = models.build("gpt2", backend=backend.name, weights=folder)
    assert relative(backend.ops.to_numpy(model(IDS, attention_mask=MASK)), logits(eager, IDS, MASK)) <= 1e-4


def test_a_gpt2model_folder_without_the_prefix_loads_with_the_head_tied(tmp_path, saved):
    import transformers

    _, reference = saved
    reference.transformer.save_pretrained(tmp_path)  # the hub's "gpt2" layout: wte.weight, h.0...
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["GPT2Model"]
    model = models.build("gpt2", weights=tmp_path)
    assert isinstance(reference.transformer, transformers.GPT2Model)
    assert relative(model(IDS), logits(reference, IDS)) <= 1e-4


@pytest.mark.parametrize("tied", [True, False])
def test_save_pretrained_loads_in_transformers_to_the_same_logits(tmp_path, tied):
    import transformers

    model = models.build("gpt2", seed=3, tied=tied, **gpt2.SMALL)
    model.save_pretrained(tmp_path)
    loaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    assert loaded.config.tie_word_embeddings is tied
    assert relative(model(IDS), logits(loaded, IDS)) <= 1e-5
    assert models.build("gpt2", weights=tmp_path).spec == model.spec


@pytest.mark.parametrize(
    "field, value",
    [
        ("scale_attn_by_inverse_layer_idx", True),
        ("reorder_and_upcast_attn", True),
        ("activation_function", "relu"),
        ("add_cross_attention", True),
        ("scale_attn_weights", False),
    ],
)
def test_a_field_the_zoo_does_not_compute_is_refused_by_name(tmp_path, saved, field, value):
    folder = shutil.copytree(saved[0], tmp_path / "edited")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(ConfigurationError, match=f"{field}={value!r}"):
        models.build("gpt2", weights=folder)


def test_the_default_is_gpt2_124m():
    table = gpt2.parameters(gpt2.DEFAULTS)
    assert sum(int(np.prod(p.shape)) for p in table.values()) == 124_439_808
    assert set(gpt2.HYPERPARAMETERS) == set(gpt2.DEFAULTS)
    assert "gpt2" in models.describe("gpt2")


def test_forward_and_gradients_match_the_numpy_reference(backend):
    report = xdevice.parity(models.build("gpt2", **gpt2.SMALL), backends=[backend.name], grads=True)
    assert report.ok, str(report)


def test_fit_lowers_the_next_token_loss(backend):
    if backend.name == "numpy":
        pytest.skip("fit trains on torch, JAX and TensorFlow")
    model = models.build("gpt2", backend=backend.name, seed=0, **{**gpt2.SMALL, "blocks": 1})
    ids = (np.arange(17)[None, :] + np.random.default_rng(0).integers(0, 3, size=(32, 1))) % 7
    # one label per position: (rows, tokens) under (rows, tokens, vocab) logits, the next token
    history = fit(model, (ids[:, :-1], ids[:, 1:]), loss="cross_entropy", batch_size=8, lr=0.01, verbose=0)
    assert len(history.steps) == 4 and history.steps[-1] < 0.9 * history.steps[0]
