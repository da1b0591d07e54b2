"""``Trainer`` and ``fit``: one training loop for every backend and every kind of model.

The step is written once: forward (the program's), loss and metrics (over the op set),
gradients (the backend's own autodiff: autograd, ``jax.value_and_grad``, ``GradientTape``),
and the optimizer's pure update (over the op set). It is compiled the backend's way
(``jax.jit``, ``tf.function``; PyTorch runs eagerly). Batches come from a prefetching
loader; ``History`` reports the fraction of each epoch spent waiting for input.

``epochs`` counts from the start of training, as Keras's ``epochs`` with ``initial_epoch``:
a trainer resumed from a checkpoint taken in epoch 2 and asked for ``epochs=3`` finishes
epoch 2 from the batch where it stopped, then trains epoch 3.

>>> from xdevice import models, fit
>>> import numpy as np
>>> model = models.build("mlp", hidden=[16], inputs=4, classes=3, seed=0)
>>> x, y = np.random.default_rng(0).normal(size=(64, 4)).astype("float32"), np.arange(64) % 3
>>> history = fit(model, (x, y), loss="cross_entropy", optimizer="adam", epochs=2, verbose=0)
>>> len(history.epochs), history.last("loss") < history.epochs[0]["loss"]
(2, True)
"""

from __future__ import annotations

import inspect
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from xdevice._errors import ConfigurationError, message
from xdevice.training import checkpoint
from xdevice.training.callbacks import Callback, Progress
from xdevice.training.data import Prefetcher, as_batches
from xdevice.training.history import History
from xdevice.training.losses import loss_function, metric_function
from xdevice.training.optimizers import Optimizer
from xdevice.training.optimizers import optimizer as make_optimizer
from xdevice.training.precision import LossScale
from xdevice.training.precision import loss_scale as make_loss_scale
from xdevice.training.programs import program, staged
from xdevice.training.replication import replicate

__all__ = ["Trainer", "fit"]

_SKIPPED = "skipped"  # a float16 step skipped for an inf or NaN gradient (1.0) or not (0.0)


class Trainer:
    """Train ``model`` (zoo model, ``torch.nn.Module``, Keras/``tf.Module``, JAX ``(apply, params)``).

    Args:
        loss: ``"cross_entropy"`` (integer labels), ``"mse"``, or ``f(ops, outputs, targets)``.
        optimizer: ``"sgd"``, ``"momentum"``, ``"adam"``, ``"adamw"`` or an optimizer object.
        device: where to train (default: where the model is).
        devices: train data-parallel over these devices with the framework's own engine
            (JAX ``Mesh`` + ``NamedSharding``, TensorFlow ``MirroredStrategy``): the global
            batch is split across them and the gradients are averaged.
        stages: split a sequential model layer-wise, stage ``i`` on ``stages[i]``, for models
            that do not fit one device: a ``torch.nn.Sequential`` (cut into runs of about equal
            parameter counts) or a list of stage models (see ``programs.staged``).
        precision: ``"float32"``; ``"bfloat16"`` or ``"float16"`` compute with float32 master
            weights (float16 with dynamic loss scaling: ``loss_scale``, ``xdevice.training.precision``).
        metrics: names or ``f(ops, outputs, targets)``; reported per epoch.
        jit: compile the step (JAX, TensorFlow).
        clip_norm, clip_value: clip the gradients by their global L2 norm and/or elementwise by
            value before the optimizer's step, as ``torch.nn.utils.clip_grad_norm_`` /
            ``clip_grad_value_`` do (value first when both are given).
        accumulate: take an optimizer step every ``accumulate`` batches, on their summed
            gradients: ``accumulate=k`` with batches of ``b`` rows steps as batches of ``k*b`` would
            (a shorter group ends an epoch). Each optimizer step counts once in ``steps``.
        loss_scale: float16's loss scaling, a ``LossScale`` or a dict of its settings
            (``torch.amp.GradScaler``'s defaults when left out).

    The optimizer's ``lr`` may be a schedule (``xdevice.training.schedules``): the trainer
    passes each step's rate into the step, and a checkpoint records the schedule.
    """

    def __init__(
        self,
        model: Any,
        loss: str | Callable = "cross_entropy",
        optimizer: str | Optimizer = "adam",
        *,
        device: Any = None,
        devices: Sequence[Any] | None = None,
        stages: Sequence[Any] | None = None,
        precision: str = "float32",
        metrics: Sequence[str | Callable] = ("accuracy",),
        jit: bool = True,
        clip_norm: float | None = None,
        clip_value: float | None = None,
        accumulate: int = 1,
        loss_scale: LossScale | dict | None = None,
        **optimizer_options: Any,
    ):
        chosen = {k: v for k, v in (("device", device), ("devices", devices), ("stages", stages)) if v is not None}
        if len(chosen) > 1:
            raise ConfigurationError(
                message("Pass one of device=, devices= (data parallel) or stages= (model parallel)", received=chosen)
            )
        self.program = staged(model, list(stages)) if stages else program(model, devices[0] if devices else device)
        self.declared = _declared_input(model)
        self.program.set_precision(precision)
        self.backend, self.ops = self.program.backend, self.program.ops
        self.loss_name = loss if isinstance(loss, str) else getattr(loss, "__name__", "loss")
        self.loss = loss_function(loss)
        if loss != "cross_entropy":
            metrics = [m for m in metrics if m != "accuracy"]  # accuracy needs class labels
        self.metrics = {
            m if isinstance(m, str) else getattr(m, "__name__", f"metric{i}"): metric_function(m)
            for i, m in enumerate(metrics)
        }
        for name, limit in (("clip_norm", clip_norm), ("clip_value", clip_value)):
            if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit <= 0):
                raise ConfigurationError(
                    message(
                        f"{name} is a positive number",
                        received=limit,
                        fix=f"e.g. {name}=1.0, or leave it out for no clipping",
                    )
                )
        self.clip_norm, self.clip_value = clip_norm, clip_value
        if isinstance(accumulate, bool) or not isinstance(accumulate, int) or accumulate < 1:
            raise ConfigurationError(
                message(
                    "accumulate is how many batches make one optimizer step",
                    expected="an int of 1 or more",
                    received=accumulate,
                )
            )
        self.accumulate = accumulate
        if loss_scale is not None and precision != "float16":
            raise ConfigurationError(
                message(
                    "loss_scale applies to float16 only",
                    received=f"precision={precision!r}",
                    fix="pass precision='float16', or leave loss_scale out",
                )
            )
        self.scaler = make_loss_scale(loss_scale) if precision == "float16" else None
        self.optimizer = make_optimizer(optimizer, **optimizer_options)
        self.schedule = self.optimizer.schedule
        jit = jit and self.program.compiles_whole  # a split model compiles stage by stage
        compile_ = self.backend.jit if jit else (lambda f: f)
        self.replicas = replicate(devices, backend=self.backend.name)
        self.program.params = self.replicas.place_params(self.program.params)
        self.program.buffers = self.replicas.place_params(self.program.buffers)
        state = self.optimizer.init(self.ops, self.program.params)
        self.state = self._placed({**state, **(self.scaler.init(self.ops) if self.scaler else {})})
        self.step_count = self.epoch = self.batch = 0
        self.seed = 0
        self.history = History()
        replicated = self.replicas.count > 1  # replicated steps are always compiled (strategy.run, Mesh)
        compile_step = self.replicas.compile if jit or replicated else (lambda f: f)
        self._train = compile_step(self._train_step)
        self._compiled = self._train is not self._train_step  # eager PyTorch: rates stay Python floats
        if accumulate > 1:
            self._accumulate, self._apply_total = compile_step(self._accumulate_step), compile_step(self._apply_step)
            self._zeros = self._placed(  # beside each parameter (stages: on its stage's device)
                {k: self.ops.zeros(self.ops.shape(v), self.ops.dtype(v)) for k, v in self.program.params.items()}
            )
            self._total = self._zeros  # the summed gradients
            self._group: list[tuple[int, float, dict[str, float]]] = []  # (rows, loss, metrics) so far
        self._evaluate = compile_(self._eval_step)

    # -- the step, written once ---------------------------------------------------------

    def _train_step(self, params, buffers, state, x, y, lr):
        buffers, grads, loss, metrics = self._gradients(params, buffers, state, x, y)
        params, state, skipped = self._apply(params, state, grads, lr)
        return params, buffers, state, loss, {**metrics, **skipped}

    def _gradients(self, params, buffers, state, x, y):
        """The global batch's mean gradient, loss and metrics (float16: scaled, then unscaled)."""
        ops, program, replicas = self.ops, self.program, self.replicas
        weight = replicas.weight(x)  # this replica's share of the global batch (1 on one device)
        scale = state.get("amp/scale")

        def objective(p):
            out, new_buffers = program.forward(p, buffers, x, True)
            loss = ops.multiply(self.loss(ops, out, y), weight)
            return (loss if scale is None else ops.multiply(loss, scale)), (new_buffers, out, loss)

        (_, (buffers, out, loss)), grads = replicas.value_and_grad(objective, params)  # the global batch's
        if scale is not None:
            inverse = ops.divide(1.0, scale)
            grads = {k: ops.multiply(g, ops.cast(inverse, ops.dtype(g))) for k, g in grads.items()}
        metrics = {k: replicas.sum(ops.multiply(f(ops, out, y), weight)) for k, f in self.metrics.items()}
        return buffers, grads, replicas.sum(loss), metrics

    def _apply(self, params, state, grads, lr):
        """The optimizer's step on ``grads`` (clipped); float16 skips a step with an inf or NaN
        gradient (params and state kept) and updates the loss scale."""
        ops = self.ops
        grads = self._clipped(grads)
        if self.scaler is None:
            params, state = self.optimizer.update(ops, params, grads, state, lr=lr, inplace=True)  # old values unused
            return params, state, {}
        finite = self.scaler.all_finite(ops, grads)
        kept = {k: v for k, v in state.items() if not k.startswith("amp/")}
        new_params, new_state = self.optimizer.update(ops, params, grads, kept, lr=lr)
        params = {k: ops.where(finite, new_params[k], params[k]) for k in params}
        kept = {k: ops.where(finite, new_state[k], kept[k]) for k in kept}
        state = self.scaler.update(ops, {**state, **kept}, finite)
        return params, state, {_SKIPPED: ops.subtract(1.0, ops.cast(finite, "float32"))}

    def _accumulate_step(self, params, buffers, state, total, x, y, rows):
        """One batch of an accumulated step: its gradient, times its rows, added to ``total``."""
        buffers, grads, loss, metrics = self._gradients(params, buffers, state, x, y)
        total = {
            k: self.ops.add(total[k], self.ops.multiply(g, self.ops.cast(rows, self.ops.dtype(g))))
            for k, g in grads.items()
        }
        return buffers, total, loss, metrics

    def _apply_step(self, params, state, total, rows, lr):
        """The optimizer's step on the accumulated gradients' row-weighted mean."""
        ops = self.ops
        return self._apply(
            params, state, {k: ops.divide(g, ops.cast(rows, ops.dtype(g))) for k, g in total.items()}, lr
        )

    def _clipped(self, grads: dict) -> dict:
        """Gradient clipping as torch.nn.utils does it: by value first, then by global norm."""
        if self.clip_value is None and self.clip_norm is None:
            return grads
        names, values = list(grads), list(grads.values())
        if self.clip_value is not None:
            values = self.ops.clip_by_value(values, self.clip_value)
        if self.clip_norm is not None:
            values = self.ops.clip_by_global_norm(values, self.clip_norm)
        return dict(zip(names, values))

    def _eval_step(self, params, buffers, x, y):
        out, _ = self.program.forward(params, buffers, x, False)
        return self.loss(self.ops, out, y), {k: f(self.ops, out, y) for k, f in self.metrics.items()}

    def step(self, x: Any, y: Any) -> float:
        """One optimisation step on a batch (with ``accumulate=k``: one batch of the k that make
        a step); returns its loss."""
        x, y, rows = self._place((x, y))
        result = self._step(x, y, rows)
        return result[0] if result else self._group[-1][1]

    def _step(self, x, y, rows: int, last: bool = False) -> tuple[float, dict[str, float], int] | None:
        """A batch through the step: the optimizer step's loss, metrics and rows, or None while
        an accumulated step waits for more batches (``last``: no more come this epoch)."""
        p = self.program
        if self.accumulate == 1:
            lr = self._argument(self.schedule(self.step_count))
            p.params, p.buffers, self.state, loss, metrics = self._train(p.params, p.buffers, self.state, x, y, lr)
            return self._stepped({"loss": loss, **metrics}, rows)
        p.buffers, self._total, loss, metrics = self._accumulate(
            p.params, p.buffers, self.state, self._total, x, y, self._argument(rows)
        )
        self._group.append((rows, self._float(loss), {k: self._float(v) for k, v in metrics.items()}))
        return self._finish_group() if len(self._group) == self.accumulate or last else None

    def _finish_group(self) -> tuple[float, dict[str, float], int]:
        """The optimizer step on the accumulated batches; their metrics weighted by rows."""
        p, group = self.program, self._group
        rows = sum(n for n, _, _ in group)
        lr = self._argument(self.schedule(self.step_count))
        p.params, self.state, skipped = self._apply_total(p.params, self.state, self._total, self._argument(rows), lr)
        metrics = {
            key: sum(n * (loss if key == "loss" else seen[key]) for n, loss, seen in group) / rows
            for key in ("loss", *group[0][2])
        }
        self._total, self._group = self._zeros, []
        return self._stepped({**metrics, **skipped}, rows)

    def _stepped(self, metrics: dict[str, Any], rows: int) -> tuple[float, dict[str, float], int]:
        self.program.write_back()
        self.step_count += 1
        values = {k: self._float(v) for k, v in metrics.items()}
        return values.pop("loss"), values, rows

    def _argument(self, number: float) -> Any:
        """A number handed to the step: a float32 scalar for a compiled step (one trace for
        every value), the Python number for an eager one (PyTorch's fused updates take it)."""
        return np.float32(number) if self._compiled else number

    # -- loops ----------------------------------------------------------------------------

    def fit(
        self,
        data: Any,
        epochs: int = 1,
        *,
        batch_size: int = 32,
        shuffle: bool = True,
        seed: int = 0,
        validation: Any = None,
        prefetch: int = 2,
        steps: int | None = None,
        verbose: int = 1,
        checkpoint_dir: str | None = None,
        callbacks: Sequence[Callback] = (),
    ) -> History:
        """Train until ``epochs`` epochs are complete (counted from the start; see the module).

        Args:
            data: ``(x, y)`` numpy arrays, or an iterable of ``(x, y)`` batches.
            batch_size, shuffle, seed: how arrays are cut; the order depends on (seed, epoch) only.
            validation: ``(x, y)`` or batches, evaluated after each epoch (``val_*``).
            prefetch: batches placed on the device ahead of time by a background thread; 0: none.
            steps: stop after this many optimizer steps (mid-epoch; a checkpoint resumes there).
            verbose: 1: a progress bar on a terminal, a line per epoch elsewhere; 0: silent.
            checkpoint_dir: write a checkpoint there after each epoch and when stopping.
            callbacks: :class:`xdevice.training.callbacks.Callback` objects (early stopping,
                best checkpoint, CSV and TensorBoard logging).

        Returns:
            ``History`` (``history.model`` is the trained object).
        """
        _check_input(self.declared, data)
        if self.epoch >= epochs:  # epochs is a total: a resumed run that reached it has nothing to do
            warnings.warn(
                message(
                    f"Nothing to train: this trainer has already completed {self.epoch} epoch(s), and epochs={epochs} "
                    "is the total to reach, not a number to add",
                    fix=f"fit(data, epochs={self.epoch + epochs}) trains {epochs} more",
                ),
                UserWarning,
                stacklevel=2,
            )
            return self.history
        source = as_batches(data, batch_size, shuffle, seed)
        self.seed = seed
        callbacks = ([Progress(epochs, len(source))] if verbose else []) + list(callbacks)
        self.stop_training = False
        taken = 0
        for callback in callbacks:
            callback.on_fit_begin(self)
        while self.epoch < epochs and (steps is None or taken < steps) and not self.stop_training:
            began, sums = time.perf_counter(), {"rows": 0.0}
            for callback in callbacks:
                callback.on_epoch_begin(self, self.epoch + 1)
            loader = Prefetcher(source.epoch(self.epoch, self.batch), self._place, prefetch)
            finished = True
            try:
                for x, y, n in loader:
                    self.batch += 1
                    done = self._step(x, y, n, last=len(source) > 0 and self.batch >= len(source))
                    if done is None:  # an accumulated step waits for its other batches
                        continue
                    self._record(done, sums, callbacks)
                    taken += 1
                    if (steps is not None and taken >= steps) or self.stop_training:
                        finished = len(source) > 0 and self.batch >= len(source)
                        break
                else:
                    if self.accumulate > 1 and self._group:  # batches of unknown count ended mid-step
                        self._record(self._finish_group(), sums, callbacks)
            finally:
                loader.close()
            if not finished:
                break
            seconds = time.perf_counter() - began
            rows, skipped, lr = sums.pop("rows"), sums.pop(_SKIPPED, 0.0), sums.pop("lr", None)
            record: dict[str, Any] = {"epoch": self.epoch + 1, **{k: v / max(rows, 1) for k, v in sums.items()}}
            if validation is not None:
                record.update({f"val_{k}": v for k, v in self.evaluate(validation, batch_size=batch_size).items()})
            if lr is not None:
                record["lr"] = lr  # the epoch's last step's
            if self.scaler is not None:
                record["skipped_steps"] = int(skipped)
                record["loss_scale"] = self._float(self.state["amp/scale"])
            record["input_wait"] = loader.waited / seconds if seconds else 0.0
            record["seconds"] = seconds
            self.epoch, self.batch = self.epoch + 1, 0
            self.history.epochs.append(record)
            for callback in callbacks:
                callback.on_epoch_end(self, record["epoch"], record)
            if checkpoint_dir:
                self.save(checkpoint_dir)
        if checkpoint_dir:
            self.save(checkpoint_dir)
        for callback in callbacks:
            callback.on_fit_end(self)
        self.history.model = self.program.result()
        return self.history

    def _record(
        self, done: tuple[float, dict[str, float], int], sums: dict[str, float], callbacks: list[Callback]
    ) -> None:
        """An optimizer step into the epoch's sums (``skipped``: a count, ``lr``: the last
        rate, the rest weighted by rows), the history and the callbacks."""
        loss, metrics, rows = done
        lr = sums["lr"] = self.schedule(self.step_count - 1)  # the rate the step just taken used
        sums["rows"] += rows
        sums[_SKIPPED] = sums.get(_SKIPPED, 0.0) + metrics.pop(_SKIPPED, 0.0)
        for key, value in {"loss": loss, **metrics}.items():
            sums[key] = sums.get(key, 0.0) + value * rows
        self.history.steps.append(loss)
        logs = {"loss": loss, **metrics, "lr": lr}
        for callback in callbacks:
            callback.on_step_end(self, self.step_count, logs)

    def evaluate(self, data: Any, batch_size: int = 256) -> dict[str, float]:
        """Mean loss and metrics over ``data`` in inference mode (batch norm uses running stats)."""
        source = as_batches(data, batch_size, shuffle=False)
        sums: dict[str, float] = {}
        rows = 0
        for batch in source.epoch(0):
            x, y = self._on_device(batch)  # whole, not split: evaluated as on one device
            x, y = self.replicas.place_params({"x": x, "y": y}).values()  # beside the replicated params
            loss, metrics = self._evaluate(self.program.params, self.program.buffers, x, y)
            n = self.ops.shape(x)[0]
            for key, value in {"loss": loss, **metrics}.items():
                sums[key] = sums.get(key, 0.0) + self._float(value) * n
            rows += n
        return {k: v / max(rows, 1) for k, v in sums.items()}

    @property
    def model(self) -> Any:
        """The trained object: the user's own (trained in place), or a new JAX pair."""
        return self.program.result()

    # -- checkpoints ----------------------------------------------------------------------

    def weights(self) -> dict[str, Any]:
        """A numpy copy of the trained parameters (``set_weights`` puts them back)."""
        return {k: self.ops.to_numpy(v).copy() for k, v in self.program.params.items()}

    def set_weights(self, arrays: dict[str, Any]) -> None:
        p = self.program
        p.params = self._placed({k: arrays[k] for k in p.params})
        p.write_back()

    def save(self, folder: str) -> None:
        """Write a checkpoint (safetensors + JSON) that :meth:`load` resumes exactly (with
        several processes, rank 0 writes it: every rank holds the same values); the learning
        rate schedule is part of the optimizer's record."""
        if self.accumulate > 1 and self._group:
            raise ConfigurationError(
                message(
                    "A checkpoint is written between optimizer steps, and this one has "
                    f"{len(self._group)} of its {self.accumulate} accumulated batches",
                    fix=f"save after {self.accumulate - len(self._group)} more step() call(s); fit saves between steps",
                )
            )
        if self.replicas.rank != 0:
            return
        p, to_numpy = self.program, self.ops.to_numpy
        arrays = {
            **{f"param/{k}": to_numpy(v) for k, v in p.params.items()},
            **{f"buffer/{k}": to_numpy(v) for k, v in p.buffers.items()},
        }
        record = {
            "step": self.step_count,
            "epoch": self.epoch,
            "batch": self.batch,
            "seed": self.seed,
            "optimizer": self.optimizer.config(),
            "loss": self.loss_name,
            "precision": self.program.precision,
            "backend": self.backend.name,
            "history": {"epochs": self.history.epochs, "steps": self.history.steps},
        }
        checkpoint.write(folder, arrays, {k: to_numpy(v) for k, v in self.state.items()}, record)

    def load(self, folder: str) -> Trainer:
        """Resume from a checkpoint :meth:`save` wrote: weights, optimizer state, position.

        Raises:
            ConfigurationError: the checkpoint belongs to another model or optimizer.
        """
        arrays, state, record = checkpoint.read(folder)
        p = self.program
        expected = {f"param/{k}" for k in p.params} | {f"buffer/{k}" for k in p.buffers}
        if set(arrays) != expected or set(state) != set(self.state):
            wrong = sorted(set(arrays) ^ expected) or sorted(set(state) ^ set(self.state))
            raise ConfigurationError(
                message(
                    "The checkpoint does not match this model and optimizer",
                    received=wrong[:5],
                    fix="build the same model and optimizer first",
                )
            )
        mine = self.optimizer.config()
        if record["optimizer"] != mine:  # the learning rate's schedule included
            differ = [
                k for k in sorted(set(mine) | set(record["optimizer"])) if mine.get(k) != record["optimizer"].get(k)
            ]
            raise ConfigurationError(
                message(
                    "The checkpoint used another optimizer",
                    expected=str({k: mine.get(k) for k in differ}),
                    received={k: record["optimizer"].get(k) for k in differ},
                    fix="build the optimizer (and its lr schedule) the checkpointed run used",
                )
            )
        p.params = self._placed({k: arrays[f"param/{k}"] for k in p.params})
        p.buffers = self._placed({k: arrays[f"buffer/{k}"] for k in p.buffers})
        p.write_back()
        self.state = self._placed(state)
        self.step_count, self.epoch, self.batch, self.seed = (record[k] for k in ("step", "epoch", "batch", "seed"))
        self.history.epochs, self.history.steps = record["history"]["epochs"], record["history"]["steps"]
        return self

    # -- helpers --------------------------------------------------------------------------

    def _place(self, batch: tuple[Any, Any]) -> tuple[Any, Any, int]:
        """The batch on the device(s), split across replicas, and its global row count."""
        x, y = self._on_device(batch)
        return (*self.replicas.place_batch(x, y), int(self.ops.shape(x)[0]))

    def _on_device(self, batch: tuple[Any, Any]) -> tuple[Any, Any]:
        return tuple(self.backend.to_device(self.ops.asarray(v), self.program.device) for v in batch)

    def _placed(self, arrays: dict[str, Any]) -> dict[str, Any]:
        placed = {}
        for name, value in arrays.items():
            where = self.program.device_for(name)
            placed[name] = (
                self.ops.asarray(value) if where is None else self.backend.to_device(self.ops.asarray(value), where)
            )
        return self.replicas.place_params(placed)

    def _float(self, value: Any) -> float:
        return float(self.ops.to_numpy(value))


def _declared_input(model: Any) -> Any:
    """A zoo model's example input (one row): the shape and dtype its ``x`` must have."""
    from xdevice import models

    if not isinstance(model, models.Model):
        return None
    example = model.example_input(1)
    if example.dtype.kind == "f" and model.params:  # float inputs come in the weights' dtype (a float64 model)
        example = example.astype(model.ops.dtype(next(iter(model.params.values()))))
    return example


def _check_input(declared: Any, data: Any) -> None:
    """``x`` of ``(x, y)`` arrays against what a zoo model takes, before any framework runs:
    rows of the model's shape (token ids: its rank), and its dtype."""
    if declared is None or not isinstance(data, tuple) or not data or not hasattr(data[0], "shape"):
        return
    x = data[0]
    tokens = np.issubdtype(declared.dtype, np.integer)
    want = f"{declared.dtype}[rows, {', '.join(map(str, declared.shape[1:]))}]"
    got = f"{np.dtype(getattr(x, 'dtype', 'float32')).name}{list(x.shape)}"
    if len(x.shape) != declared.ndim or (not tokens and tuple(x.shape[1:]) != declared.shape[1:]):
        raise ConfigurationError(
            message(
                "x does not have the shape of the model's input",
                expected=want,
                received=got,
                fix=f"reshape x to (rows, {', '.join(map(str, declared.shape[1:]))}); model.example_input(n) shows one",
            )
        )
    kind = np.dtype(getattr(x, "dtype", "float32"))
    if (tokens and not np.issubdtype(kind, np.integer)) or (not tokens and kind != declared.dtype):
        raise ConfigurationError(
            message(
                "x does not have the dtype of the model's input",
                expected=want,
                received=got,
                fix=f"x.astype({declared.dtype.name!r})",
            )
        )


def fit(
    model: Any,
    data: Any,
    *,
    loss: str | Callable = "cross_entropy",
    optimizer: str | Optimizer = "adam",
    epochs: int = 1,
    device: Any = None,
    devices: Sequence[Any] | None = None,
    stages: Sequence[Any] | None = None,
    precision: str = "float32",
    metrics: Sequence[str | Callable] = ("accuracy",),
    **options: Any,
) -> History:
    """Train ``model`` on ``data`` for ``epochs``; see :class:`Trainer` and :meth:`Trainer.fit`.

    Optimizer settings (``lr``, ``momentum``, ``weight_decay``...) and fit settings
    (``batch_size``, ``seed``, ``validation``, ``prefetch``, ``verbose``...) go in ``options``.
    """
    fit_keys = set(inspect.signature(Trainer.fit).parameters) - {"self", "data", "epochs"}
    fit_options = {k: v for k, v in options.items() if k in fit_keys}
    optimizer_options = {k: v for k, v in options.items() if k not in fit_keys}
    trainer = Trainer(
        model,
        loss,
        optimizer,
        device=device,
        devices=devices,
        stages=stages,
        precision=precision,
        metrics=metrics,
        **optimizer_options,
    )
    return trainer.fit(data, epochs, **fit_options)
