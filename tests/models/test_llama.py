"""``llama``: a transformers LlamaForCausalLM folder loads on every backend with the same logits
(Llama 3 rope scaling, grouped-query attention, tied head; and plain rope, one key/value head, a
head of its own), save_pretrained round-trips, what the zoo does not compute is refused,
parity, and training."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import xdevice
from xdevice import ConfigurationError, fit, models
from xdevice.models import llama

from .reference import logits, randomised, relative

#: Llama 3.2's rope scaling and tied head at a tiny size; 4 query heads share 2 key/value heads
LLAMA3 = {
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "rope_parameters": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "bos_token_id": None,
    "eos_token_id": None,
}
#: Llama 2's plain rope, one key/value head for all queries, an untied head
PLAIN = {
    **LLAMA3,
    "num_key_value_heads": 1,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}
CONFIGS = {"llama3": LLAMA3, "plain": PLAIN}
IDS = np.random.default_rng(1).integers(0, 96, size=(3, 10))
MASK = (np.arange(10)[None, :] >= np.array([[0], [3], [6]])).astype(np.int64)  # rows 1 and 2 padded on the left


def transformers_model(config: dict | None = None, seed: int = 0, **overrides):
    """A LlamaForCausalLM with random weights: the 0.02 initialisation plus noise of 0.2, so
    the logits spread and greedy generation does not repeat one token."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**{**(config or LLAMA3), **overrides})
    return randomised(transformers.LlamaForCausalLM(config), 0.2)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """``{config name: (folder, transformers model)}``, each saved by ``save_pretrained``."""
    out = {}
    for name, config in CONFIGS.items():
        model = transformers_model(config)
        folder = tmp_path_factory.mktemp(f"llama-{name}")
        model.save_pretrained(folder)
        out[name] = folder, model
    return out


@pytest.mark.parametrize("config", list(CONFIGS))
def test_a_transformers_folder_gives_its_logits_on_every_backend(backend, saved, config):
    folder, reference = saved[config]
    model = models.build("llama", backend=backend.name, weights=folder)
    assert relative(backend.ops.to_numpy(model(IDS)), logits(reference, IDS)) <= 1e-4


def test_padding_masks_the_same_keys_as_transformers(backend, saved):
    import transformers

    folder, _ = saved["llama3"]
    # eager attention: its padded query rows attend uniformly, as the zoo's (SDPA's are zeros)
    eager = transformers.LlamaForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    model = models.build("llama", backend=backend.name, weights=folder)
    assert relative(backend.ops.to_numpy(model(IDS, attention_mask=MASK)), logits(eager, IDS, MASK)) <= 1e-4


def test_llama3_scaling_changes_only_the_low_frequencies():
    scaled = llama.inverse_frequencies(llama.DEFAULTS)
    plain = llama.inverse_frequencies({**llama.DEFAULTS, "rope_scaling": "none"})
    wavelength = 2 * np.pi / plain
    np.testing.assert_array_equal(scaled[wavelength < 8192 / 4], plain[wavelength < 8192 / 4])
    np.testing.assert_allclose(scaled[wavelength > 8192], plain[wavelength > 8192] / 32)
    between = (wavelength > 8192 / 4) & (wavelength < 8192)
    assert between.any() and (scaled[between] < plain[between]).all() and (scaled[between] > plain[between] / 32).all()


def test_a_transformers_4_config_with_rope_scaling_reads_the_same(tmp_path, saved):
    folder = shutil.copytree(saved["llama3"][0], tmp_path / "v4")
    config = json.loads((folder / "config.json").read_text())
    rope = config.pop("rope_parameters")
    config.update(rope_theta=rope.pop("rope_theta"), rope_scaling={**rope, "type": rope.pop("rope_type")})
    (folder / "config.json").write_text(json.dumps(config))
    assert models.build("llama", weights=folder).spec == models.build("llama", weights=saved["llama3"][0]).spec


@pytest.mark.parametrize("config", list(CONFIGS))
def test_save_pretrained_loads_in_transformers_to_the_same_logits(tmp_path, saved, config):
    import transformers

    model = models.build("llama", weights=saved[config][0])
    model.save_pretrained(tmp_path)
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.rope_parameters == saved[config][1].config.rope_parameters
    assert relative(model(IDS), logits(loaded, IDS)) <= 1e-5
    assert models.build("llama", weights=tmp_path).spec == model.spec


@pytest.mark.parametrize(
    "field, value, named",
    [
        ("hidden_act", "gelu", "hidden_act='gelu'"),
        ("attention_bias", True, "attention_bias=True"),
        ("mlp_bias", True, "mlp_bias=True"),
        (
            "rope_parameters",
            {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0},
            "rope_parameters.rope_type='yarn'",
        ),
        ("rope_scaling", {"type": "dynamic", "factor": 2.0}, "rope_scaling.rope_type='dynamic'"),
        ("partial_rotary_factor", 0.5, "partial_rotary_factor=0.5"),
    ],
)
def test_a_field_the_zoo_does_not_compute_is_refused_by_name(tmp_path, saved, field, value, named):
    folder = shutil.copytree(saved["llama3"][0], tmp_path / "edited")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(ConfigurationError, match=named.replace(".", r"\.")):
        models.build("llama", weights=folder)


def test_the_default_is_llama_3_2_1b():
    table = llama.parameters(llama.DEFAULTS)
    assert sum(int(np.prod(p.shape)) for p in table.values()) == 1_235_814_400
    assert set(llama.HYPERPARAMETERS) == set(llama.DEFAULTS)
    assert "llama" in models.describe("llama")


def test_kv_heads_must_divide_heads():
    with pytest.raises(ConfigurationError, match="kv_heads=1"):
        models.build("llama", **{**llama.SMALL, "kv_heads": 3})


@pytest.mark.realworld_on("jax", "tensorflow")  # gpt2 keeps every backend in make test
def test_forward_and_gradients_match_the_numpy_reference(backend):
    report = xdevice.parity(models.build("llama", **llama.SMALL), backends=[backend.name], grads=True)
    assert report.ok, str(report)


@pytest.mark.realworld_on("jax", "tensorflow")  # gpt2 keeps every backend in make test
def test_fit_lowers_the_next_token_loss(backend):
    if backend.name == "numpy":
        pytest.skip("fit trains on torch, JAX and TensorFlow")
    model = models.build("llama", backend=backend.name, seed=0, **{**llama.SMALL, "blocks": 1})
    ids = (np.arange(17)[None, :] + np.random.default_rng(0).integers(0, 3, size=(32, 1))) % 7
    # one label per position: (rows, tokens) under (rows, tokens, vocab) logits, the next token
    history = fit(model, (ids[:, :-1], ids[:, 1:]), loss="cross_entropy", batch_size=8, lr=0.01, verbose=0)
    assert len(history.steps) == 4 and history.steps[-1] < 0.9 * history.steps[0]
