"""The zoo fits the data: a shape or dtype the model does not take is refused before any
framework runs, the same on every backend, with the build call that fits the data; a spec
that would build the wrong model is refused; every model describes its hyper-parameters."""

from __future__ import annotations

import ast
import pathlib
import re

import numpy as np
import pytest

from xdevice import ConfigurationError, models

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "models.md"


def _suffix(backend) -> str:
    return "" if backend.name == "numpy" else f', backend="{backend.name}"'


def test_the_default_mlp_given_64_features_suggests_inputs_64(backend):
    model = models.build("mlp", backend=backend.name)
    with pytest.raises(ConfigurationError) as caught:
        model(np.zeros((5, 64), np.float32))
    said = str(caught.value)
    assert "Expected float32[rows, 784]" in said and "Received: 'float32[5, 64]'" in said
    assert f'Fix: models.build("mlp", inputs=64{_suffix(backend)}) takes rows like these' in said
    assert "reshape x to" not in said  # 64 values cannot become 784


def test_the_suggestion_keeps_the_hyper_parameters_already_chosen():
    model = models.build("mlp", hidden=[16], classes=3)
    assert model.fitting_build((30,)) == 'models.build("mlp", inputs=30, hidden=[16], classes=3)'


@pytest.mark.parametrize(
    "name, rows, fix",
    [
        ("mlp", (5, 8, 8), 'x.reshape(len(x), -1), then models.build("mlp", inputs=64)'),
        ("cnn", (5, 1, 8, 8), 'models.build("cnn", image=[1, 8, 8]) takes rows like these'),
        ("cnn", (5, 8, 8), 'x[:, None], then models.build("cnn", image=[1, 8, 8])'),
        ("cnn", (5, 64), 'x.reshape(-1, 1, 8, 8), then models.build("cnn", image=[1, 8, 8])'),
        ("cnn", (5, 32, 32, 3), "x.transpose(0, 3, 1, 2) gives rows of the model's shape"),
        ("cnn", (5, 10), "reshape x to (rows, 3, 32, 32)"),
        ("resnet", (5, 1, 28, 28), 'models.build("resnet", image=[1, 28, 28]) takes rows like these'),
        ("transformer", (5, 64), 'models.build("transformer", length=64) takes rows like these'),
        ("lstm", (5, 8, 3), "reshape x to (rows, tokens)"),
    ],
)
def test_a_shape_mismatch_names_the_fix_that_fits_the_data(name, rows, fix):
    kind = np.int32 if name in ("lstm", "transformer") else np.float32
    with pytest.raises(ConfigurationError, match="x does not have the shape of the model's input") as caught:
        models.build(name)(np.ones(rows, kind))
    assert f"Fix: {fix}" in str(caught.value)


@pytest.mark.parametrize(
    "name, spec, rows",
    [
        ("resnet", {}, (2, 3, 16, 24)),  # global average pooling: any height and width
        ("lstm", {"length": 32}, (2, 50)),  # any number of tokens
        ("transformer", {"length": 32}, (2, 20)),  # up to length tokens
        ("cnn", {"image": [1, 8, 12], "channels": [4]}, (2, 1, 8, 12)),  # not only square images
    ],
)
def test_inputs_the_model_can_take_run(name, spec, rows):
    model = models.build(name, **spec)
    x = np.ones(rows, np.int32 if name in ("lstm", "transformer") else np.float32)
    assert model(x).shape == (2, model.spec["classes"])


@pytest.mark.parametrize("name", ["cnn", "resnet"])
@pytest.mark.parametrize("image, meant", [([8, 8], "[1, 8, 8]"), (8, "[1, 8, 8]"), ([1, 8, 8, 1], None)])
def test_an_image_argument_of_the_wrong_rank_is_refused_with_the_expected_form(name, image, meant):
    with pytest.raises(ConfigurationError, match=r"takes image=\[channels, height, width\]") as caught:
        models.build(name, image=image)
    if meant is not None:
        assert f'Fix: models.build("{name}", image={meant})' in str(caught.value)


def test_an_image_given_as_a_tuple_is_the_same_model():
    assert models.build("cnn", image=(1, 8, 8)).spec["image"] == [1, 8, 8]


def test_a_spec_that_cannot_run_is_refused_when_built():
    with pytest.raises(ConfigurationError, match=r"vanishes under 2 2x2 pools.*channels=\[32\]"):
        models.build("cnn", image=[1, 2, 2])
    with pytest.raises(ConfigurationError, match="heads must split the transformer's width.*width=8"):
        models.build("transformer", width=10, heads=4)


def test_float64_data_gets_xdevices_message_on_every_backend(backend):
    """scikit-learn's float64: torch used to raise its raw ``mat1 and mat2 must have the same
    dtype``, JAX cast silently, numpy and TensorFlow computed in float64."""
    model = models.build("mlp", backend=backend.name, inputs=4, hidden=[8])
    x = np.ones((2, 4))
    with pytest.raises(ConfigurationError) as caught:
        model(x)
    assert str(caught.value) == (
        "x does not have the dtype of the model's input. Expected float32[rows, 4]. Received: 'float64[2, 4]'. "
        "Fix: x.astype('float32') (float64 would be cut down silently)."
    )
    assert model(x.astype("float32")).shape == (2, 10)


def test_the_models_to_native_makes_refuse_what_a_model_refuses(backend):
    model = models.build("mlp", backend=backend.name, inputs=4, hidden=[8])
    native = models.to_native(model)
    call = (lambda x: native[0](native[1], x)) if isinstance(native, tuple) else native
    with pytest.raises(ConfigurationError, match=r"Received: 'float64\[2, 4\]'. Fix: x.astype\('float32'\)"):
        call(np.ones((2, 4)))
    with pytest.raises(ConfigurationError, match=r'models.build\("mlp", inputs=5, hidden=\[8\]'):
        call(np.ones((2, 5), np.float32))


def test_narrower_floats_and_python_lists_are_taken_in_the_weights_dtype(backend):
    model = models.build("mlp", backend=backend.name, inputs=2, hidden=[4])
    y = model([[0.5, 1.5]])
    assert backend.ops.dtype(y) == "float32"
    assert backend.ops.dtype(model(np.ones((1, 2), np.float16))) == "float32"


def test_token_ids_must_be_integers():
    with pytest.raises(ConfigurationError, match=r"Fix: x.astype\('int32'\): token ids are integers"):
        models.build("lstm")(np.ones((2, 8), np.float32))


@pytest.mark.parametrize("name", models.NAMES)
def test_describe_lists_every_hyper_parameter_with_its_default(name):
    module = models.definition(name)
    text = models.describe(name)
    assert text.startswith(f"{name}: ") and module.INPUT in text and module.OUTPUT in text
    for key, value in module.DEFAULTS.items():
        line = next(line for line in text.splitlines() if line.split()[:1] == [key])
        assert repr(value).replace("'", '"') in line or str(value) in line
        assert module.HYPERPARAMETERS[key] in line


def test_describe_without_a_name_shows_the_whole_zoo():
    text = models.describe()
    assert [line.split(":")[0] for line in text.split("\n\n")] == [*models.NAMES, *models.PRETRAINED]


def test_describe_refuses_an_unknown_name_with_the_choices():
    with pytest.raises(ConfigurationError, match="Did you mean 'mlp'"):
        models.describe("mpl")


@pytest.mark.parametrize("name", models.NAMES)
def test_the_reference_docs_have_a_table_of_each_models_hyper_parameters(name):
    section = DOCS.read_text().split(f"### `{name}`\n", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| `([^`]+)` \|", section, re.M)
    assert {key: ast.literal_eval(value) for key, value in rows} == models.definition(name).DEFAULTS


def test_token_ids_past_the_vocabulary_are_refused_before_the_framework_clamps_them(backend):
    model = models.build("lstm", backend=backend.name, vocab=100, seed=0)
    x = model.example_input(3)
    x[0, 0] = 150
    with pytest.raises(ConfigurationError, match=r"outside 0 <= id < 100 .* 1 of 3 rows: \[150\].*vocab=151"):
        model(x)
