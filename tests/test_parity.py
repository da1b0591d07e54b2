"""Parity as a product: the report, assert_parity's failure message, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import xdevice
from xdevice import ParityError
from xdevice.testing import TOLERANCES, assert_parity


def test_a_report_has_one_row_per_backend_and_tensor(backend):
    report = xdevice.parity("mlp", backends=[backend.name], grads=True)
    assert {row.tensor for row in report} == {"output", "loss"} | {
        f"grad {k}" for k in xdevice.models.build("mlp").trainable
    }
    assert all(row.backend == backend.name for row in report)


def test_assert_parity_passes_for_a_function_written_once(backend):
    x = np.random.default_rng(0).normal(size=(4, 6))
    report = assert_parity(
        lambda ops, x: {"softmax": ops.softmax(x), "norm": ops.layer_norm(x, None, None)}, [x], backends=[backend.name]
    )
    assert report.ok and {row.tensor for row in report} == {"softmax", "norm"}


def test_assert_parity_failure_names_backend_tensor_index_and_values(backend):
    def off_by_one_at_2_3(ops, x):
        bump = np.zeros((4, 6))
        if ops.name != "numpy":
            bump[2, 3] = 1.0
        return ops.add(x, ops.asarray(bump.astype(ops.dtype(x))))

    if backend.name == "numpy":
        pytest.skip("the function is wrong on every backend but numpy")
    with pytest.raises(ParityError) as caught:
        assert_parity(off_by_one_at_2_3, [np.ones((4, 6))], backends=[backend.name])
    text = str(caught.value)
    assert f"backend {backend.name!r}" in text and "tensor 'output'" in text
    assert "index (2, 3)" in text and "2.0 vs reference 1.0" in text


def test_the_tolerance_table_covers_the_half_precision_dtypes():
    assert {"float32", "float16", "bfloat16"} <= set(TOLERANCES)
    assert TOLERANCES["float32"][0] < TOLERANCES["float16"][0] < TOLERANCES["bfloat16"][0]


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "xdevice", "parity", *args], capture_output=True, text=True, timeout=600
    )


def test_the_parity_command_prints_json_and_exits_0_when_all_agree():
    result = _cli("--models", "mlp", "cnn", "--backends", "numpy", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and {r["subject"] for r in report["rows"]} == {"mlp", "cnn"}


def test_the_parity_command_exits_1_on_a_violation():
    # float16 end to end in numpy (no float32 accumulation) cannot meet the float16 row for
    # batch-norm gradients: a real violation, reported with exit status 1
    result = _cli("--models", "resnet", "--backends", "numpy", "--dtype", "float16", "--grads")
    assert result.returncode == 1 and "violation: resnet: backend 'numpy'" in result.stdout


def test_the_parity_command_prints_markdown():
    result = _cli("--models", "lstm", "--backends", "numpy", "--markdown", "--no-grads")
    assert result.stdout.splitlines()[0] == "| model | backend | tensors | max abs | max rel | ok |"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.realworld_on("jax")  # 14 s each of JAX compiling every op in half precision
def test_half_precision_outputs_meet_their_tolerance_row(backend, dtype):
    if backend.name == "numpy" and dtype == "bfloat16":
        pytest.skip("numpy computes bfloat16 through ml_dtypes' slow scalar path")
    for name in ("cnn", "resnet", "transformer"):
        report = xdevice.parity(name, backends=[backend.name], dtype=dtype)
        assert report.ok and not any(r.tensor.startswith("grad ") for r in report), str(report)


def test_the_reference_measures_how_close_inputs_come_to_a_kink():
    from xdevice.backends.numpy.autodiff import kink_margin

    ops = xdevice.backend("numpy").ops
    with kink_margin() as found:
        ops.relu(np.array([3.0, -2.0, 1e-9]))
        ops.max_pool(np.array([[[[1.0, 1.0 + 1e-8], [0.0, 0.5]]]]), 2)
        ops.max_pool(np.array([[[[0.0, 0.0], [0.0, 0.0]]]]), 2)  # an exact tie is no kink
    assert found[0] == pytest.approx(1e-9 / 3.0) and found[1] == pytest.approx(1e-8 / 1.0, rel=1e-3)
    assert found[2] == float("inf")


def test_parity_draws_example_inputs_clear_of_kinks():
    from xdevice.testing._parity import KINK_MARGIN, _clear_example, _kink_margin

    reference = xdevice.models.build("resnet").to("numpy", dtype="float64")
    x, margin = _clear_example(reference, 4, 0)
    assert margin > KINK_MARGIN and _kink_margin(reference, x) == margin


def test_gradient_violations_on_kinked_inputs_say_why():
    from xdevice.testing._parity import KINK_MARGIN, _kink_margin

    model = xdevice.models.build("resnet", widths=[16, 32])
    x = model.example_input(4, 0)  # a ReLU input within 2e-7 of zero
    assert _kink_margin(model.to("numpy", dtype="float64"), x) < KINK_MARGIN
    report = xdevice.parity(model, inputs=x)
    assert all(row.tensor.startswith("grad ") and "of a kink" in row.note for row in report.violations)
