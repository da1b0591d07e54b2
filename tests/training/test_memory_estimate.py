"""estimate_memory / xdevice estimate-memory: the arithmetic, the frameworks' own measurements,
and the verdict against the device."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from xdevice import ConfigurationError, estimate_memory, models


def test_the_arithmetic_counts_weights_gradients_state_and_activations():
    model = models.build("cnn")
    weights = sum(v.nbytes for v in model.numpy_params().values())
    trained = sum(model.numpy_params()[k].nbytes for k in model.trainable)
    adam = estimate_memory("cnn", batch=16, optimizer="adam", measure=False).parts
    assert adam["parameters"] == weights and adam["gradients"] == trained
    assert adam["optimizer state"] == 2 * trained
    assert estimate_memory("cnn", batch=16, optimizer="momentum", measure=False).parts["optimizer state"] == trained
    assert adam["batch"] == 16 * 3 * 32 * 32 * 4
    double = estimate_memory("cnn", batch=32, optimizer="adam", measure=False).parts
    per_row = (double["activations (forward)"] - adam["activations (forward)"]) / 16
    assert per_row > 3 * 32 * 32 * 4  # each row's intermediates are larger than the row itself
    half = estimate_memory("cnn", batch=16, optimizer="adam", precision="bfloat16", measure=False).parts
    assert half["half copy of params"] == weights // 2
    assert half["activations (forward)"] == pytest.approx(adam["activations (forward)"] / 2, rel=0.05)


def test_jax_measures_the_compiled_step_with_xla():
    pytest.importorskip("jax")
    small, large = (estimate_memory("mlp", batch=b, optimizer="adam", backend="jax", hidden=[256]) for b in (8, 512))
    assert "memory_analysis" in small.how
    model = models.build("mlp", hidden=[256])
    weights = sum(v.nbytes for v in model.numpy_params().values())
    # the step's arguments: params, Adam's two slots (+ its step count), the batch, its labels, the rate
    rows = 8 * 784 * 4 + 8 * 8
    assert small.measured["arguments"] == pytest.approx(3 * weights + rows, abs=64)
    assert large.measured["temporaries"] > small.measured["temporaries"]
    assert small.fits is True and small.needed == max(small.total, small.measured["total"])


def test_torch_counts_what_autograd_saves_for_the_backward_pass():
    pytest.importorskip("torch")
    small, large = (estimate_memory("cnn", batch=b, optimizer="sgd", backend="torch") for b in (4, 16))
    assert "saved_tensors_hooks" in small.how
    saved = large.measured["saved for backward"], small.measured["saved for backward"]
    assert saved[1] > 0 and saved[0] / saved[1] == pytest.approx(4, rel=0.1)  # it grows with the rows
    # the arithmetic (every forward intermediate) bounds what autograd keeps from above
    assert small.measured["saved for backward"] <= small.parts["activations (forward)"] * 1.2


def test_tensorflow_on_the_cpu_says_it_has_no_count():
    pytest.importorskip("tensorflow")
    estimate = estimate_memory("mlp", batch=8, backend="tensorflow", hidden=[8])
    assert estimate.measured is None and "offers no count" in str(estimate)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xdevice", *args], capture_output=True, text=True, timeout=300)


def test_the_command_prints_the_table_and_says_when_it_does_not_fit():
    result = run_cli("estimate-memory", "resnet", "--batch", "200000", "--backend", "numpy", "--precision", "bf16")
    assert result.returncode == 1, result.stderr
    assert "does NOT fit" in result.stdout and "bfloat16" in result.stdout
    fits = run_cli("estimate-memory", "mlp", "--batch", "8", "--backend", "numpy", "--json")
    assert fits.returncode == 0
    report = json.loads(fits.stdout)
    assert report["fits"] is True and report["parts"]["parameters"] > 0
    bad = run_cli("estimate-memory", "mlp", "--batch", "8", "--precision", "fp8")
    assert bad.returncode == 2 and "expected float32, bfloat16 (bf16) or float16 (fp16), got 'fp8'" in bad.stderr


def test_bad_settings_are_refused_with_the_choices():
    with pytest.raises(ConfigurationError, match="Unknown optimizer.*Valid choices: adam, adamw, momentum, sgd"):
        estimate_memory("mlp", batch=8, optimizer="lamb")
    with pytest.raises(ConfigurationError, match="batch is the rows per device.*Received: 0"):
        estimate_memory("mlp", batch=0)


def test_the_verdict_uses_a_gpus_configured_limit_and_a_cpus_own_memory(monkeypatch):
    from xdevice import Config, Device
    from xdevice.training import memory

    monkeypatch.setattr("xdevice._configure.current_config", lambda backend: Config.make(memory_limit="1GiB"))
    gpu = Device("gpu", 0, memory_total=80 * 2**30)
    assert memory._available("jax", gpu) == (2**30, "the memory_limit set for gpu:0")
    cpu = Device("cpu", 0, memory_total=16 * 2**30)  # memory_limit is per GPU
    assert memory._available("jax", cpu) == (16 * 2**30, "cpu:0's memory")
