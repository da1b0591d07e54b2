"""Checkpoints are keyed by the model's structure: a twin built in the same process loads them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from xdevice import ConfigurationError, Trainer


def data(rows: int = 40, features: int = 6, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features)).astype("float32")
    return x, (x[:, 0] > 0).astype("int64")


def keras_mlp(width: int = 16):
    import keras

    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(width, activation="relu"), keras.layers.Dense(2)])


def torch_mlp(width: int = 16):
    import torch

    return torch.nn.Sequential(torch.nn.Linear(6, width), torch.nn.ReLU(), torch.nn.Linear(width, 2))


def trained_and_saved(model, folder) -> Trainer:
    trainer = Trainer(model, optimizer="adam", lr=0.01)
    trainer.fit(data(), epochs=1, batch_size=8, verbose=0)
    trainer.save(str(folder))
    return trainer


def test_a_keras_model_rebuilt_in_the_same_process_loads_its_checkpoint(tmp_path):
    pytest.importorskip("tensorflow")
    trained = trained_and_saved(keras_mlp(), tmp_path)
    twin = keras_mlp()  # Keras names it sequential_1/dense_2, dense_3

    Trainer(twin, optimizer="adam", lr=0.01).load(str(tmp_path))

    x, _ = data()
    np.testing.assert_array_equal(np.asarray(twin(x)), np.asarray(trained.model(x)))


def test_a_torch_module_rebuilt_in_the_same_process_loads_its_checkpoint(tmp_path):
    torch = pytest.importorskip("torch")
    trained = trained_and_saved(torch_mlp(), tmp_path)
    twin = torch_mlp()

    Trainer(twin, optimizer="adam", lr=0.01).load(str(tmp_path))

    x = torch.from_numpy(data()[0])
    with torch.no_grad():
        np.testing.assert_array_equal(twin(x).numpy(), trained.model(x).numpy())


def test_a_keras_checkpoint_of_format_1_still_loads(tmp_path):
    pytest.importorskip("tensorflow")
    from safetensors.numpy import load_file, save_file

    trained = trained_and_saved(keras_mlp(), tmp_path)
    for file in ("model.safetensors", "optimizer.safetensors"):  # format 1 kept Keras' generated paths
        arrays = load_file(str(tmp_path / file))
        save_file({k.replace(":", ":sequential/dense/"): v for k, v in arrays.items()}, str(tmp_path / file))
    record = json.loads((tmp_path / "trainer.json").read_text())
    (tmp_path / "trainer.json").write_text(json.dumps({**record, "format": "xdevice.checkpoint/1"}))
    twin = keras_mlp()

    Trainer(twin, optimizer="adam", lr=0.01).load(str(tmp_path))

    x, _ = data()
    np.testing.assert_array_equal(np.asarray(twin(x)), np.asarray(trained.model(x)))


def test_a_checkpoint_of_another_width_lists_expected_and_found_with_the_first_difference(tmp_path):
    pytest.importorskip("torch")
    trained_and_saved(torch_mlp(16), tmp_path)
    wider = Trainer(torch_mlp(32), optimizer="adam", lr=0.01)

    with pytest.raises(ConfigurationError) as raised:
        wider.load(str(tmp_path))

    text = str(raised.value)
    assert "param/0.bias is (32,) here and (16,) in the checkpoint" in text
    expected, received = text.split("Expected ")[1].split(" Received: ")
    assert "param/0.weight (32, 6)" in expected and "param/0.weight (16, 6)" not in expected
    assert "param/0.weight (16, 6)" in received and "param/0.weight (32, 6)" not in received
    assert "Fix: build the same model and optimizer first" in text
