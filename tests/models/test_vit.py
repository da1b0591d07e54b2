"""vit: transformers' ViTForImageClassification, the same logits on every backend from its folder."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import xdevice
from xdevice import ConfigurationError, fit, models
from xdevice.models import vit

from .reference import assert_close, logits, randomised

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CONFIG = {
    "image_size": 32,
    "patch_size": 8,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "num_labels": 10,
}


def transformers_vit(seed: int = 0, **config):
    """A ViTForImageClassification with every weight random (fresh layer norms are the
    identity, which would hide a swapped scale and offset)."""
    torch.manual_seed(seed)
    return randomised(transformers.ViTForImageClassification(transformers.ViTConfig(**{**CONFIG, **config})), 0.1)


def images(rows: int = 3, side: int = 32) -> np.ndarray:
    return np.random.default_rng(0).normal(size=(rows, 3, side, side)).astype(np.float32)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A transformers folder (save_pretrained) and the logits its module gives."""
    folder = tmp_path_factory.mktemp("vit")
    module = transformers_vit()
    module.save_pretrained(folder)
    return folder, logits(module, images())


def test_a_transformers_folder_gives_transformers_logits(saved, backend):
    folder, expected = saved
    model = models.build("vit", backend=backend.name, weights=folder)
    assert model.spec["image"] == [3, 32, 32] and model.spec["patch"] == 8 and model.spec["eps"] == 1e-12
    assert_close(backend.ops.to_numpy(model(images())), expected)


def test_query_key_and_value_without_biases_give_transformers_logits(tmp_path):
    module = transformers_vit(seed=1, qkv_bias=False, image_size=[32, 24])
    module.save_pretrained(tmp_path)
    model = models.build("vit", weights=tmp_path)
    assert not model.spec["qkv_bias"] and model.spec["image"] == [3, 32, 24]
    x = np.random.default_rng(0).normal(size=(2, 3, 32, 24)).astype(np.float32)
    assert_close(model(x), logits(module, x))


def test_the_module_names_of_transformers_5_load_too(tmp_path):
    """A raw ``state_dict()`` (q_proj, mlp.fc1, layers.N) rather than save_pretrained's names."""
    from safetensors.torch import save_file

    module = transformers_vit(seed=2)
    save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(module.config.to_json_string())
    assert_close(models.build("vit", weights=tmp_path)(images()), logits(module, images()))


def test_save_pretrained_round_trips_through_transformers(tmp_path):
    model = models.build("vit", seed=3, **vit.SMALL)
    model.save_pretrained(tmp_path)
    loaded, info = transformers.ViTForImageClassification.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched tensors
    assert_close(logits(loaded.eval(), images()), model(images()))


@pytest.mark.parametrize(("field", "value"), [("hidden_act", "relu"), ("head_dim", 8)])
def test_a_config_field_the_zoo_does_not_compute_is_refused_by_name(saved, tmp_path, field, value):
    folder, _ = saved
    config = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, field: value}))
    (tmp_path / "model.safetensors").symlink_to(folder / "model.safetensors")
    with pytest.raises(ConfigurationError, match=f"{field}={value!r}"):
        models.build("vit", weights=tmp_path)


def test_images_of_another_size_are_refused_naming_the_size_the_model_takes():
    model = models.build("vit", **vit.SMALL)
    with pytest.raises(ConfigurationError, match="resized to 32x32"):
        model(images(side=48))


def test_the_defaults_are_vit_b_16():
    table = vit.parameters(vit.DEFAULTS)
    with torch.device("meta"):
        reference = transformers.ViTForImageClassification(transformers.ViTConfig(num_labels=1000))
    assert sum(math.prod(p.shape) for p in table.values()) == sum(p.numel() for p in reference.parameters())
    assert sum(p.numel() for p in reference.parameters()) == 86_567_656
    assert "vit: the Vision Transformer ViT-B/16" in models.describe("vit")


@pytest.mark.realworld_on("jax", "tensorflow")  # gpt2 keeps every backend in make test
def test_parity_with_gradients_against_the_numpy_reference(backend):
    report = xdevice.parity(models.build("vit", **vit.SMALL), backends=[backend.name], grads=True)
    assert report.ok, str(report)


@pytest.mark.realworld_on("jax", "tensorflow")  # gpt2 keeps every backend in make test
def test_a_short_fit_lowers_the_loss(backend):
    if backend.name == "numpy":
        pytest.skip("numpy is the reference, it does not train")
    model = models.build("vit", backend=backend.name, seed=1, **vit.SMALL)
    x = model.example_input(8, seed=0)
    y = np.arange(8) % 3
    history = fit(model, (x, y), optimizer="adam", lr=0.01, epochs=6, batch_size=8, verbose=0)
    assert history.steps[-1] < 0.5 * history.steps[0], history.steps
