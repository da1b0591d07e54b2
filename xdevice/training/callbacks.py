"""Callbacks: code that runs at the begin and end of training, of each epoch and of each step.

A callback subclasses :class:`Callback` and overrides what it needs; ``fit(...,
callbacks=[...])`` calls them in order. Each hook gets the trainer (``trainer.model``,
``trainer.history``, ``trainer.save``); setting ``trainer.stop_training = True`` ends the run
after the current step. The ones here:

- :class:`Progress`: a live ``tqdm`` bar per epoch on a terminal (steps/s, loss, ETA), one
  line per epoch elsewhere; ``fit`` adds it unless ``verbose=0``;
- :class:`EarlyStopping`: stop when a monitored value stops improving (Keras's rule);
- :class:`BestCheckpoint`: save a checkpoint whenever the monitored value improves;
- :class:`CSVLogger`: one CSV row per epoch; :class:`TensorBoard`: scalars per step and per
  epoch in TensorBoard event files, written by ``tensorboardX``'s ``SummaryWriter``
  (``pip install 'xdevice[log]'``).

>>> class Count(Callback):
...     def on_step_end(self, trainer, step, logs):
...         self.steps = step
"""

from __future__ import annotations

import csv
import math
import sys
from typing import Any

from xdevice._errors import ConfigurationError, message

__all__ = ["BestCheckpoint", "CSVLogger", "Callback", "EarlyStopping", "Progress", "TensorBoard"]


class Callback:
    """The hooks, each a no-op here. ``logs`` of a step: ``loss``, metrics, ``lr``; of an
    epoch: the epoch's record in ``trainer.history.epochs`` (``val_*`` included)."""

    def on_fit_begin(self, trainer: Any) -> None: ...

    def on_epoch_begin(self, trainer: Any, epoch: int) -> None: ...

    def on_step_end(self, trainer: Any, step: int, logs: dict[str, float]) -> None: ...

    def on_epoch_end(self, trainer: Any, epoch: int, logs: dict[str, Any]) -> None: ...

    def on_fit_end(self, trainer: Any) -> None: ...


class _Monitor:
    """A value in the epoch records and which way is better ("min" for losses)."""

    def __init__(self, monitor: str, mode: str, min_delta: float = 0.0):
        if mode not in ("min", "max"):
            raise ConfigurationError(message("Unknown mode", received=mode, choices=["min", "max"]))
        self.monitor, self.mode, self.min_delta = monitor, mode, abs(min_delta)
        self.best = math.inf if mode == "min" else -math.inf

    def improved(self, logs: dict[str, Any]) -> bool:
        if self.monitor not in logs:
            raise ConfigurationError(
                message(
                    f"The monitored value {self.monitor!r} is not in the epoch's record",
                    received=self.monitor,
                    choices=sorted(k for k, v in logs.items() if isinstance(v, float)),
                    fix="monitor one of these; val_* needs fit(..., validation=(x, y))",
                )
            )
        value = logs[self.monitor]
        better = value < self.best - self.min_delta if self.mode == "min" else value > self.best + self.min_delta
        if better:
            self.best = value
        return better


class EarlyStopping(Callback, _Monitor):
    """Stop when ``monitor`` has not improved by more than ``min_delta`` for ``patience``
    epochs in a row (at least one); ``restore_best`` puts back the weights of the best epoch (Keras's
    ``restore_best_weights``)."""

    def __init__(
        self,
        monitor: str = "val_loss",
        *,
        patience: int = 0,
        min_delta: float = 0.0,
        mode: str = "min",
        restore_best: bool = False,
    ):
        _Monitor.__init__(self, monitor, mode, min_delta)
        self.patience, self.restore_best = patience, restore_best
        self.waited, self.stopped_epoch, self.best_weights = 0, None, None

    def on_epoch_end(self, trainer, epoch, logs):
        if self.improved(logs):
            self.waited = 0
            if self.restore_best:
                self.best_weights = trainer.weights()
            return
        self.waited += 1
        if self.waited >= self.patience:  # Keras's and Lightning's count
            trainer.stop_training, self.stopped_epoch = True, epoch
            if self.restore_best and self.best_weights is not None:
                trainer.set_weights(self.best_weights)


class BestCheckpoint(Callback, _Monitor):
    """``trainer.save(folder)`` after each epoch whose ``monitor`` is the best so far."""

    def __init__(self, folder: str, monitor: str = "val_loss", *, mode: str = "min"):
        _Monitor.__init__(self, monitor, mode)
        self.folder, self.best_epoch = folder, None

    def on_epoch_end(self, trainer, epoch, logs):
        if self.improved(logs):
            trainer.save(self.folder)
            self.best_epoch = epoch


class CSVLogger(Callback):
    """Each epoch's record as a row of ``path`` (the columns of the first epoch; appended to
    when resuming, as Keras's ``CSVLogger(append=True)``)."""

    def __init__(self, path: str, *, append: bool = False):
        self.path, self.append = path, append
        self.columns: list[str] | None = None

    def on_epoch_end(self, trainer, epoch, logs):
        first = self.columns is None
        if self.columns is None:
            self.columns = list(logs)
        with open(self.path, "a" if (self.append or not first) else "w", newline="") as file:
            writer = csv.DictWriter(file, self.columns, extrasaction="ignore")
            if first and (not self.append or file.tell() == 0):
                writer.writeheader()
            writer.writerow(logs)


class TensorBoard(Callback):
    """Scalars in TensorBoard event files under ``logdir``: ``train/loss`` and ``train/lr``
    every ``every`` steps, and every number of each epoch's record as ``epoch/<name>``."""

    def __init__(self, logdir: str, *, every: int = 1):
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise ConfigurationError(
                message(
                    "TensorBoard logging needs tensorboardX", received="not installed", fix="pip install 'xdevice[log]'"
                )
            ) from None
        self.writer_class, self.logdir, self.every = SummaryWriter, logdir, every
        self.writer: Any = None  # a SummaryWriter, opened by on_fit_begin

    def on_fit_begin(self, trainer):
        self.writer = self.writer_class(self.logdir)

    def on_step_end(self, trainer, step, logs):
        if step % self.every == 0:
            for key, value in logs.items():
                self.writer.add_scalar(f"train/{key}", value, step)

    def on_epoch_end(self, trainer, epoch, logs):
        for key, value in logs.items():
            if isinstance(value, (int, float)) and key != "epoch":
                self.writer.add_scalar(f"epoch/{key}", value, epoch)
        self.writer.flush()

    def on_fit_end(self, trainer):
        self.writer.close()  # its last events are on disk when fit returns


class Progress(Callback):
    """A live ``tqdm`` bar per epoch on a terminal (steps/s, loss, ETA); off a terminal one
    plain line per epoch (a log keeps no carriage returns). Written to stdout, as Keras's."""

    def __init__(self, epochs: int, steps_per_epoch: int | None, stream: Any = None):
        self.epochs, self.total = epochs, steps_per_epoch or None
        self.stream = stream or sys.stdout
        self.live = getattr(self.stream, "isatty", lambda: False)()
        self.bar = None

    def on_epoch_begin(self, trainer, epoch):
        if self.live:
            from tqdm import tqdm

            self.bar = tqdm(
                total=self.total,
                initial=trainer.batch,
                desc=f"epoch {epoch}/{self.epochs}",
                file=self.stream,
                unit="step",
                dynamic_ncols=True,
                leave=False,
            )

    def on_step_end(self, trainer, step, logs):
        if self.bar is not None:
            self.bar.n = trainer.batch
            self.bar.set_postfix(loss=f"{logs['loss']:.4f}", refresh=False)
            self.bar.update(0)

    def on_epoch_end(self, trainer, epoch, logs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        shown = "  ".join(
            f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in logs.items() if k != "epoch"
        )
        self.stream.write(f"epoch {epoch}/{self.epochs}  {shown}\n")
        self.stream.flush()

    def on_fit_end(self, trainer):
        if self.bar is not None:
            self.bar.close()
