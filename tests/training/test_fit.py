"""fit / Trainer: the same loss curve on every backend, PyTorch's optimizer math, exact resume."""

from __future__ import annotations

import numpy as np
import pytest

from xdevice import ConfigurationError, Trainer, fit, models

OPTIMIZERS = {
    "sgd": {"lr": 0.1},
    "momentum": {"lr": 0.05},
    "adam": {"lr": 0.01},
    "adamw": {"lr": 0.01, "weight_decay": 0.1},
}
SMALL_MLP = {"hidden": [16], "inputs": 6, "classes": 3}


def data(rows: int = 80, features: int = 6, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features)).astype("float32")
    return x, (x[:, 0] > 0).astype("int64") + (x[:, 1] > 0.5)


def curve(backend: str, optimizer: str, steps: int = 10, name: str = "mlp", **spec) -> list[float]:
    model = models.build(name, backend=backend, seed=1, **(spec or SMALL_MLP))
    x, y = data()
    if spec:  # an image model: its own input shape, labels from the mean brightness
        x = model.example_input(80, seed=0)
        y = np.digitize(x.mean(axis=(1, 2, 3)), np.quantile(x.mean(axis=(1, 2, 3)), [1 / 3, 2 / 3]))
    history = fit(
        model, (x, y), optimizer=optimizer, epochs=10, steps=steps, batch_size=8, verbose=0, **OPTIMIZERS[optimizer]
    )
    return history.steps


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_ten_steps_give_the_numpy_reference_loss_curve(backend, optimizer):
    if backend.name == "numpy":
        pytest.skip("numpy is the reference these curves are compared with")
    reference = curve("numpy", optimizer)
    got = curve(backend.name, optimizer)
    assert len(got) == 10
    np.testing.assert_allclose(got, reference, rtol=2e-5, atol=2e-6)
    assert got[-1] < got[0]


def test_a_model_with_batch_norm_trains_the_same_everywhere(backend):
    if backend.name == "numpy":
        pytest.skip("numpy is the reference these curves are compared with")
    spec = {"channels": [4, 8], "classes": 3}
    reference = curve("numpy", "adam", steps=4, name="cnn", **spec)
    np.testing.assert_allclose(
        curve(backend.name, "adam", steps=4, name="cnn", **spec), reference, rtol=1e-4, atol=1e-5
    )


def torch_loop(
    torch, module, optimizer, x, y, *, epochs: int = 1, batch: int = 8, after_backward=None, scheduler=None
) -> list[float]:
    """A plain torch loop over the batches in order (fit's shuffle=False): each step's loss."""
    losses = []
    for _ in range(epochs):
        for start in range(0, len(x), batch):
            loss = torch.nn.functional.cross_entropy(
                module(torch.as_tensor(x[start : start + batch])), torch.as_tensor(y[start : start + batch])
            )
            optimizer.zero_grad()
            loss.backward()
            if after_backward is not None:
                after_backward()
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            losses.append(loss.item())
    return losses


def assert_trained_as(history, expected: list[float], model, module) -> None:
    """fit's losses and weights are the torch loop's."""
    np.testing.assert_allclose(history.steps, expected, rtol=1e-5, atol=1e-6)
    trained = {k: v.detach().numpy() for k, v in module.state_dict().items()}
    for key, value in model.numpy_params().items():
        np.testing.assert_allclose(value, trained[key], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_the_optimizers_do_what_torch_optim_does(optimizer):
    torch = pytest.importorskip("torch")
    x, y = data()
    model = models.build("mlp", backend="torch", seed=1, **SMALL_MLP)
    module = models.to_native(model, "torch")
    settings = dict(OPTIMIZERS[optimizer])
    native = {
        "sgd": lambda p: torch.optim.SGD(p, **settings),
        "momentum": lambda p: torch.optim.SGD(p, momentum=0.9, **settings),
        "adam": lambda p: torch.optim.Adam(p, **settings),
        "adamw": lambda p: torch.optim.AdamW(p, **settings),
    }[optimizer](module.parameters())
    expected = torch_loop(torch, module, native, x, y)
    history = fit(model, (x, y), optimizer=optimizer, batch_size=8, shuffle=False, verbose=0, **settings)
    assert_trained_as(history, expected, model, module)


def test_resuming_a_checkpoint_gives_exactly_the_next_steps(backend, tmp_path):
    x, y = data()
    straight = Trainer(models.build("mlp", backend=backend.name, seed=1, **SMALL_MLP), optimizer="adam", lr=0.01)
    straight.fit((x, y), epochs=2, batch_size=8, seed=3, verbose=0)

    first = Trainer(models.build("mlp", backend=backend.name, seed=1, **SMALL_MLP), optimizer="adam", lr=0.01)
    first.fit((x, y), epochs=2, batch_size=8, seed=3, steps=13, verbose=0, checkpoint_dir=str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors", "optimizer.safetensors", "trainer.json"]
    fresh = Trainer(models.build("mlp", backend=backend.name, seed=7, **SMALL_MLP), optimizer="adam", lr=0.01)
    fresh.load(str(tmp_path))
    assert (fresh.epoch, fresh.batch, fresh.step_count) == (1, 3, 13)
    history = fresh.fit((x, y), epochs=2, batch_size=8, seed=3, verbose=0)
    assert len(history.steps) == 20
    np.testing.assert_array_equal(history.steps, straight.history.steps)
    for key, value in straight.model.numpy_params().items():
        np.testing.assert_array_equal(fresh.model.numpy_params()[key], value)


def test_a_checkpoint_for_another_optimizer_is_refused(tmp_path):
    x, y = data()
    trainer = Trainer(models.build("mlp", seed=1, **SMALL_MLP), optimizer="adam")
    trainer.fit((x, y), steps=2, verbose=0, checkpoint_dir=str(tmp_path))
    other = Trainer(models.build("mlp", seed=1, **SMALL_MLP), optimizer="momentum")
    with pytest.raises(ConfigurationError, match="does not match|another optimizer"):
        other.load(str(tmp_path))


def test_history_reports_metrics_validation_and_input_wait():
    x, y = data()
    history = fit(models.build("mlp", seed=1, **SMALL_MLP), (x, y), epochs=3, lr=0.05, validation=(x, y), verbose=0)
    assert [e["epoch"] for e in history.epochs] == [1, 2, 3]
    assert set(history.epochs[0]) >= {"loss", "accuracy", "val_loss", "val_accuracy", "input_wait", "seconds"}
    assert all(0.0 <= e["input_wait"] <= 1.0 for e in history.epochs)
    assert history["loss"][-1] < history["loss"][0]
    assert history["val_accuracy"][-1] > 0.5


def test_progress_prints_one_line_per_epoch(capsys):
    x, y = data()
    fit(models.build("mlp", seed=1, **SMALL_MLP), (x, y), epochs=2, verbose=1)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines] == [["epoch", "1/2"], ["epoch", "2/2"]]
    assert "loss" in lines[0] and "accuracy" in lines[0]


def test_mse_regression_trains():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 6)).astype("float32")
    target = (x @ rng.normal(size=(6, 3))).astype("float32")
    history = fit(
        models.build("mlp", seed=1, **SMALL_MLP),
        (x, target),
        loss="mse",
        optimizer="adam",
        lr=0.01,
        epochs=20,
        verbose=0,
    )
    assert "accuracy" not in history.epochs[0]
    assert history.last("loss") < 0.5 * history.epochs[0]["loss"]


def test_bad_settings_name_the_valid_choices():
    model = models.build("mlp", seed=1, **SMALL_MLP)
    with pytest.raises(ConfigurationError, match="adamw"):
        Trainer(model, optimizer="adagrad")
    with pytest.raises(ConfigurationError, match="cross_entropy"):
        Trainer(model, loss="hinge")
    with pytest.raises(ConfigurationError, match=r"Received: 'momentun'.*Did you mean 'momentum'\?"):
        Trainer(model, optimizer="sgd", momentun=0.9)


@pytest.mark.parametrize(
    "typed, meant",
    [("batchsize", "batch_size"), ("epoch", "epochs"), ("validaton", "validation"), ("weight_decy", "weight_decay")],
)
def test_a_misspelt_option_gets_the_nearest_of_fits_and_the_optimizers(typed, meant):
    with pytest.raises(
        ConfigurationError,
        match=rf"Unknown option for fit\. Expected one of fit's options or the 'adam' optimizer's\. "
        rf"Received: '{typed}'\..*Did you mean '{meant}'\?",
    ):
        fit(models.build("mlp", seed=1, **SMALL_MLP), data(), verbose=0, **{typed: 2})


def test_an_option_of_trainer_fit_given_to_trainer_says_where_it_goes():
    with pytest.raises(ConfigurationError, match=r"Fix: batch_size is an option of Trainer\.fit"):
        Trainer(models.build("mlp", seed=1, **SMALL_MLP), batch_size=16)


def test_keras_names_learning_rate_and_validation_data_are_taken():
    x, y = data()
    runs = [
        fit(models.build("mlp", seed=1, **SMALL_MLP), (x, y), epochs=2, verbose=0, **options)
        for options in ({"lr": 0.05, "validation": (x, y)}, {"learning_rate": 0.05, "validation_data": (x, y)})
    ]
    assert runs[1].steps == runs[0].steps and runs[1]["val_loss"] == runs[0]["val_loss"]
    with pytest.raises(ConfigurationError, match="learning_rate is another name for lr: pass one of them"):
        fit(models.build("mlp", seed=1, **SMALL_MLP), (x, y), lr=0.1, learning_rate=0.1, verbose=0)


def test_drop_last_leaves_out_each_epochs_short_batch(backend):
    x, y = data()  # 80 rows: two batches of 32 and one of 16
    model = models.build("mlp", backend=backend.name, seed=1, **SMALL_MLP)
    history = fit(model, (x, y), epochs=2, batch_size=32, drop_last=True, verbose=0)
    assert len(history.steps) == 4
    with pytest.raises(ConfigurationError, match=r"drop_last cuts \(x, y\) arrays.*DataLoader\(drop_last=True\)"):
        fit(model, [(x, y)], drop_last=True, verbose=0)


@pytest.mark.parametrize(
    "spelt, name", [("fp32", "float32"), ("bf16", "bfloat16"), ("fp16", "float16"), ("half", "float16")]
)
def test_precision_takes_the_clis_spellings(spelt, name):
    from xdevice.training.precision import precision_name

    assert precision_name(spelt) == name
    x, y = data()
    runs = [fit(models.build("mlp", seed=1, **SMALL_MLP), (x, y), precision=p, verbose=0) for p in ("fp32", "float32")]
    assert runs[0].steps == runs[1].steps


@pytest.mark.parametrize(
    "given, match",
    [
        (
            {"data": np.ones((4, 6)), "target": np.zeros(4)},
            r"a dict of 2 entries.*Fix: pass \(data\['data'\], data\['target'\]\)",
        ),
        ("digits.csv", r"Unsupported data for training\. Expected \(x, y\) arrays, or an iterable.*Received: 'str'"),
        (["ab", "cd"], r"Each batch must be a pair \(inputs, targets\), and the list given as data yielded a str"),
        ((np.ones((4, 6)), np.zeros(4), np.zeros(4)), r"a tuple of 3 arrays"),
    ],
)
def test_data_in_a_form_fit_does_not_take_is_named_by_its_type(given, match):
    with pytest.raises(ConfigurationError, match=match):
        fit(models.build("mlp", seed=1, **SMALL_MLP), given, verbose=0)


def test_an_optimizer_object_with_options_beside_it_is_refused():
    from xdevice.training import Adam

    with pytest.raises(
        ConfigurationError, match=r"An optimizer object carries its own settings.*Fix: Adam\(\.\.\., lr="
    ):
        fit(models.build("mlp", seed=1, **SMALL_MLP), data(), optimizer=Adam(), lr=0.1, verbose=0)


def test_one_shot_data_for_several_epochs_is_an_error():
    x, y = data()
    batches = ((x[i : i + 8], y[i : i + 8]) for i in range(0, 80, 8))
    with pytest.raises(ConfigurationError, match="only once"):
        fit(models.build("mlp", seed=1, **SMALL_MLP), batches, epochs=2, verbose=0)


def test_fit_does_not_import_a_framework_it_was_not_asked_for(run_python):
    result = run_python(
        "import sys, numpy as np, xdevice\n"
        "from xdevice import models\n"
        "m = models.build('mlp', hidden=[4], inputs=3, classes=2)\n"
        "xdevice.fit(m, (np.ones((8, 3), 'float32'), np.zeros(8, 'int64')), verbose=0)\n"
        "print(sorted(n for n in ('torch', 'jax', 'tensorflow') if n in sys.modules))\n"
    )
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_history_plots_the_loss_curves_as_png(tmp_path):
    pytest.importorskip("matplotlib")
    x, y = data()
    history = fit(models.build("mlp", seed=1, **SMALL_MLP), (x, y), epochs=2, validation=(x, y), verbose=0)
    path = history.plot(str(tmp_path / "loss.png"))
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.endswith("loss.png")


@pytest.mark.parametrize(
    "x, match",
    [
        (
            np.ones((10, 5), np.float32),
            r"x does not have the shape of the model's input\. Expected float32\[rows, 784\]\. "
            r"Received: 'float32\[10, 5\]'\. Fix: models\.build\(.mlp., inputs=5",
        ),
        (
            np.ones((10, 784), np.float64),
            r"x does not have the dtype of the model's input\. Expected float32\[rows, 784\]"
            r"\. Received: 'float64\[10, 784\]'\. Fix: x\.astype\('float32'\)",
        ),
    ],
)
def test_data_a_zoo_model_cannot_take_is_refused_before_any_step(backend, x, match):
    model = models.build("mlp", backend=backend.name, seed=0)
    before = model.numpy_params()
    with pytest.raises(ConfigurationError, match=match):
        fit(model, (x, np.zeros(10, np.int64)), epochs=1, verbose=False)
    assert all(np.array_equal(before[k], v) for k, v in model.numpy_params().items())  # nothing trained


def test_a_float64_model_takes_float64_data():
    model = models.build("mlp", backend="numpy", seed=0).to(dtype="float64")
    x = np.random.default_rng(0).normal(size=(8, 784))
    before = model.numpy_params()
    history = fit(model, (x, np.zeros(8, np.int64)), epochs=1, verbose=False)
    after = model.numpy_params()
    assert np.isfinite(history.steps).all() and all(v.dtype == np.float64 for v in after.values())
    assert any(not np.array_equal(before[k], after[k]) for k in before)  # it trained, in float64


@pytest.mark.parametrize("clip", [{"clip_norm": 0.05}, {"clip_value": 0.002}, {"clip_norm": 0.05, "clip_value": 0.02}])
def test_gradient_clipping_does_what_torch_nn_utils_does(clip):
    """The same steps as a torch loop with clip_grad_value_ then clip_grad_norm_ before
    torch.optim.SGD (limits small enough that every step is clipped)."""
    torch = pytest.importorskip("torch")
    x, y = data()
    model = models.build("mlp", backend="torch", seed=1, **SMALL_MLP)
    module = models.to_native(model, "torch")
    clipped = []

    def clip_as_torch_does():
        if "clip_value" in clip:
            torch.nn.utils.clip_grad_value_(module.parameters(), clip["clip_value"])
        if "clip_norm" in clip:
            clipped.append(torch.nn.utils.clip_grad_norm_(module.parameters(), clip["clip_norm"]) > clip["clip_norm"])

    expected = torch_loop(
        torch, module, torch.optim.SGD(module.parameters(), lr=0.5), x, y, after_backward=clip_as_torch_does
    )
    assert "clip_norm" not in clip or sum(clipped) >= 5  # the limit really bites
    history = fit(model, (x, y), optimizer="sgd", lr=0.5, batch_size=8, shuffle=False, verbose=0, **clip)
    assert_trained_as(history, expected, model, module)


def test_clipping_gives_the_same_steps_on_every_backend(backend):
    x, y = data()
    runs = {}
    for name in ("numpy", backend.name):
        history = fit(
            models.build("mlp", backend=name, seed=1, **SMALL_MLP),
            (x, y),
            optimizer="adam",
            lr=0.01,
            batch_size=8,
            shuffle=False,
            verbose=0,
            clip_norm=0.05,
            clip_value=0.01,
        )
        runs[name] = history.steps
    np.testing.assert_allclose(runs[backend.name], runs["numpy"], rtol=1e-4, atol=1e-5)
    unclipped = fit(
        models.build("mlp", backend="numpy", seed=1, **SMALL_MLP),
        (x, y),
        optimizer="adam",
        lr=0.01,
        batch_size=8,
        shuffle=False,
        verbose=0,
    ).steps
    assert not np.allclose(unclipped, runs["numpy"])  # clipping changed the run


def test_a_clip_limit_that_is_not_a_positive_number_is_refused():
    with pytest.raises(ConfigurationError, match=r"clip_norm is a positive number.*Received: -1"):
        Trainer(models.build("mlp", backend="numpy", **SMALL_MLP), clip_norm=-1)


def test_epochs_is_a_total_and_asking_for_one_already_reached_says_so(tmp_path):
    x, y = data()
    trainer = Trainer(models.build("mlp", backend="numpy", seed=1, **SMALL_MLP), optimizer="sgd")
    trainer.fit((x, y), epochs=2, batch_size=8, verbose=0, checkpoint_dir=str(tmp_path))
    resumed = Trainer(models.build("mlp", backend="numpy", seed=1, **SMALL_MLP), optimizer="sgd").load(str(tmp_path))
    with pytest.warns(
        UserWarning,
        match=r"already completed 2 epoch\(s\), and epochs=2 is the total.*"
        r"fit\(data, epochs=4\) trains 2 more",
    ):
        history = resumed.fit((x, y), epochs=2, batch_size=8, verbose=0)
    assert resumed.step_count == trainer.step_count and len(history.epochs) == 2
    resumed.fit((x, y), epochs=3, batch_size=8, verbose=0)
    assert resumed.epoch == 3 and resumed.step_count == trainer.step_count + 10
