"""Targets and token ids are checked once, in core, before any step, the same on every backend;
binary cross-entropy and soft labels compute the same everywhere."""

from __future__ import annotations

import numpy as np
import pytest

from xdevice import ConfigurationError, Trainer, fit, models
from xdevice.training.losses import binary_cross_entropy

SMALL = {"hidden": [8], "inputs": 6}


def features(rows: int = 40, width: int = 6, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, width)).astype("float32")


def weights(model) -> dict[str, np.ndarray]:
    """Every weight of a zoo model or of a framework's own model, as numpy copies."""
    if isinstance(model, models.Model):
        return model.numpy_params()
    if isinstance(model, tuple):  # a JAX (apply, params) pair
        return {k: np.asarray(v).copy() for k, v in model[1].items()}
    if hasattr(model, "state_dict"):  # torch
        return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    return {str(i): np.asarray(v).copy() for i, v in enumerate(model.get_weights())}  # Keras


def native_model(name: str, outputs: int = 3):
    """A small network written in the framework itself, 6 inputs to ``outputs`` logits."""
    rng = np.random.default_rng(0)
    if name == "torch":
        import torch

        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, outputs))
    if name == "tensorflow":
        import keras

        keras.utils.set_random_seed(0)
        return keras.Sequential(
            [keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(outputs)]
        )
    if name == "jax":
        import jax.numpy as jnp

        params = {"w": jnp.asarray(rng.normal(size=(6, outputs)).astype("float32")), "b": jnp.zeros(outputs)}
        return (lambda p, x: x @ p["w"] + p["b"]), params
    pytest.skip(f"{name} has no models of its own (its zoo models are checked in the other tests)")


def refused(model, data, match: str, **options) -> None:
    """fit refuses ``data`` with a message matching ``match``, and no weight has moved."""
    before = weights(model)
    with pytest.raises(ConfigurationError, match=match):
        fit(model, data, verbose=0, **options)
    after = weights(model)
    assert all(np.array_equal(before[k], after[k]) for k in before)


BAD_LABELS = {
    "past the last class": (
        np.arange(40) % 12,
        r"y holds class labels outside 0 <= y < 10 \(the model has 10 outputs\) in 6 of 40 rows: \[10, 11\]\. "
        r"Fix: models\.build\('mlp', classes=12\)",
    ),
    "negative": (
        np.arange(40) % 10 - 1,
        r"outside 0 <= y < 10 .* in 4 of 40 rows: \[-1\]\. Fix: drop the rows whose label is negative",
    ),
    "counting from 1": (np.arange(40) % 10 + 1, r"in 4 of 40 rows: \[10\]\. Fix: y - 1: the labels count from 1"),
    "fractional": (np.arange(40) % 10 / 2, r"not whole numbers in 20 of 40 rows: \[0\.5, 1\.5, 2\.5, 3\.5, 4\.5\]"),
    "one-hot past the model's width": (np.eye(12)[np.arange(40) % 12], r"does not have the shape of class labels"),
    "probability rows not summing to 1": (
        np.ones((40, 10)) / 5,
        r"40 of 40 rows do not sum to 1.*binary_cross_entropy",
    ),
}


@pytest.mark.parametrize("case", list(BAD_LABELS))
def test_class_labels_the_model_cannot_take_are_refused_before_a_step(backend, case):
    labels, match = BAD_LABELS[case]
    refused(models.build("mlp", backend=backend.name, classes=10, **SMALL), (features(), labels), match)


def test_a_frameworks_own_model_gets_the_same_label_checks(backend):
    model = native_model(backend.name)  # 3 outputs, learnt from one forward pass
    refused(model, (features(), np.arange(40) % 4), r"outside 0 <= y < 3 \(the model has 3 outputs\) in 10 of 40 rows")
    refused(model, (features(), np.arange(40) % 3 - 1), r"\[-1\]")


def test_bad_labels_in_a_later_batch_are_refused_before_that_batch_is_stepped(backend):
    model = models.build("mlp", backend=backend.name, classes=3, **SMALL)
    x, y = features(), np.arange(40) % 3
    trainer = Trainer(model)
    with pytest.raises(ConfigurationError, match=r"in 1 of 20 rows: \[7\]"):
        trainer.fit([(x[:20], y[:20]), (x[20:], np.where(np.arange(20) == 5, 7, y[20:]))], verbose=0)
    assert trainer.step_count == 1  # the first batch trained, the second never ran


def test_labels_shaped_n_by_1_train_as_n_with_a_note(backend):
    x, y = features(), np.arange(40) % 3

    def run(labels):
        return fit(models.build("mlp", backend=backend.name, classes=3, seed=1, **SMALL), (x, labels), verbose=0)

    with pytest.warns(UserWarning, match=r"y of shape \(40, 1\) read as class labels of shape \(40,\)"):
        column = run(y[:, None])
    np.testing.assert_array_equal(column.steps, run(y).steps)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
def test_one_hot_targets_train_as_their_labels_do(backend, dtype):
    x, y = features(), np.arange(40) % 3
    runs = [
        fit(
            models.build("mlp", backend=backend.name, classes=3, seed=1, **SMALL), (x, labels), verbose=0, shuffle=False
        )
        for labels in (y, np.eye(3, dtype=dtype)[y])
    ]
    np.testing.assert_allclose(runs[1].steps, runs[0].steps, rtol=1e-6, atol=1e-6)
    assert runs[1]["accuracy"] == runs[0]["accuracy"]


def test_soft_labels_are_the_soft_label_cross_entropy(backend):
    x = features()
    soft = np.random.default_rng(1).dirichlet(np.ones(3), size=40).astype("float32")
    model = models.build("mlp", backend=backend.name, classes=3, seed=1, **SMALL)
    logits = np.asarray(models.build("mlp", classes=3, seed=1, **SMALL).to(dtype="float64")(x.astype("float64")))
    shifted = logits - logits.max(1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    history = fit(model, (x, soft), batch_size=40, verbose=0)
    np.testing.assert_allclose(history.steps[0], -(soft * log_p).sum(1).mean(), rtol=1e-5)


def test_cross_entropy_on_one_output_is_refused_with_the_fix(backend):
    with pytest.raises(ConfigurationError, match=r"one output.*Fix: loss='binary_cross_entropy'"):
        Trainer(models.build("mlp", backend=backend.name, classes=1, **SMALL))
    if backend.name != "numpy":
        refused(native_model(backend.name, outputs=1), (features(), np.arange(40) % 2), r"this model has one output")


TOKEN_MODELS = {"lstm": {"embedding": 4, "hidden": 8}, "transformer": {"width": 8, "heads": 2, "mlp": 16, "blocks": 1}}
BAD_TOKENS = {
    "past the vocabulary": (
        [20, 22, 21],
        r"x holds token ids outside 0 <= id < 20 \(the model's vocabulary\) in 3 of 16 rows: \[20, 21, 22\]\. "
        r"Fix: models\.build\('(lstm|transformer)', vocab=23\)",
    ),
    "negative": (
        [-1],
        r"x holds token ids outside 0 <= id < 20 .* in 1 of 16 rows: \[-1\]\. Fix: token ids count from 0",
    ),
}


@pytest.mark.parametrize("name", list(TOKEN_MODELS))
@pytest.mark.parametrize("case", list(BAD_TOKENS))
def test_token_ids_outside_the_vocabulary_are_refused_before_a_step(backend, name, case):
    model = models.build(name, backend=backend.name, vocab=20, length=5, classes=3, **TOKEN_MODELS[name])
    bad, match = BAD_TOKENS[case]
    ids = np.random.default_rng(0).integers(0, 20, size=(16, 5))
    ids[np.arange(len(bad)) * 2, 1] = bad  # one bad id in each of len(bad) rows
    refused(model, (ids, np.arange(16) % 3), match)


def bce_data(rows: int = 64):
    x = features(rows)
    return x, (x[:, 0] + 0.5 * x[:, 1] > 0).astype("int64")


def test_binary_cross_entropy_trains_one_output_as_numpy_does(backend):
    x, y = bce_data()

    def run(name, targets, loss="binary_cross_entropy"):
        trainer = Trainer(models.build("mlp", backend=name, classes=1, seed=2, **SMALL), loss=loss, lr=0.05)
        trainer.fit((x, targets), epochs=5, batch_size=16, shuffle=False, verbose=0)
        return trainer

    reference, got = run("numpy", y), run(backend.name, y)
    np.testing.assert_allclose(got.history.steps, reference.history.steps, rtol=2e-5, atol=2e-6)
    assert got.history["loss"][-1] < 0.2 * got.history["loss"][0]
    logits = got.model.ops.to_numpy(got.model(x))
    assert got.evaluate((x, y))["accuracy"] == np.mean((logits[:, 0] > 0) == (y == 1)) > 0.95
    column = run(backend.name, y[:, None].astype("float32"), loss="bce")  # (N, 1) float targets, the alias
    np.testing.assert_allclose(column.history.steps, got.history.steps, rtol=1e-6, atol=1e-7)


def test_binary_cross_entropy_is_the_logistic_loss_and_stable_for_large_logits(backend):
    ops = backend.ops
    logits = np.array([[-100.0], [-2.0], [0.0], [3.0], [100.0]], "float32")
    targets = np.array([1.0, 0.0, 1.0, 0.25, 1.0], "float32")
    z = logits[:, 0].astype("float64")
    exact = np.mean(np.logaddexp(0, z) - z * targets)  # -(y log(sigmoid z) + (1 - y) log(1 - sigmoid z))
    got = ops.to_numpy(binary_cross_entropy(ops, ops.asarray(logits), ops.asarray(targets)))
    np.testing.assert_allclose(float(got), exact, rtol=1e-6)


BAD_BINARY = {
    "-1/1 targets": (np.arange(40) % 2 * 2 - 1, 1, r"outside \[0, 1\] in 20 of 40 rows: \[-1\]\. Fix: \(y > 0\)"),
    "class labels": (np.arange(40) % 3, 1, r"in 13 of 40 rows: \[2\]\. Fix: loss='cross_entropy' with 3 outputs"),
    "labels for a model of 3 outputs": (np.arange(40) % 3, 3, r"Fix: loss='cross_entropy' for one class of 3 per row"),
}


@pytest.mark.parametrize("case", list(BAD_BINARY))
def test_binary_targets_the_loss_cannot_take_are_refused_before_a_step(backend, case):
    targets, outputs, match = BAD_BINARY[case]
    model = models.build("mlp", backend=backend.name, classes=outputs, **SMALL)
    refused(model, (features(), targets), match, loss="binary_cross_entropy")


def test_the_default_metrics_follow_the_loss():
    x, y = bce_data(16)
    regression = fit(models.build("mlp", classes=1, **SMALL), (x, y.astype("float32")), loss="mse", verbose=0)
    assert "accuracy" not in regression.epochs[0]
    with pytest.raises(ConfigurationError, match=r"loss='mse' is a regression loss.*Fix: leave metrics out"):
        Trainer(models.build("mlp", classes=1, **SMALL), loss="mse", metrics=["accuracy"])


def test_mse_does_not_broadcast_a_column_against_a_row():
    x = features()
    target = x[:, 0]  # (N,) against the model's (N, 1)
    model = models.build("mlp", classes=1, seed=1, **SMALL)
    first = fit(model, (x, target), loss="mse", batch_size=40, verbose=0).steps[0]
    outputs = models.build("mlp", classes=1, seed=1, **SMALL)(x)
    np.testing.assert_allclose(first, np.mean((outputs[:, 0] - target) ** 2), rtol=1e-5)
    with pytest.raises(
        ConfigurationError, match=r"does not have the shape of the model's outputs.*Expected \(rows, 1\)"
    ):
        fit(model, (x, np.ones((40, 3), "float32")), loss="mse", verbose=0)


def test_float64_input_to_a_frameworks_own_model_is_refused_as_a_zoo_models_is(backend):
    """The zoo's refusal (tests/training/test_fit.py) with the parameters' dtype in place of the
    declared input's: torch would raise its own dtype error, JAX and Keras would cast silently."""
    x, y = features().astype("float64"), np.arange(40) % 3
    refused(
        native_model(backend.name),
        (x, y),
        r"x does not have the dtype of the model's parameters\. Expected float32\. Received: 'float64\[40, 6\]'\. "
        r"Fix: x\.astype\('float32'\)",
    )


def test_a_language_model_takes_one_label_per_position_and_a_label_past_its_vocabulary_is_refused():
    from xdevice.training.targets import Rules

    rules = Rules("cross_entropy", outputs=11, shape=(5, 11), build="gpt2")  # (tokens, vocab) per row
    ids = np.random.default_rng(0).integers(0, 11, size=(3, 5))
    assert rules.check(ids, ids)[1] is ids  # (rows, tokens) labels under (rows, tokens, vocab) logits
    with pytest.raises(ConfigurationError, match=r"in 1 of 3 rows: \[11\].*models.build\('gpt2', vocab=12\)"):
        rules.check(ids, np.where(np.arange(5) == 2, ids, 0) + (np.arange(3)[:, None] == 1) * 11 * (np.arange(5) == 4))
    with pytest.raises(ConfigurationError, match="does not have the shape of class labels"):
        rules.check(ids, ids[:, :4])  # one label short of the positions
