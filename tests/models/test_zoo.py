"""The reference zoo: same weights and same answers on every backend; saving; native round trips."""

from __future__ import annotations

import pytest

import xdevice
from xdevice import ConfigurationError, ConversionError, models
from xdevice._tolerance import compare

NAMES = list(models.NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_forward_matches_the_numpy_reference(backend, name):
    report = xdevice.parity(name, backends=[backend.name], grads=False)
    assert report.ok, str(report)


@pytest.mark.parametrize("name", NAMES)
def test_gradients_match_the_numpy_reference(backend, name):
    report = xdevice.parity(name, backends=[backend.name], grads=True)
    grads = [row for row in report if row.tensor.startswith("grad ")]
    assert len(grads) == len(models.build(name).trainable)
    assert report.ok, str(report)


@pytest.mark.parametrize("name", NAMES)
def test_the_same_seed_gives_the_same_weights_and_another_seed_does_not(name):
    first, again, other = (models.build(name, seed=s).numpy_params() for s in (3, 3, 4))
    assert all((first[k] == again[k]).all() for k in first)
    assert any((first[k] != other[k]).any() for k in first if first[k].size > 1)


def test_the_mlp_has_the_documented_shape():
    model = models.build("mlp")
    shapes = {k: v.shape for k, v in model.numpy_params().items()}
    assert shapes == {
        "dense0.weight": (784, 512),
        "dense0.bias": (512,),
        "dense1.weight": (512, 512),
        "dense1.bias": (512,),
        "out.weight": (512, 10),
        "out.bias": (10,),
    }


def test_a_model_runs_on_its_backend_and_device(backend):
    model = models.build("cnn", backend=backend.name, device="cpu:0")
    y = model(model.example_input(2))
    assert xdevice.backend_of(y) == backend.name and xdevice.device_of(y) == xdevice.Device("cpu", 0)
    assert backend.ops.shape(y) == (2, 10)


def test_save_and_load_round_trip_exactly_through_safetensors(tmp_path, backend):
    model = models.build("resnet", seed=5)
    path = tmp_path / "resnet.safetensors"
    model.save(path)
    header_size = int.from_bytes(path.read_bytes()[:8], "little")
    assert path.read_bytes()[8:9] == b"{" and header_size < path.stat().st_size  # safetensors, not pickle
    loaded = models.load(path, backend=backend.name)
    assert loaded.name == "resnet" and loaded.spec == model.spec
    x = model.example_input(2)
    assert compare(backend.ops.to_numpy(loaded(x)), model(x)).ok


def test_loading_a_file_that_is_not_a_model_says_so(tmp_path):
    path = tmp_path / "junk.safetensors"
    path.write_bytes(b"\x00" * 100)
    with pytest.raises(ConversionError, match="Cannot read the model file"):
        models.load(path)


def test_loading_weights_that_do_not_fit_the_spec_is_refused(tmp_path):
    import json

    from safetensors.numpy import save_file

    path = tmp_path / "bad.safetensors"
    weights = models.build("mlp", hidden=[8]).numpy_params()
    weights["dense0.weight"] = weights["dense0.weight"][:, :4]
    save_file(
        weights,
        str(path),
        metadata={
            "xdevice": json.dumps(
                {
                    "format": "xdevice.model/1",
                    "model": "mlp",
                    "spec": {**models.definition("mlp").DEFAULTS, "hidden": [8]},
                }
            )
        },
    )
    with pytest.raises(ConversionError, match="do not match the model's spec"):
        models.load(path)


def test_an_unknown_model_or_hyper_parameter_is_named():
    with pytest.raises(ConfigurationError, match="Did you mean 'resnet'"):
        models.build("resnt")
    with pytest.raises(ConfigurationError, match="Did you mean 'hidden'"):
        models.build("mlp", hiden=[3])


@pytest.mark.parametrize("name", NAMES)
def test_compiled_forward_equals_eager(backend, name):
    model = models.build(name, backend=backend.name)
    x = backend.ops.asarray(model.example_input(3))
    compiled = backend.jit(lambda params, x: model.apply(backend.ops, params, x))
    assert compare(backend.ops.to_numpy(compiled(model.params, x)), backend.ops.to_numpy(model(x))).ok
