"""``bert``: a transformers ``BertModel`` folder loads on every backend and matches the module,
save_pretrained round-trips, what the zoo does not compute is refused, parity, and training."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import xdevice
from xdevice import ConfigurationError, ConversionError, fit, models
from xdevice.models import bert

from .reference import randomised, relative

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CONFIG = {
    "vocab_size": bert.SMALL["vocab"],
    "hidden_size": bert.SMALL["width"],
    "num_hidden_layers": bert.SMALL["layers"],
    "num_attention_heads": bert.SMALL["heads"],
    "intermediate_size": bert.SMALL["mlp"],
    "max_position_embeddings": bert.SMALL["length"],
}


def _inputs() -> dict[str, np.ndarray]:
    """Three rows of 10 tokens: the second padded after 6, the third after 3; two segments."""
    ids = np.random.default_rng(0).integers(1, CONFIG["vocab_size"], size=(3, 10))
    mask = np.ones_like(ids)
    mask[1, 6:] = mask[2, 3:] = 0
    types = np.zeros_like(ids)
    types[:, 5:] = 1
    return {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": types}  # padding ids are 0


def _run(module, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    with torch.no_grad():
        out = module(**{k: torch.as_tensor(v) for k, v in inputs.items()})
    return out.last_hidden_state.numpy(), out.pooler_output.numpy()


def _zoo(model: models.Model, inputs: dict[str, np.ndarray], output: str = "last_hidden_state") -> np.ndarray:
    if output != model.spec["output"]:  # the same weights, the other output
        model = models.Model("bert", {**model.spec, "output": output}, model.params, model.backend, model.device)
    x = inputs["input_ids"].astype(np.int32)
    extra = {k: v for k, v in inputs.items() if k != "input_ids"}
    return model.ops.to_numpy(model(x, **extra))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A ``BertModel`` with every tensor random (norms and biases too), saved; and its outputs."""
    torch.manual_seed(0)
    module = randomised(transformers.BertModel(transformers.BertConfig(**CONFIG)), 0.1)
    folder = tmp_path_factory.mktemp("bert")
    module.save_pretrained(folder)
    return folder, _run(module, _inputs())


def test_a_transformers_folder_loads_and_matches_bert_model(backend, saved):
    folder, (hidden, pooled) = saved
    model = models.build("bert", backend=backend.name, weights=folder)
    assert relative(_zoo(model, _inputs()), hidden) <= 1e-4
    assert relative(_zoo(model, _inputs(), "pooled"), pooled) <= 1e-4
    pooler = models.build("bert", backend=backend.name, weights=folder, output="pooled")  # an option beside config.json
    assert relative(_zoo(pooler, _inputs(), "pooled"), pooled) <= 1e-4


def test_a_folder_s_sizes_are_its_own_and_an_unknown_option_is_refused(saved):
    folder, _ = saved
    with pytest.raises(ConfigurationError, match=r"comes from the folder's config.json.*\['width'\]"):
        models.build("bert", weights=folder, width=64)
    with pytest.raises(ConfigurationError, match=r"Unknown hyper-parameter for 'bert'.*\['outputs'\]"):
        models.build("bert", weights=folder, outputs="pooled")


def test_a_masked_lm_folder_loads_under_its_bert_prefix_without_a_pooler(tmp_path):
    torch.manual_seed(1)
    module = transformers.BertForMaskedLM(transformers.BertConfig(**CONFIG)).eval()
    module.save_pretrained(tmp_path)
    model = models.build("bert", weights=tmp_path)
    with torch.no_grad():
        hidden = module.bert(**{k: torch.as_tensor(v) for k, v in _inputs().items()}).last_hidden_state.numpy()
    assert not model.spec["pooler"]
    assert relative(_zoo(model, _inputs()), hidden) <= 1e-4


def test_save_pretrained_round_trips_through_transformers(tmp_path):
    model = models.build("bert", seed=3, **bert.SMALL)
    model.save_pretrained(tmp_path)
    hidden, pooled = _run(transformers.BertModel.from_pretrained(tmp_path).eval(), _inputs())
    assert relative(_zoo(model, _inputs()), hidden) <= 1e-4
    assert relative(_zoo(model, _inputs(), "pooled"), pooled) <= 1e-4


@pytest.mark.parametrize(
    "field, value",
    [
        ("position_embedding_type", "relative_key"),
        ("hidden_act", "gelu_new"),
        ("is_decoder", True),
        ("add_cross_attention", True),
    ],
)
def test_a_config_field_the_zoo_does_not_compute_is_refused_by_name(saved, tmp_path, field, value):
    folder = tmp_path / "edited"
    shutil.copytree(saved[0], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(ConfigurationError, match=rf"{field}={value!r}"):
        models.build("bert", weights=folder)


def test_a_checkpoint_without_the_pooler_its_config_implies_is_refused(saved, tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "cut"
    shutil.copytree(saved[0], folder)
    tensors = load_file(str(folder / "model.safetensors"))
    save_file({k: v for k, v in tensors.items() if not k.startswith("pooler.")}, str(folder / "model.safetensors"))
    with pytest.raises(ConversionError, match="no pooler"):
        models.build("bert", weights=folder)


def test_the_default_inputs_are_all_tokens_real_and_segment_zero():
    model = models.build("bert", **bert.SMALL)
    ids = model.example_input(2)
    ones, zeros = np.ones_like(ids), np.zeros_like(ids)
    np.testing.assert_array_equal(model(ids), model(ids, attention_mask=ones, token_type_ids=zeros))


def test_an_unknown_output_is_refused_with_the_choices():
    with pytest.raises(ConfigurationError, match=r"pooler_output.*last_hidden_state.*pooled"):
        models.build("bert", output="pooler_output", **bert.SMALL)


@pytest.mark.realworld_on("jax", "tensorflow")  # gpt2 keeps every backend in make test
def test_parity_forward_and_gradients(backend):
    report = xdevice.parity(models.build("bert", **bert.SMALL), backends=[backend.name], grads=True)
    assert report.ok, str(report)


@pytest.mark.realworld_on("jax", "tensorflow")  # gpt2 keeps every backend in make test
def test_fit_lowers_a_regression_loss_on_the_hidden_state(backend):
    """The last hidden state is no classifier output: mse against a fixed embedding of each
    token is a target of its shape that the model can learn."""
    if backend.name == "numpy":
        pytest.skip("fit trains on torch, JAX and TensorFlow")
    rng = np.random.default_rng(0)
    ids = rng.integers(0, bert.SMALL["vocab"], size=(16, 8)).astype(np.int32)
    target = rng.normal(size=(bert.SMALL["vocab"], bert.SMALL["width"])).astype(np.float32)[ids]
    model = models.build("bert", backend=backend.name, seed=0, **bert.SMALL)
    history = fit(model, (ids, target), loss="mse", batch_size=4, lr=0.01, verbose=0)
    assert history.steps[-1] < 0.9 * history.steps[0]
