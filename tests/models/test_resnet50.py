"""resnet50: transformers' ResNetForImageClassification, the same logits on every backend from its folder."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import xdevice
from xdevice import ConfigurationError, fit, models
from xdevice.models import resnet50

from .reference import assert_close, logits

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CONFIG = {"hidden_sizes": [8, 16, 16, 32], "depths": [1, 2, 1, 1], "embedding_size": 8, "num_labels": 10}


def transformers_resnet(seed: int = 0, **config):
    """A ResNetForImageClassification with random weights and batch-norm statistics (fresh
    ones are the identity in inference, which would hide a swapped mean and variance)."""
    torch.manual_seed(seed)
    module = transformers.ResNetForImageClassification(transformers.ResNetConfig(**{**CONFIG, **config}))
    with torch.no_grad():
        for name, value in module.state_dict().items():
            if name.endswith("running_mean"):
                value.copy_(torch.randn_like(value) * 0.1)
            elif name.endswith("running_var"):
                value.copy_(torch.rand_like(value) + 0.5)
            elif "normalization" in name and value.is_floating_point():
                value.add_(torch.randn_like(value) * 0.1)
    return module.eval()


def images(rows: int = 3, side: int = 48) -> np.ndarray:
    return np.random.default_rng(0).normal(size=(rows, 3, side, side)).astype(np.float32)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A transformers folder (save_pretrained) and the logits its module gives."""
    folder = tmp_path_factory.mktemp("resnet50")
    module = transformers_resnet()
    module.save_pretrained(folder)
    return folder, logits(module, images())


def test_a_transformers_folder_gives_transformers_logits(saved, backend):
    folder, expected = saved
    model = models.build("resnet50", backend=backend.name, weights=folder)
    assert model.spec["depths"] == [1, 2, 1, 1] and model.spec["classes"] == 10
    assert_close(backend.ops.to_numpy(model(images())), expected)


@pytest.mark.parametrize(
    "variant",
    [{"layer_type": "basic"}, {"downsample_in_bottleneck": True}, {"downsample_in_first_stage": True}],
    ids=["basic", "v1-stride-on-1x1", "downsample-first-stage"],
)
def test_every_block_layout_transformers_has_gives_its_logits(tmp_path, variant):
    module = transformers_resnet(seed=1, **variant)
    module.save_pretrained(tmp_path)
    model = models.build("resnet50", weights=tmp_path)
    assert_close(model(images()), logits(module, images()))


def test_save_pretrained_round_trips_through_transformers(tmp_path):
    model = models.build("resnet50", seed=3, **resnet50.SMALL)
    model.save_pretrained(tmp_path)
    loaded, info = transformers.ResNetForImageClassification.from_pretrained(tmp_path, output_loading_info=True)
    # nothing unexpected or mismatched; missing only PyTorch's step counters, which start at 0
    assert not info["unexpected_keys"] and not info["mismatched_keys"] and not info["error_msgs"], info
    assert all(key.endswith(".num_batches_tracked") for key in info["missing_keys"]), info
    assert_close(logits(loaded.eval(), images()), model(images()))


@pytest.mark.parametrize(("field", "value"), [("hidden_act", "gelu"), ("layer_type", "preactivation")])
def test_a_config_field_the_zoo_does_not_compute_is_refused_by_name(saved, tmp_path, field, value):
    folder, _ = saved
    config = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, field: value}))
    (tmp_path / "model.safetensors").symlink_to(folder / "model.safetensors")
    with pytest.raises(ConfigurationError, match=f"{field}={value!r}"):
        models.build("resnet50", weights=tmp_path)


def test_the_defaults_are_resnet_50():
    table = resnet50.parameters(resnet50.DEFAULTS)
    with torch.device("meta"):
        reference = transformers.ResNetForImageClassification(transformers.ResNetConfig(num_labels=1000))
    assert sum(math.prod(p.shape) for p in table.values() if p.trainable) == 25_557_032
    assert sum(p.numel() for p in reference.parameters()) == 25_557_032
    assert "resnet50: ResNet-50 v1.5" in models.describe("resnet50")


@pytest.mark.realworld_on("jax", "tensorflow")  # gpt2 keeps every backend in make test
def test_parity_with_gradients_against_the_numpy_reference(backend):
    report = xdevice.parity(models.build("resnet50", **resnet50.SMALL), backends=[backend.name], grads=True)
    assert report.ok, str(report)


@pytest.mark.realworld_on("jax", "tensorflow")  # gpt2 keeps every backend in make test
def test_a_short_fit_lowers_the_loss(backend):
    if backend.name == "numpy":
        pytest.skip("numpy is the reference, it does not train")
    model = models.build("resnet50", backend=backend.name, seed=1, **resnet50.SMALL)
    x = model.example_input(8, seed=0)
    y = np.arange(8) % 3
    history = fit(model, (x, y), optimizer="adam", lr=0.01, epochs=6, batch_size=8, verbose=0)
    assert history.steps[-1] < 0.8 * history.steps[0], history.steps
