"""Learning-rate schedules (torch.optim.lr_scheduler's rates), gradient accumulation (k batches
of b step as one of k*b) and float16 with dynamic loss scaling (torch.amp.GradScaler's rule)."""

from __future__ import annotations

import numpy as np
import pytest

from xdevice import ConfigurationError, Trainer, fit, models
from xdevice.training import schedules
from xdevice.training.precision import LossScale

from .test_fit import assert_trained_as, torch_loop

MLP = {"hidden": [16], "inputs": 6, "classes": 3}


def data(rows: int = 80, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 6)).astype("float32")
    return x, (x[:, 0] > 0).astype("int64") + (x[:, 1] > 0.5)


def torch_rates(make_scheduler, steps: int = 40, lr: float = 0.1) -> list[float]:
    torch = pytest.importorskip("torch")
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    scheduler = make_scheduler(torch.optim.lr_scheduler, optimizer)
    rates = []
    for _ in range(steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


SCHEDULES = {
    "step": (schedules.step_decay(0.1, step_size=7, gamma=0.5), lambda s, o: s.StepLR(o, step_size=7, gamma=0.5)),
    "exponential": (schedules.exponential(0.1, gamma=0.93), lambda s, o: s.ExponentialLR(o, gamma=0.93)),
    "cosine": (
        schedules.cosine(0.1, total_steps=30, warmup_steps=6, start_factor=0.1, min_lr=1e-3),
        lambda s, o: s.SequentialLR(
            o,
            [s.LinearLR(o, start_factor=0.1, total_iters=6), s.CosineAnnealingLR(o, T_max=24, eta_min=1e-3)],
            milestones=[6],
        ),
    ),
    "cosine, no warmup": (schedules.cosine(0.1, total_steps=40), lambda s, o: s.CosineAnnealingLR(o, T_max=40)),
    "one cycle": (
        schedules.one_cycle(0.1, total_steps=40),
        lambda s, o: s.OneCycleLR(o, max_lr=0.1, total_steps=40, cycle_momentum=False),
    ),
    "one cycle, linear": (
        schedules.one_cycle(0.1, total_steps=40, pct_start=0.25, anneal="linear"),
        lambda s, o: s.OneCycleLR(
            o, max_lr=0.1, total_steps=40, pct_start=0.25, anneal_strategy="linear", cycle_momentum=False
        ),
    ),
}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_each_schedule_gives_torch_lr_schedulers_rates(name):
    ours, theirs = SCHEDULES[name]
    expected = torch_rates(theirs)
    assert len(set(np.round(expected, 8))) > 3  # the rate really changes
    np.testing.assert_allclose([ours(t) for t in range(40)], expected, rtol=1e-6, atol=1e-12)


def test_a_scheduled_run_matches_a_torch_loop_with_its_scheduler():
    torch = pytest.importorskip("torch")
    x, y = data()
    model = models.build("mlp", backend="torch", seed=1, **MLP)
    module = models.to_native(model, "torch")
    native = torch.optim.SGD(module.parameters(), lr=0.5)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(native, max_lr=0.5, total_steps=20, cycle_momentum=False)
    expected = torch_loop(torch, module, native, x, y, epochs=2, scheduler=scheduler)
    history = fit(
        model,
        (x, y),
        optimizer="sgd",
        lr=schedules.one_cycle(0.5, total_steps=20),
        epochs=2,
        batch_size=8,
        shuffle=False,
        verbose=0,
    )
    assert_trained_as(history, expected, model, module)


def test_a_schedule_gives_the_same_steps_on_every_backend(backend):
    x, y = data()
    runs = {}
    for name in ("numpy", backend.name):
        runs[name] = fit(
            models.build("mlp", backend=name, seed=1, **MLP),
            (x, y),
            optimizer="adam",
            lr=schedules.cosine(0.05, total_steps=20, warmup_steps=4),
            epochs=2,
            batch_size=8,
            verbose=0,
        )
    np.testing.assert_allclose(runs[backend.name].steps, runs["numpy"].steps, rtol=1e-4, atol=1e-5)
    assert runs["numpy"]["lr"] == pytest.approx(
        [schedules.cosine(0.05, total_steps=20, warmup_steps=4)(t) for t in (9, 19)]
    )  # each epoch's last rate


def test_any_callable_is_a_schedule():
    x, y = data()
    stopped = fit(
        models.build("mlp", seed=1, **MLP),
        (x, y),
        optimizer="sgd",
        lr=lambda step: 0.1 if step < 4 else 0.0,
        epochs=1,
        batch_size=8,
        verbose=0,
    )
    four = fit(
        models.build("mlp", seed=1, **MLP), (x, y), optimizer="sgd", lr=0.1, epochs=1, steps=4, batch_size=8, verbose=0
    )
    np.testing.assert_allclose(stopped.steps[:4], four.steps, rtol=1e-6)  # its rates drive the steps:
    for key, value in four.model.numpy_params().items():  # rate 0 from step 4 on leaves the weights
        np.testing.assert_allclose(stopped.model.numpy_params()[key], value, rtol=1e-6, err_msg=key)
    assert stopped.last("lr") == 0.0


def test_a_resumed_run_continues_its_schedule_exactly(backend, tmp_path):
    x, y = data()
    rate = schedules.one_cycle(0.05, total_steps=30)
    whole = Trainer(models.build("mlp", backend=backend.name, seed=1, **MLP), optimizer="adam", lr=rate)
    whole.fit((x, y), epochs=3, batch_size=8, verbose=0)
    first = Trainer(models.build("mlp", backend=backend.name, seed=1, **MLP), optimizer="adam", lr=rate)
    first.fit((x, y), epochs=3, batch_size=8, steps=13, verbose=0, checkpoint_dir=str(tmp_path))
    resumed = Trainer(models.build("mlp", backend=backend.name, seed=1, **MLP), optimizer="adam", lr=rate)
    history = resumed.load(str(tmp_path)).fit((x, y), epochs=3, batch_size=8, verbose=0)
    np.testing.assert_allclose(history.steps, whole.history.steps, rtol=1e-5, atol=1e-6)
    assert history["lr"] == pytest.approx(whole.history["lr"])
    other = Trainer(
        models.build("mlp", backend=backend.name, seed=1, **MLP),
        optimizer="adam",
        lr=schedules.one_cycle(0.05, total_steps=40),
    )
    with pytest.raises(ConfigurationError, match="another optimizer.*OneCycle"):
        other.load(str(tmp_path))


def test_bad_schedule_settings_are_refused_with_the_fix():
    with pytest.raises(ConfigurationError, match="warmup_steps must be fewer than total_steps"):
        schedules.cosine(0.1, total_steps=10, warmup_steps=10)
    with pytest.raises(ConfigurationError, match=r"learning rate is a number of 0 or more.*Received: -1"):
        fit(models.build("mlp", **MLP), data(), lr=-1, verbose=0)
    with pytest.raises(ConfigurationError, match="Valid choices: cos, linear"):
        schedules.one_cycle(0.1, total_steps=10, anneal="cosine")


# -- accumulation ------------------------------------------------------------------------------


def accumulated(backend: str, batch_size: int, accumulate: int, devices=None, rows: int = 88):
    model = models.build("mlp", backend=backend, seed=1, **MLP)
    trainer = Trainer(model, optimizer="adam", lr=0.02, accumulate=accumulate, devices=devices)
    history = trainer.fit(data(rows), epochs=2, batch_size=batch_size, verbose=0)
    return history, model.numpy_params(), trainer.step_count


def test_k_batches_of_b_step_as_one_batch_of_k_times_b(backend):
    # 88 rows: five steps of 16 and a last one of 8, which the accumulated run ends the epoch with
    big, big_params, big_steps = accumulated(backend.name, 16, 1)
    small, small_params, small_steps = accumulated(backend.name, 4, 4)
    assert small_steps == big_steps == 12
    np.testing.assert_allclose(small.steps, big.steps, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(small["loss"], big["loss"], rtol=1e-5)
    for key, value in big_params.items():
        np.testing.assert_allclose(small_params[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
    unaccumulated, _, _ = accumulated(backend.name, 4, 1)
    assert len(unaccumulated.steps) == 44  # without it: four times the steps, another run
    assert not np.allclose(unaccumulated["loss"], big["loss"])


@pytest.mark.multi_device
def test_accumulation_under_replication_matches_one_device(backend):
    if not backend.supports_replication:
        pytest.skip(f"{backend.name} does not replicate within one process")
    one, one_params, _ = accumulated(backend.name, 16, 1, rows=96)
    many, many_params, _ = accumulated(backend.name, 8, 2, devices=["cpu:0", "cpu:1"], rows=96)
    np.testing.assert_allclose(many.steps, one.steps, rtol=1e-5, atol=1e-6)
    for key, value in one_params.items():
        np.testing.assert_allclose(many_params[key], value, rtol=1e-5, atol=1e-6, err_msg=key)


def test_accumulate_must_be_a_positive_int_and_a_checkpoint_waits_for_the_step(tmp_path):
    with pytest.raises(ConfigurationError, match="accumulate is how many batches.*Received: 0"):
        Trainer(models.build("mlp", **MLP), accumulate=0)
    trainer = Trainer(models.build("mlp", **MLP), accumulate=2)
    x, y = data(8)
    trainer.step(x, y)
    with pytest.raises(ConfigurationError, match="1 of its 2 accumulated batches"):
        trainer.save(str(tmp_path))
    trainer.step(x, y)
    assert trainer.step_count == 1
    trainer.save(str(tmp_path))


# -- float16 and loss scaling -----------------------------------------------------------------


def test_the_loss_scale_follows_torch_grad_scalers_update():
    torch = pytest.importorskip("torch")
    from xdevice import backend

    ops = backend("numpy").ops
    setting = LossScale(init_scale=1024.0, growth_interval=3)
    found = [0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0]
    state = setting.init(ops)
    scale, tracker = torch.full((1,), 1024.0), torch.zeros((1,), dtype=torch.int32)
    ours, theirs = [], []
    for inf in found:
        state = setting.update(ops, state, ops.asarray(not inf))
        torch._amp_update_scale_(scale, tracker, torch.full((1,), float(inf)), 2.0, 0.5, 3)
        ours.append((float(state["amp/scale"]), int(state["amp/good_steps"])))
        theirs.append((scale.item(), tracker.item()))
    assert ours == theirs
    assert {s for s, _ in ours} == {512.0, 1024.0, 2048.0}  # it grew and backed off


def float16_run(name: str, x, y, **options):
    model = models.build("mlp", backend=name, seed=1, **MLP)
    trainer = Trainer(model, optimizer="adam", lr=0.01, precision="float16", **options)
    return trainer, trainer.fit((x, y), epochs=2, batch_size=8, shuffle=False, verbose=0)


def test_float16_trains_close_to_float32_with_float32_master_weights(backend):
    x, y = data()
    trainer, half = float16_run(backend.name, x, y)
    full = fit(
        models.build("mlp", backend=backend.name, seed=1, **MLP),
        (x, y),
        optimizer="adam",
        lr=0.01,
        epochs=2,
        batch_size=8,
        shuffle=False,
        verbose=0,
    )
    assert {trainer.ops.dtype(v) for v in trainer.program.params.values()} == {"float32"}
    assert half.steps != full.steps  # float16 really ran: rounding shows in the loss
    np.testing.assert_allclose(half.steps, full.steps, rtol=2e-2, atol=2e-3)
    assert half["skipped_steps"] == [0, 0] and half["loss_scale"] == [65536.0, 65536.0]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy says it overflowed, as it should
def test_a_float16_step_with_an_inf_gradient_is_skipped_and_the_scale_backs_off(backend):
    x, y = data(16)
    x[9, 0] = 1e6  # float16 overflows: the second batch's loss and gradients are not finite
    trainer, history = float16_run(backend.name, x, y, loss_scale={"init_scale": 256.0, "growth_interval": 2})
    record = history.epochs
    assert [r["skipped_steps"] for r in record] == [1, 1]
    # ok, skipped, ok, skipped (never 2 good steps in a row to grow): 256 -> 128 -> 64
    assert [r["loss_scale"] for r in record] == [128.0, 64.0]
    assert int(trainer.ops.to_numpy(trainer.state["step"])) == 2  # skipped steps move no optimizer state
    assert np.isfinite(history.steps[0]) and not np.isfinite(history.steps[1])
    assert all(np.isfinite(v).all() for v in trainer.weights().values())


def test_float16_where_it_cannot_apply_is_a_clear_error():
    with pytest.raises(ConfigurationError, match="loss_scale applies to float16 only"):
        Trainer(models.build("mlp", **MLP), loss_scale={"init_scale": 8.0})
    with pytest.raises(ConfigurationError, match="Unknown loss scale setting.*Valid choices: init_scale"):
        Trainer(models.build("mlp", **MLP), precision="float16", loss_scale={"scale": 8.0})
    keras = pytest.importorskip("keras")
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    with pytest.raises(ConfigurationError, match="mixed_float16"):
        Trainer(model, precision="float16")
