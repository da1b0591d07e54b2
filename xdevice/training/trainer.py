"""``Trainer`` and ``fit``: one training loop for every backend and every kind of model.

The step is written once: forward (the program's), loss and metrics (over the op set),
gradients (the backend's own autodiff: autograd, ``jax.value_and_grad``, ``GradientTape``),
and the optimizer's pure update (over the op set). It is compiled the backend's way
(``jax.jit``, ``tf.function``; PyTorch runs eagerly). Batches come from a prefetching
loader; ``History`` reports the fraction of each epoch spent waiting for input.

The data is checked once, before the first step, the same way for every backend and model
(:mod:`xdevice.training.targets`): a zoo model's input shape and dtype, a framework's own
model's input dtype, token ids against the vocabulary, and targets against the loss and the
model's output width. ``fit``'s keywords are checked against its own options and the
optimizer's together, so a misspelt one gets the nearest of both.

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

import copy
import inspect
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from xdevice import _registry
from xdevice._errors import ConfigurationError, message
from xdevice._seed import default_seed
from xdevice.backends.training import Replicas, donating
from xdevice.training import checkpoint
from xdevice.training.callbacks import Callback, Progress
from xdevice.training.data import Batches, Prefetcher, as_batches
from xdevice.training.history import History
from xdevice.training.losses import default_metrics, loss_function, loss_name, metric_function
from xdevice.training.optimizers import Optimizer, option_names
from xdevice.training.optimizers import optimizer as make_optimizer
from xdevice.training.precision import LossScale, precision_name
from xdevice.training.precision import loss_scale as make_loss_scale
from xdevice.training.programs import program, staged
from xdevice.training.replication import replicate
from xdevice.training.targets import FLOATS, Rules

__all__ = ["Trainer", "fit"]

_SKIPPED = "skipped"  # a float16 step skipped for an inf or NaN gradient (1.0) or not (0.0)


class Trainer:
    """Train ``model`` (zoo model, ``torch.nn.Module``, Keras/``tf.Module``, JAX ``(apply, params)``).

    Args:
        loss: ``"cross_entropy"`` (integer labels, or probabilities of the classes),
            ``"binary_cross_entropy"`` / ``"bce"`` (one output, 0/1 targets), ``"mse"``, or
            ``f(ops, outputs, targets)`` (see ``xdevice.training.losses``).
        optimizer: ``"sgd"``, ``"momentum"``, ``"adam"``, ``"adamw"`` or an optimizer object.
        device: where to train (default: where the model is).
        devices: train data-parallel over these devices with the framework's own engine
            (JAX ``Mesh`` + ``NamedSharding``, TensorFlow ``MirroredStrategy``): the global
            batch is split across them and the gradients are averaged.
        strategy: ``"replicate"`` (every device holds the whole model and optimizer state)
            or ``"fsdp"`` (JAX over ``devices=[...]`` in one process; PyTorch across the
            processes ``xdevice launch`` started, with FSDP2: each holds a shard of the
            parameters, gradients and optimizer state, about 1/N of them; the model holds its
            shards from the trainer's making on, so its whole arrays are let go of at once, and
            after training they stay sharded: :meth:`gather` brings them whole, and saving gathers).
        mesh: with ``devices``, lay them out as a grid, ``{"data": d, "model": m}`` (``d * m``
            devices): the batch is split ``d`` ways and the zoo transformers' attention and MLP
            layers and token embedding ``m`` ways (tensor parallel, Megatron-LM's layout; JAX). The model holds
            the split arrays from the trainer's making on, and after training, as under fsdp.
            Default: ``{"data": len(devices)}``.
        stages: split a sequential model layer-wise, stage ``i`` on ``stages[i]``, for models
            that do not fit one device: a ``torch.nn.Sequential`` (cut into runs of about equal
            parameter counts) or a list of stage models (see ``programs.staged``).
        precision: ``"float32"``; ``"bfloat16"`` or ``"float16"`` compute with float32 master
            weights (float16 with dynamic loss scaling: ``loss_scale``, ``xdevice.training.precision``);
            the CLI's spellings (``fp32``, ``bf16``, ``fp16``) too.
        metrics: names or ``f(ops, outputs, targets)``; reported per epoch. Default: accuracy for
            a classification loss, nothing for a regression loss or your own.
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

    On a GPU or TPU, JAX's compiled step donates the params, buffers and optimizer state
    (``jax.jit``'s ``donate_argnums``): the new values take the old ones' memory, so the device
    holds one copy of each, not two. The trainer trains copies of the model's arrays, so the
    arrays you passed in stay valid; an array read from the model between two ``step`` calls
    is deleted by the second (``trainer.model`` hands out arrays that stay valid).
    """

    def __init__(
        self,
        model: Any,
        loss: str | Callable = "cross_entropy",
        optimizer: str | Optimizer = "adam",
        *,
        device: Any = None,
        devices: Sequence[Any] | None = None,
        strategy: str = "replicate",
        mesh: dict[str, int] | None = None,
        stages: Sequence[Any] | None = None,
        precision: str = "float32",
        metrics: Sequence[str | Callable] | None = None,
        jit: bool = True,
        clip_norm: float | None = None,
        clip_value: float | None = None,
        accumulate: int = 1,
        loss_scale: LossScale | dict | None = None,
        **optimizer_options: Any,
    ):
        _check_options(optimizer_options, optimizer, _TRAINER_OPTIONS, "Trainer")
        precision = precision_name(precision)
        chosen = {k: v for k, v in (("device", device), ("devices", devices), ("stages", stages)) if v is not None}
        if len(chosen) > 1:
            raise ConfigurationError(
                message("Pass one of device=, devices= (data parallel) or stages= (model parallel)", received=chosen)
            )
        self.program = staged(model, list(stages)) if stages else program(model, devices[0] if devices else device)
        self.declared = _declared_input(model)
        self.program.set_precision(precision)
        self.backend, self.ops = self.program.backend, self.program.ops
        self.loss = loss_function(loss)
        named = loss_name(loss)  # aliases resolved; None for your own function
        self.loss_name = named or getattr(loss, "__name__", "loss")
        self.metrics = {
            m if isinstance(m, str) else getattr(m, "__name__", f"metric{i}"): metric_function(m, loss)
            for i, m in enumerate(default_metrics(loss) if metrics is None else metrics)
        }
        self.rules = _rules(model, named, self.program)  # what the data must hold, checked before any step
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
        self.replicas = replicate(devices, backend=self.backend.name, strategy=strategy, mesh=mesh)
        self.replicas.fused_by_parts = self.program.fused_by_parts  # how tensor parallel may hold attn.qkv
        self.program.params = self.replicas.place_params(self.program.params)
        self.program.buffers = self.replicas.place_params(self.program.buffers)
        if self.replicas.shards:  # the model's whole arrays let go of at once, not after the first step:
            self.program.write_back()  # beside the shards they are the memory sharding saves
        state = self.optimizer.init(self.ops, self.program.params)
        self.state = self._placed({**state, **(self.scaler.init(self.ops) if self.scaler else {})})
        self.step_count = self.epoch = self.batch = 0
        self.seed = 0
        self.history = History()
        replicated = self.replicas.count > 1  # replicated steps are always compiled (strategy.run, Mesh)
        # donating steps (JAX on a GPU or TPU) delete their inputs: the trainer's own copies
        self._donate = bool(
            (jit or replicated) and getattr(self.backend, "donates", False) and donating([self.program.device.kind])
        )
        self._shared = self._donate  # params, buffers or state may be arrays someone else holds

        def compile_step(step: Callable, donate: tuple[int, ...]) -> Callable:
            if not (jit or replicated):
                return step
            return self.replicas.compile_donating(step, donate) if self._donate else self.replicas.compile(step)

        self._train = compile_step(self._train_step, (0, 1, 2))  # params, buffers, state
        self._compiled = self._train is not self._train_step  # eager PyTorch: rates stay Python floats
        self._host_batches = self._takes_host_batches()
        if accumulate > 1:
            # the summed gradients are not donated: a group starts from the one zeros buffer
            self._accumulate = compile_step(self._accumulate_step, (1,))  # buffers
            self._apply_total = compile_step(self._apply_step, (0, 1))  # params, state
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
        return params, buffers, state, self._packed({"loss": loss, **metrics, **skipped})

    def _packed(self, values: dict[str, Any]) -> Any:
        """A step's loss and metrics as one vector when they are scalars, stacked in the loss's
        dtype inside the (compiled) step: read back in one host transfer, with no op run after
        the step to gather them; otherwise the dict as it is. ``_names`` records the order."""
        ops, arrays = self.ops, list(values.values())
        self._names = list(values)
        if len(arrays) > 1 and all(tuple(ops.shape(v)) == () for v in arrays):
            dtype = ops.dtype(values["loss"])
            return ops.stack([ops.cast(v, dtype) for v in arrays])
        return values

    def _gradients(self, params, buffers, state, x, y):
        """The global batch's mean gradient, loss and metrics (float16: scaled, then unscaled)."""
        ops, program, replicas = self.ops, self.program, self.replicas
        weight = replicas.weight(x)  # this replica's share of the global batch (1 on one device)
        scale = state.get("amp/scale")

        def objective(p):
            out, new_buffers = program.forward(p, buffers, x, True)
            out = self._real_rows(out, y)
            loss = _weighted(ops, self.loss(ops, out, y), weight)
            return (loss if scale is None else ops.multiply(loss, scale)), (new_buffers, out, loss)

        (_, (buffers, out, loss)), grads = replicas.value_and_grad(objective, params)  # the global batch's
        if scale is not None:
            inverse = ops.divide(1.0, scale)
            grads = {k: ops.multiply(g, ops.cast(inverse, ops.dtype(g))) for k, g in grads.items()}
        metrics = {k: replicas.sum(_weighted(ops, f(ops, out, y), weight)) for k, f in self.metrics.items()}
        return buffers, grads, replicas.sum(loss), metrics

    def _real_rows(self, out: Any, y: Any) -> Any:
        """The outputs of the batch's real rows: replicas may pad a batch that does not split
        evenly over the devices (JAX's mesh), keeping the targets' rows as they are."""
        if self.replicas.count == 1 or not (hasattr(out, "shape") and hasattr(y, "shape")):
            return out
        rows = self.ops.shape(y)[0]
        return out[:rows] if isinstance(rows, int) and self.ops.shape(out)[0] > rows else out

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
        x, y, rows = self._place(self._check_batch((x, y)))
        result = self._step(x, y, rows)
        return result[0] if result else self._group[-1][1]

    def _step(self, x, y, rows: int, last: bool = False) -> tuple[float, dict[str, float], int] | None:
        """A batch through the step: the optimizer step's loss, metrics and rows, or None while
        an accumulated step waits for more batches (``last``: no more come this epoch)."""
        p = self.program
        if self._shared:
            self._own()
        if self.accumulate == 1:
            lr = self._argument(self.schedule(self.step_count))
            p.params, p.buffers, self.state, results = self._train(p.params, p.buffers, self.state, x, y, lr)
            return self._stepped(results, rows)
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

    def _stepped(self, results: Any, rows: int) -> tuple[float, dict[str, float], int]:
        """``results``: the step's loss and metrics, a dict or packed (:meth:`_packed`)."""
        self.program.write_back()
        self.step_count += 1
        if isinstance(results, dict):
            values = {k: self._float(v) for k, v in results.items()}
        else:  # one host transfer: it waits for the step to finish
            values = dict(zip(self._names, (float(v) for v in self.ops.to_numpy(results))))
        return values.pop("loss"), values, rows

    def _own(self) -> None:
        """Copies of the params, buffers and optimizer state that only the trainer holds, for a
        donating step to delete: the ones it has may be the model's own arrays, or arrays
        handed out (``trainer.model``, ``set_weights``'s)."""
        donor: Any = self.backend  # a backend that donates (JAX) has own_copies
        p, copies = self.program, donor.own_copies
        p.params, p.buffers, self.state = copies(p.params), copies(p.buffers), copies(self.state)
        self._shared = False

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
        seed: int | None = None,
        validation: Any = None,
        drop_last: bool = False,
        prefetch: int = 2,
        steps: int | None = None,
        verbose: int = 1,
        checkpoint_dir: str | None = None,
        callbacks: Sequence[Callback] = (),
    ) -> History:
        """Train until ``epochs`` epochs are complete (counted from the start; see the module).

        Args:
            data: ``(x, y)`` numpy arrays, or an iterable of ``(x, y)`` batches.
            batch_size, shuffle, seed: how arrays are cut; the order depends on (seed, epoch) only
                (seed default: ``xdevice.seed``'s, else 0).
            validation: ``(x, y)`` or batches, evaluated after each epoch (``val_*``).
            drop_last: leave out the last batch of each epoch when it is short (arrays only:
                an iterable's batches are used as it yields them).
            prefetch: batches placed on the device ahead of time by a background thread; 0: none.
            steps: stop after this many optimizer steps (mid-epoch; a checkpoint resumes there).
            verbose: 1: a progress bar on a terminal, a line per epoch elsewhere; 0: silent.
            checkpoint_dir: write a checkpoint there after each epoch and when stopping.
            callbacks: :class:`xdevice.training.callbacks.Callback` objects (early stopping,
                best checkpoint, CSV and TensorBoard logging).

        Returns:
            ``History`` (``history.model`` is the trained object).

        Raises:
            ConfigurationError: data in a form fit does not take, or inputs or targets the model
                and loss cannot take (see :mod:`xdevice.training.targets`), before any step.
        """
        _check_form(data)
        _check_input(self.declared, data)
        data = self._checked(data, batch_size)
        if validation is not None:
            _check_form(validation, "validation")
            _check_input(self.declared, validation)
            validation = self._checked(validation, batch_size, "y_val")
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
        seed = default_seed() if seed is None else seed
        source = as_batches(data, batch_size, shuffle, seed)
        if drop_last:
            source = _dropping_last(source, data)
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
            batches = source.epoch(self.epoch, self.batch)
            if not isinstance(source, Batches):  # arrays were checked whole; an iterable's batches here
                batches = self._checking(batches)
            loader = Prefetcher(batches, self._place, prefetch)
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
        self.history.model = self._handed_back()
        return self.history

    def gather(self) -> Any:
        """The trained object with its arrays whole on the model's one device, also when they
        are sharded (``strategy="fsdp"``); the trainer keeps its sharded copies."""
        return self._handed_back(gathered=True)

    def _handed_back(self, gathered: bool = False) -> Any:
        """The trained object with its arrays on the model's one device: replicas whose params
        span the devices (JAX's mesh) gather them, so the model runs outside the trainer; the
        trainer keeps the replicated copies for the next step. Sharded params (fsdp) stay
        sharded unless ``gathered``: gathering them is the memory the sharding saves. Arrays
        held in another shape (tensor parallel's fused ``attn.qkv``, by its parts) come back in
        their saved shapes either way (``Replicas.saved``); between steps the model holds the
        trainer's arrays as they are, which its forward takes too."""
        p, gather = self.program, getattr(self.replicas, "gather", None)  # only engines that need it
        self._shared = self._donate  # what is handed out stays valid: the next step trains copies
        if gather is None or (self.replicas.shards and not gathered):
            if not self.replicas.reshapes:
                return p.result()
            gather = lambda arrays, device: self.replicas.saved(arrays)  # split still, but shaped as saved
        kept = p.params, p.buffers
        p.params, p.buffers = gather(p.params, p.device), gather(p.buffers, p.device)
        try:
            p.write_back()
            return p.result()
        finally:
            p.params, p.buffers = kept

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
        if callbacks:
            logs = {"loss": loss, **metrics, "lr": lr}
            for callback in callbacks:
                callback.on_step_end(self, self.step_count, logs)

    def evaluate(self, data: Any, batch_size: int = 256) -> dict[str, float]:
        """Mean loss and metrics over ``data`` in inference mode (batch norm uses running stats)."""
        _check_form(data)
        source = as_batches(self._checked(data, batch_size), batch_size, shuffle=False)
        sums: dict[str, float] = {}
        rows = 0
        batches = source.epoch(0)
        params, buffers = self.replicas.whole(self.program.params), self.replicas.whole(self.program.buffers)
        for batch in batches if isinstance(source, Batches) else self._checking(batches):
            x, y = self._on_device(batch)  # whole, not split: evaluated as on one device
            x, y = self.replicas.place_params({"x": x, "y": y}).values()  # beside the replicated params
            loss, metrics = self._evaluate(params, buffers, x, y)
            n = self.ops.shape(x)[0]
            for key, value in {"loss": loss, **metrics}.items():
                sums[key] = sums.get(key, 0.0) + self._float(value) * n
            rows += n
        return {k: v / max(rows, 1) for k, v in sums.items()}

    @property
    def model(self) -> Any:
        """The trained object: the user's own (trained in place), or a new JAX pair."""
        return self._handed_back()

    # -- checkpoints ----------------------------------------------------------------------

    def weights(self) -> dict[str, Any]:
        """A numpy copy of the trained parameters (``set_weights`` puts them back)."""
        return {k: self.ops.to_numpy(v).copy() for k, v in self.replicas.whole(self.program.params).items()}

    def set_weights(self, arrays: dict[str, Any]) -> None:
        p = self.program
        p.params = self._placed({k: arrays[k] for k in p.params})
        p.write_back()
        self._shared = self._donate  # placing may keep the caller's arrays as they are

    def save(self, folder: str) -> None:
        """Write a checkpoint (safetensors + JSON) that :meth:`load` resumes exactly (with
        several processes, rank 0 writes it, sharded values gathered first by every rank); the learning
        rate schedule is part of the optimizer's record."""
        if self.accumulate > 1 and self._group:
            raise ConfigurationError(
                message(
                    "A checkpoint is written between optimizer steps, and this one has "
                    f"{len(self._group)} of its {self.accumulate} accumulated batches",
                    fix=f"save after {self.accumulate - len(self._group)} more step() call(s); fit saves between steps",
                )
            )
        whole = self.replicas.whole  # every rank takes part in gathering shards
        params, buffers, state = whole(self.program.params), whole(self.program.buffers), whole(self.state)
        if self.replicas.rank != 0:
            return
        to_numpy = self.ops.to_numpy
        arrays = {
            **{f"param/{k}": to_numpy(v) for k, v in params.items()},
            **{f"buffer/{k}": to_numpy(v) for k, v in buffers.items()},
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
        checkpoint.write(folder, arrays, {k: to_numpy(v) for k, v in state.items()}, record)

    def load(self, folder: str) -> Trainer:
        """Resume from a checkpoint :meth:`save` wrote: weights, optimizer state, position.

        Raises:
            ConfigurationError: the checkpoint belongs to another model or optimizer.
        """
        arrays, state, record = checkpoint.read(folder)
        p = self.program

        def shape(name: str, value: Any) -> tuple[int, ...]:  # as saved (tensor parallel may hold another)
            return self.replicas.saved_shape(name, tuple(self.ops.shape(value)))

        mine = {f"param/{k}": v for k, v in p.params.items()} | {f"buffer/{k}": v for k, v in p.buffers.items()}
        checkpoint.check(
            {k: shape(k.split("/", 1)[1], v) for k, v in mine.items()},
            {k: v.shape for k, v in arrays.items()},
            "model",
        )
        checkpoint.check(
            {k: shape(k, v) for k, v in self.state.items()}, {k: v.shape for k, v in state.items()}, "optimizer's state"
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

    # -- the data's checks (xdevice.training.targets) ---------------------------------------

    def _checked(self, data: Any, batch_size: int, name: str = "y") -> Any:
        """``data`` with its arrays checked whole, now (``y`` as the loss reads it); an
        iterable's batches are checked as they come (:meth:`_checking`)."""
        if isinstance(data, Batches):
            x, y = self._check_arrays(data.x, data.y, data.batch_size, name)
            if y is not data.y:
                data = copy.copy(data)
                data.y = y
            return data
        if isinstance(data, tuple) and len(data) == 2 and hasattr(data[0], "shape"):
            return self._check_arrays(data[0], data[1], batch_size, name)
        return data

    def _check_arrays(self, x: Any, y: Any, rows: int, name: str) -> tuple[Any, Any]:
        self.rules.check_x(x)
        self._learn_outputs(x[:rows])  # the first batch's rows
        return x, self.rules.check_y(y, name)

    def _checking(self, batches: Iterator) -> Iterator:
        """An iterable's batches, each checked before it is placed; the first here, now (a
        framework's own model learns its output width from it, on this thread)."""
        first = next(batches, None)
        if first is None:
            return iter(())
        checked = self._check_batch(first)

        def rest():
            yield checked
            for batch in batches:
                yield self._check_batch(batch)

        return rest()

    def _check_batch(self, batch: tuple[Any, Any]) -> tuple[Any, Any]:
        x, y = batch
        self._learn_outputs(x)
        return self.rules.check(x, y)

    def _learn_outputs(self, x: Any) -> None:
        """The model's output shape, from a forward pass in inference mode on ``x``, when a
        named loss checks the targets against it and the model does not declare it (a
        framework's own model, an imported one, a zoo language model).

        Where the backend evaluates shapes (its ``training.output_shape``: JAX's
        ``jax.eval_shape``, PyTorch's fake tensors) the pass computes nothing and takes the
        parameters as the replicas hold them: split or sharded weights are not gathered whole
        (a real-scale model under tensor parallel would need the whole model's memory on every
        device for it), and nothing is exchanged. Elsewhere the forward runs on the weights."""
        rules = self.rules
        if rules.outputs is not None or rules.loss is None or not hasattr(x, "shape"):
            return
        rules.check_x(x)  # an input the parameters cannot take fails in the forward pass
        p = self.program
        x = self.backend.to_device(self.ops.asarray(x), p.device)

        def outputs(params: dict, buffers: dict, x: Any) -> Any:
            return p.forward(params, buffers, x, False)[0]

        shape = getattr(_registry.extension(self.backend.name, "training"), "output_shape", None)
        if shape is not None:
            found = shape(self.backend, outputs, p.params, p.buffers, x)
        else:  # the engines without shape evaluation hold whole weights (numpy, TensorFlow)
            placed = self.replicas.place_params({"x": x})["x"]
            found = self.ops.shape(outputs(self.replicas.whole(p.params), self.replicas.whole(p.buffers), placed))
        rules.set_outputs(tuple(int(d) for d in found[1:]))

    # -- helpers --------------------------------------------------------------------------

    def _takes_host_batches(self) -> bool:
        """Whether the compiled step on one device takes numpy batches as they are, placing
        them itself for less than the trainer would (the backend's ``training.takes_host_batches``:
        JAX on its default CPU); asked only of a backend whose step compiles."""
        if not self._compiled or type(self.replicas) is not Replicas:  # several replicas split the batch
            return False
        takes = getattr(_registry.extension(self.backend.name, "training"), "takes_host_batches", None)
        return bool(takes and takes(self.backend, self.program.device))

    def _place(self, batch: tuple[Any, Any]) -> tuple[Any, Any, int]:
        """The batch on the device(s), split across replicas, and its global row count (numpy
        batches as they are, for a step that places them itself: :meth:`_takes_host_batches`)."""
        x, y = batch
        if self._host_batches and isinstance(x, np.ndarray) and isinstance(y, np.ndarray):
            return x, y, int(x.shape[0])
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


def _weighted(ops: Any, value: Any, weight: Any) -> Any:
    """``value`` times this replica's share of the global batch; on one device (a share of
    1.0) ``value`` itself, with no op run for it (PyTorch runs each op as it comes)."""
    return value if isinstance(weight, float) and weight == 1.0 else ops.multiply(value, weight)


def _rules(model: Any, loss: str | None, trained: Any) -> Rules:
    """What the data must hold: a zoo model declares its output width and vocabulary; a
    framework's own model gives its parameters' dtype (its width comes from a forward pass on
    the first batch); an imported model checks its own inputs."""
    from xdevice import models

    if isinstance(model, models.Model):
        tokens = np.issubdtype(model.example_input(1).dtype, np.integer)
        return Rules(
            loss, outputs=model.spec.get("classes"), vocab=model.spec.get("vocab") if tokens else None, build=model.name
        )
    imported = sys.modules.get("xdevice.converters.importer.model")
    if imported is not None and isinstance(model, imported.ImportedModel):
        return Rules(loss)
    dtypes = (trained.ops.dtype(v) for v in trained.params.values())
    return Rules(loss, dtype=next((d for d in dtypes if d in FLOATS), None))


def _check_form(data: Any, name: str = "data") -> None:
    """Refuse at once what no batching reads: a mapping (a dict, scikit-learn's Bunch, a
    DataFrame), a string, a tuple of other than two arrays."""
    pairs = "(x, y) arrays, or an iterable of (x, y) batches (a list of pairs, a torch DataLoader, a tf.data.Dataset)"
    kind = type(data).__name__
    if isinstance(data, (str, bytes)):
        raise ConfigurationError(message(f"Unsupported {name} for training", expected=pairs, received=kind))
    if hasattr(data, "keys") and hasattr(data, "__getitem__"):
        keys = [str(k) for k in data.keys()]
        pick = next(((a, b) for a, b in (("data", "target"), ("x", "y"), ("X", "y")) if a in keys and b in keys), None)
        raise ConfigurationError(
            message(
                f"Unsupported {name} for training: a {kind} of {len(keys)} entries",
                expected=pairs,
                received=kind,
                fix=f"pass ({name}[{pick[0]!r}], {name}[{pick[1]!r}])"
                if pick
                else f"pass the inputs and the targets as a tuple (x, y) from its entries {keys[:8]}",
            )
        )
    if isinstance(data, tuple) and len(data) != 2 and data and hasattr(data[0], "shape"):
        raise ConfigurationError(
            message(
                f"Unsupported {name} for training: a tuple of {len(data)} arrays",
                expected=pairs,
                received=f"tuple of {len(data)}",
                fix="pass (x, y): inputs and targets",
            )
        )


def _dropping_last(source: Any, data: Any) -> Batches:
    """``source`` without each epoch's short last batch (a copy when it is the caller's)."""
    if not isinstance(source, Batches):
        raise ConfigurationError(
            message(
                "drop_last cuts (x, y) arrays into batches; an iterable's batches are used as it yields them",
                received=type(data).__name__,
                fix="drop the short batch where the batches are made (torch DataLoader(drop_last=True), "
                "tf.data's batch(size, drop_remainder=True)), or pass (x, y) arrays",
            )
        )
    if len(source.x) < source.batch_size:
        raise ConfigurationError(
            message(
                "drop_last leaves no batch: there are fewer rows than batch_size",
                received=f"{len(source.x)} rows, batch_size={source.batch_size}",
                fix=f"batch_size={len(source.x)} or less, or drop_last=False",
            )
        )
    dropping = copy.copy(source) if source is data else source
    dropping.drop_last = True
    return dropping


def _check_options(options: dict[str, Any], optimizer: Any, own: set[str], where: str) -> None:
    """Keywords that are neither ``where``'s own options nor the optimizer's are refused, with
    the nearest of both (``batchsize`` -> ``batch_size``, ``epoch`` -> ``epochs``)."""
    mine = option_names(optimizer)  # an unknown optimizer name is refused here, with the choices
    unknown = [k for k in options if k not in own and k not in mine]
    if not unknown:
        return
    key = unknown[0]
    named = optimizer if isinstance(optimizer, str) else type(optimizer).__name__
    fix = f"{key} is an option of Trainer.fit: trainer.fit(data, {key}=...)" if where == "Trainer" else None
    raise ConfigurationError(
        message(
            f"Unknown option for {where}",
            expected=f"one of {where}'s options or the {named!r} optimizer's",
            received=key,
            choices=sorted(own | set(mine)),
            fix=fix if key in _FIT_OPTIONS else None,
        )
    )


def _declared_input(model: Any) -> Any:
    """A zoo model, whose ``check_input`` says what its ``x`` must be; None for any other."""
    from xdevice import models

    return model if isinstance(model, models.Model) else None


def _check_input(declared: Any, data: Any) -> None:
    """``x`` of ``(x, y)`` arrays against what a zoo model takes, before any framework runs:
    the model's own check, the one a call of the model makes (its fix fits the data)."""
    if declared is not None and isinstance(data, tuple) and data and hasattr(data[0], "shape"):
        declared.check_input(data[0])


def fit(
    model: Any,
    data: Any,
    *,
    loss: str | Callable = "cross_entropy",
    optimizer: str | Optimizer = "adam",
    epochs: int = 1,
    device: Any = None,
    devices: Sequence[Any] | None = None,
    strategy: str = "replicate",
    mesh: dict[str, int] | None = None,
    stages: Sequence[Any] | None = None,
    precision: str = "float32",
    metrics: Sequence[str | Callable] | None = None,
    remat: bool = False,
    **options: Any,
) -> History:
    """Train ``model`` on ``data`` for ``epochs``; see :class:`Trainer` and :meth:`Trainer.fit`.

    ``remat=True`` recomputes each block's activations in the backward pass instead of keeping
    them (a real-scale zoo model: ``bert``, ``gpt2``, ``llama``, ``vit``, ``resnet50``): less
    memory for about one more forward pass. It sets the model's ``remat`` for this run only.

    Optimizer settings (``lr``, ``momentum``, ``weight_decay``...), the trainer's (``clip_norm``,
    ``accumulate``...) and fit settings (``batch_size``, ``seed``, ``validation``, ``drop_last``,
    ``prefetch``, ``verbose``...) go in ``options``; Keras's names ``validation_data`` and
    ``learning_rate`` are taken for ``validation`` and ``lr``. A keyword that is none of these
    is refused with the nearest one.

    Raises:
        ConfigurationError: an unknown option, data the model and loss cannot take, or
            ``remat=True`` for a model without blocks to recompute.
    """
    for alias, name in _FIT_ALIASES.items():
        if alias in options:
            if name in options:
                raise ConfigurationError(
                    message(f"{alias} is another name for {name}: pass one of them", received=f"{alias}= and {name}=")
                )
            options[name] = options.pop(alias)
    _check_options(options, optimizer, _FIT_OWN | _FIT_OPTIONS | _TRAINER_OPTIONS | set(_FIT_ALIASES), "fit")
    fit_options = {k: v for k, v in options.items() if k in _FIT_OPTIONS}
    optimizer_options = {k: v for k, v in options.items() if k not in _FIT_OPTIONS}
    spec = _remat_spec(model) if remat else None
    if spec is not None:
        model.spec = {**spec, "remat": True}
    try:
        trainer = Trainer(
            model,
            loss,
            optimizer,
            device=device,
            devices=devices,
            strategy=strategy,
            mesh=mesh,
            stages=stages,
            precision=precision,
            metrics=metrics,
            **optimizer_options,
        )
        return trainer.fit(data, epochs, **fit_options)
    finally:
        if spec is not None:
            model.spec = spec


def _remat_spec(model: Any) -> dict[str, Any]:
    """The spec of a zoo model that takes ``remat``; anything else is refused with the fix."""
    from xdevice import models

    takes = [name for name in models.PRETRAINED if "remat" in models.definition(name).DEFAULTS]
    if isinstance(model, models.Model):
        if model.name in takes:
            return model.spec
        received = model.name
        fix = f"fit without remat: {model.name!r} has no blocks to recompute"
    else:
        received = type(model).__name__
        fix = "recompute inside the model (torch.utils.checkpoint, jax.checkpoint, tf.recompute_grad)"
    raise ConfigurationError(
        message(
            "remat=True recomputes the blocks of a real-scale zoo model in the backward pass",
            expected=f"a zoo model built as one of {', '.join(takes)}",
            received=received,
            fix=fix,
        )
    )


#: fit's named keywords; Trainer.fit's options; the Trainer's own options (beyond the optimizer's)
_FIT_OWN = set(inspect.signature(fit).parameters) - {"model", "data", "options"}
_FIT_OPTIONS = set(inspect.signature(Trainer.fit).parameters) - {"self", "data", "epochs"}
_TRAINER_OPTIONS = set(inspect.signature(Trainer.__init__).parameters) - {"self", "model", "optimizer_options"}
_FIT_ALIASES = {"validation_data": "validation"}  # Keras's name
