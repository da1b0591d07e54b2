"""Callbacks: the hooks in order, early stopping, best checkpoints, CSV and TensorBoard logs,
and the progress bar (tqdm on a terminal, a line per epoch elsewhere)."""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest

from xdevice import ConfigurationError, Trainer, fit, models
from xdevice.training import BestCheckpoint, Callback, CSVLogger, EarlyStopping, TensorBoard, checkpoint

MLP = {"hidden": [16], "inputs": 6, "classes": 3}


def data(rows: int = 80, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 6)).astype("float32")
    return x, (x[:, 0] > 0).astype("int64") + (x[:, 1] > 0.5)


class Recorder(Callback):
    def __init__(self):
        self.calls = []

    def on_fit_begin(self, trainer):
        self.calls.append("fit")

    def on_epoch_begin(self, trainer, epoch):
        self.calls.append(f"epoch {epoch}")

    def on_step_end(self, trainer, step, logs):
        self.calls.append(f"step {step} {sorted(logs)}")

    def on_epoch_end(self, trainer, epoch, logs):
        self.calls.append(f"end {epoch} {logs is trainer.history.epochs[-1]}")

    def on_fit_end(self, trainer):
        self.calls.append("done")


def test_the_hooks_run_in_order_with_the_logs(backend):
    recorder = Recorder()
    fit(
        models.build("mlp", backend=backend.name, **MLP),
        data(16),
        epochs=2,
        batch_size=8,
        verbose=0,
        callbacks=[recorder],
    )
    step = "['accuracy', 'loss', 'lr']"
    assert recorder.calls == [
        "fit",
        "epoch 1",
        f"step 1 {step}",
        f"step 2 {step}",
        "end 1 True",
        "epoch 2",
        f"step 3 {step}",
        f"step 4 {step}",
        "end 2 True",
        "done",
    ]


def test_early_stopping_stops_and_restores_the_best_weights():
    x, y = data()
    trainer = Trainer(models.build("mlp", seed=1, **MLP), optimizer="adam", lr=0.02)
    # the validation loss falls every epoch, so watching for a rise ("max") keeps epoch 1 the best
    stop = EarlyStopping("val_loss", patience=2, mode="max", restore_best=True)
    history = trainer.fit((x, y), epochs=20, batch_size=8, validation=data(40, seed=1), verbose=0, callbacks=[stop])
    losses = history["val_loss"]
    assert losses[0] > losses[1] > losses[2]
    assert stop.stopped_epoch == len(losses) == 3  # epoch 1, then 2 epochs of patience
    assert trainer.evaluate(data(40, seed=1))["loss"] == pytest.approx(losses[0], rel=1e-5)  # epoch 1's weights


def test_best_checkpoint_keeps_the_best_epoch(tmp_path):
    x, y = data()
    keep = BestCheckpoint(str(tmp_path / "best"), monitor="accuracy", mode="max")
    history = fit(
        models.build("mlp", seed=1, **MLP),
        (x, y),
        optimizer="adam",
        lr=0.02,
        epochs=4,
        batch_size=8,
        verbose=0,
        callbacks=[keep],
    )
    accuracy = history["accuracy"]
    first_best = int(np.argmax(accuracy)) + 1  # the first epoch reaching the maximum
    assert keep.best_epoch == first_best
    _, _, record = checkpoint.read(str(tmp_path / "best"))
    assert record["epoch"] == first_best


def test_a_monitored_value_that_is_not_recorded_names_those_that_are():
    with pytest.raises(
        ConfigurationError,
        match=r"'val_loss' is not in the epoch's record.*Valid choices: "
        r"accuracy.*fit\(\.\.\., validation=\(x, y\)\)",
    ):
        fit(models.build("mlp", **MLP), data(16), epochs=1, verbose=0, callbacks=[EarlyStopping()])


def test_the_csv_log_has_a_row_per_epoch(tmp_path):
    path = tmp_path / "log.csv"
    history = fit(
        models.build("mlp", seed=1, **MLP),
        data(),
        epochs=3,
        batch_size=16,
        validation=data(16, seed=2),
        verbose=0,
        callbacks=[CSVLogger(str(path))],
    )
    with path.open() as file:
        rows = list(csv.DictReader(file))
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3]
    assert [float(r["val_loss"]) for r in rows] == pytest.approx(history["val_loss"])
    assert {"loss", "accuracy", "lr", "seconds"} <= set(rows[0])


def test_tensorboard_event_files_hold_each_step_and_epoch(tmp_path):
    pytest.importorskip("tensorboardX")
    tf = pytest.importorskip("tensorflow")
    history = fit(
        models.build("mlp", seed=1, **MLP),
        data(),
        epochs=2,
        batch_size=16,
        verbose=0,
        callbacks=[TensorBoard(str(tmp_path))],
    )
    values: dict[str, list[tuple[int, float]]] = {}
    for path in tmp_path.iterdir():  # read back with TensorFlow's own reader of the format
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                values.setdefault(value.tag, []).append((event.step, value.simple_value))
    assert [s for s, _ in values["train/loss"]] == list(range(1, 11))
    assert [v for _, v in values["train/loss"]] == pytest.approx(history.steps, rel=1e-6)
    assert [v for _, v in values["epoch/loss"]] == pytest.approx(history["loss"], rel=1e-6)
    assert "train/lr" in values and "epoch/accuracy" in values


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_is_a_live_tqdm_bar_on_a_terminal_and_lines_elsewhere(monkeypatch):
    screen = Terminal()
    monkeypatch.setattr("sys.stdout", screen)
    fit(models.build("mlp", seed=1, **MLP), data(), epochs=2, batch_size=8, verbose=1)
    shown = screen.getvalue()
    assert "\r" in shown and "step/s" in shown and "epoch 1/2:" in shown  # tqdm's bar
    assert "epoch 1/2  loss" in shown and "epoch 2/2  loss" in shown  # each epoch's summary
    plain = io.StringIO()
    monkeypatch.setattr("sys.stdout", plain)
    fit(models.build("mlp", seed=1, **MLP), data(), epochs=2, batch_size=8, verbose=1)
    assert "\r" not in plain.getvalue() and len(plain.getvalue().splitlines()) == 2
