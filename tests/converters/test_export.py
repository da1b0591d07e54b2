"""ONNX export: every zoo model from every framework, checked, with a dynamic batch, verified."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from xdevice import ConversionError, models
from xdevice._tolerance import compare
from xdevice.converters import export, verify

NAMES = list(models.NAMES)


@pytest.fixture
def exporter(backend):
    """The backend under test, when it has an ONNX exporter."""
    if backend.name == "numpy":
        pytest.skip("numpy has no ONNX exporter (test_numpy_has_no_exporter_and_names_those_that_do)")
    return backend


def _opset_written(proto) -> int:
    return next(entry.version for entry in proto.opset_import if entry.domain in ("", "ai.onnx"))


def _run(*args):
    return subprocess.run(
        [sys.executable, "-m", "xdevice", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )


@pytest.mark.slow
@pytest.mark.realworld_on("jax")  # jax2onnx is the slowest exporter: make test-models
@pytest.mark.parametrize(
    "name", [n if n in ("mlp", "lstm") else pytest.param(n, marks=pytest.mark.realworld) for n in NAMES]
)
def test_every_zoo_model_exports_checks_and_verifies_with_a_dynamic_batch(exporter, name, tmp_path):
    import onnx
    import onnxruntime

    model = models.build(name, backend=exporter.name)
    # the LSTM takes sequences of any length: its time axis stays symbolic too (on torch, a
    # scan operator instead of a loop unrolled at the example's length)
    seq = {1: "seq"} if name == "lstm" else None
    result = export(model, tmp_path / f"{name}.onnx", dynamic_axes=seq)

    onnx.checker.check_model(str(result.path), full_check=True)
    assert result.opset == _opset_written(onnx.load(str(result.path))) == 18
    assert result.inputs[0].shape[0] == "batch" and result.outputs[0].shape == ("batch", 10)
    assert sorted(v.batch for v in result.verification) == [8, 11]
    assert all(v.comparison.ok for v in result.verification)
    session = onnxruntime.InferenceSession(str(result.path), providers=["CPUExecutionProvider"])
    for batch, length in ((2, None), (5, None), (3, 7), (2, 45)):
        x = model.example_input(batch, seed=2)
        if length is not None:
            if seq is None:
                continue
            x = np.tile(x, (1, 2))[:, :length]
        [y] = session.run(None, {"input": x})
        assert compare(y, exporter.ops.to_numpy(model(x))).ok
    if seq:
        assert result.inputs[0].shape[1] == "seq"


def test_numpy_has_no_exporter_and_names_those_that_do():
    with pytest.raises(ConversionError, match=r"numpy has no ONNX exporter.*Fix: export\(model, backend="):
        export(models.build("mlp", hidden=[8]))


@pytest.mark.realworld_on("jax")  # 13 s of jax2onnx; the rule is core's, checked on the other exporters
def test_the_reported_opset_is_the_one_written_not_the_one_asked_for(exporter, monkeypatch):
    own = exporter.export_onnx

    def writes_19(target, example_inputs, opset, dynamic_batch):
        proto = own(target, example_inputs, opset, dynamic_batch)
        for entry in proto.opset_import:
            if entry.domain in ("", "ai.onnx"):
                entry.version = 19  # what an exporter does when it cannot write the opset asked for
        return proto

    monkeypatch.setattr(exporter, "export_onnx", writes_19)
    result = export(models.build("mlp", hidden=[16], backend=exporter.name), opset=18)
    assert (result.opset, result.requested_opset) == (19, 18) == (_opset_written(result.model), 18)
    assert "opset     19 (asked for 18)" in str(result)


def test_an_exporter_that_pins_the_batch_size_is_caught(exporter, monkeypatch):
    own = exporter.export_onnx

    def pins_the_batch(target, example_inputs, opset, dynamic_batch):
        proto = own(target, example_inputs, opset, dynamic_batch)
        for value in proto.graph.input:
            value.type.tensor_type.shape.dim[0].dim_value = 8  # what a tracer that specialised does
        return proto

    monkeypatch.setattr(exporter, "export_onnx", pins_the_batch)
    with pytest.raises(ConversionError, match="fixed the batch size"):
        export(models.build("mlp", hidden=[16], backend=exporter.name))


def test_a_static_batch_keeps_the_example_size_and_verifies_once(exporter):
    result = export(
        models.build("mlp", hidden=[16], backend=exporter.name),
        example_inputs=models.build("mlp", hidden=[16]).example_input(3),
        dynamic_batch=False,
    )
    assert result.inputs[0].shape == (3, 784) and result.outputs[0].shape == (3, 10)
    assert [v.batch for v in result.verification] == [3]


def test_verify_fails_naming_the_output_the_worst_index_and_both_values(exporter):
    import onnx
    from onnx import numpy_helper

    model = models.build("mlp", hidden=[16], backend=exporter.name)
    target = models.to_native(model, exporter.name)
    x = model.example_input(4)
    source = lambda x: exporter.native_outputs(target, (x,))
    result = export(model, example_inputs=x)
    assert [v.output for v in verify(result.model, source, x)] == ["output"]

    broken = onnx.ModelProto()
    broken.CopyFrom(result.model)
    largest = max(broken.graph.initializer, key=lambda t: np.prod(t.dims))
    weights = numpy_helper.to_array(largest)
    noise = np.random.default_rng(0).normal(size=weights.shape).astype(weights.dtype)
    largest.CopyFrom(numpy_helper.from_array(weights + noise, largest.name))
    with pytest.raises(ConversionError) as failure:
        verify(broken, source, x)

    found = re.search(
        r"ONNX output 'output' disagrees with the source at batch 4: (\S+) at index "
        r"\((\d+), (\d+)\) where the source gives (\S+)\.",
        str(failure.value),
    )
    assert found, str(failure.value)
    import onnxruntime

    [onnx_out] = onnxruntime.InferenceSession(broken.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"input": x}
    )
    index = (int(found[2]), int(found[3]))
    assert float(found[1]) == pytest.approx(float(onnx_out[index]))
    assert float(found[4]) == pytest.approx(float(source(x)[0][index]))


def test_a_native_model_without_example_inputs_is_refused_with_the_fix(backend):
    native = models.to_native(models.build("mlp", hidden=[8]), backend.name)
    with pytest.raises(ConversionError, match=r"needs example_inputs.*Fix: export\(model, example_inputs="):
        export(native)


@pytest.mark.slow
def test_a_plain_torch_sequential_exports_in_eval_mode_and_keeps_its_mode_and_state():
    torch = pytest.importorskip("torch")
    nn = torch.nn
    net = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 3))
    statistics = [b.clone() for b in net.buffers()]
    x = np.random.default_rng(0).normal(size=(4, 6)).astype(np.float32)
    result = export(net, example_inputs=torch.as_tensor(x))  # dropout would fail verification
    assert result.backend == "torch" and result.inputs[0].shape == ("batch", 6)
    assert sorted(v.batch for v in result.verification) == [4, 7] and net.training
    # no call in training mode: batch norm's running statistics are as they were
    assert all(torch.equal(a, b) for a, b in zip(statistics, net.buffers()))


@pytest.mark.slow
def test_a_keras_sequential_exports_through_a_tf_function():
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "tensorflow":
        pytest.skip(f"Keras runs on {keras.backend.backend()}, not TensorFlow")
    net = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dropout(0.5), keras.layers.Dense(3)]
    )
    result = export(net, example_inputs=np.ones((4, 6), np.float32))
    assert result.backend == "tensorflow" and result.outputs[0].shape == ("batch", 3)
    assert sorted(v.batch for v in result.verification) == [4, 7]


@pytest.mark.slow
def test_a_plain_jax_function_with_params_exports_with_the_params_baked_in():
    jnp = pytest.importorskip("jax.numpy")
    params = {"w": jnp.linspace(-1.0, 1.0, 18).reshape(6, 3), "b": jnp.arange(3.0)}
    apply_fn = lambda params, x: jnp.tanh(x @ params["w"] + params["b"])
    result = export((apply_fn, params), example_inputs=np.ones((4, 6), np.float32))
    assert result.backend == "jax" and [i.name for i in result.inputs] == ["input"]
    assert len(result.model.graph.initializer) >= 2 and result.max_abs_error < 1e-5
    plain = export(lambda x: jnp.sin(x) * 2, example_inputs=np.ones((2, 5), np.float32))
    assert plain.backend == "jax" and plain.outputs[0].shape == ("batch", 5)


def test_a_model_over_the_size_limit_keeps_its_tensors_in_a_file_next_to_it(exporter, tmp_path, monkeypatch):
    import onnxruntime

    monkeypatch.setattr(importlib.import_module("xdevice.converters.external_data"), "EXTERNAL_DATA_BYTES", 1)
    model = models.build("mlp", hidden=[16], backend=exporter.name)
    result = export(model, tmp_path / "out" / "mlp.onnx")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["mlp.onnx", "mlp.onnx.data"]
    assert all(t.data_location == 0 for t in result.model.graph.initializer)  # in memory still
    x = model.example_input(3)
    session = onnxruntime.InferenceSession(str(result.path), providers=["CPUExecutionProvider"])
    [y] = session.run(None, {"input": x})
    assert compare(y, exporter.ops.to_numpy(model(x))).ok


def test_importing_the_converters_imports_no_framework(run_python):
    result = run_python("""
        import json, sys
        import xdevice.converters
        heavy = ["torch", "jax", "tensorflow", "onnx", "onnxruntime"]
        print(json.dumps([m for m in heavy if m in sys.modules]))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.slow
@pytest.mark.realworld_on("jax", "tensorflow")  # the command's printing is the same for every exporter
def test_the_export_command_prints_the_opset_shapes_errors_and_time(exporter, tmp_path):
    out = tmp_path / "mlp.onnx"
    result = _run("export", "mlp", "--backend", exporter.name, "--output", str(out), "--batch", "3")
    assert result.returncode == 0, result.stderr
    assert out.exists()
    assert f"mlp: exported from {exporter.name} by " in result.stdout
    for line in (
        "opset     18",
        "input     input float32[batch, 784]",
        "output    output float32[batch, 10]",
        "verified  output at batch 3: max abs error",
        "verified  output at batch 6: max abs error",
    ):
        assert line in result.stdout


@pytest.mark.slow
def test_the_export_command_takes_a_saved_model_and_a_static_batch(tmp_path):
    pytest.importorskip("torch")
    saved = tmp_path / "small.safetensors"
    models.build("mlp", hidden=[16], seed=3).save(saved)
    result = _run(
        "export",
        str(saved),
        "--backend",
        "torch",
        "--static-batch",
        "--no-verify",
        "--output",
        str(tmp_path / "small.onnx"),
    )
    assert result.returncode == 0, result.stderr
    assert "input     input float32[8, 784]" in result.stdout and "verified  no" in result.stdout


def _sequence_model(framework: str):
    """A model that takes any sequence length: x[batch, seq, 6] -> mean over seq -> dense."""
    w = np.linspace(-1.0, 1.0, 18, dtype=np.float32).reshape(6, 3)
    if framework == "torch":
        import torch

        class Pool(torch.nn.Module):
            def forward(self, x, mask):
                return (x * mask[..., None]).mean(dim=1) @ torch.as_tensor(w)

        return Pool()
    if framework == "tensorflow":
        import keras

        x, mask = keras.Input((None, 6), name="x"), keras.Input((None,), name="mask")
        pooled = keras.ops.mean(x * keras.ops.expand_dims(mask, -1), axis=1)
        return keras.Model({"x": x, "mask": mask}, keras.ops.matmul(pooled, w))
    import jax.numpy as jnp

    return lambda x, mask: jnp.mean(x * mask[..., None], axis=1) @ w


def test_dynamic_axes_keep_a_named_sequence_symbolic_and_verify_at_another_length(exporter):
    x = np.random.default_rng(0).normal(size=(2, 5, 6)).astype(np.float32)
    inputs = {"x": x, "mask": np.ones((2, 5), np.float32)}
    model = _sequence_model(exporter.name)
    example = inputs if exporter.name == "tensorflow" else (x, inputs["mask"])
    result = export(model, backend=exporter.name, example_inputs=example, dynamic_axes={1: "seq"})
    assert [i.shape for i in result.inputs] == [("batch", "seq", 6), ("batch", "seq")]
    assert result.outputs[0].shape == ("batch", 3)
    assert sorted(v.batch for v in result.verification) == [2, 5]  # the second run: batch 5, sequence 8
    import onnxruntime

    session = onnxruntime.InferenceSession(result.model.SerializeToString(), providers=["CPUExecutionProvider"])
    longer = np.random.default_rng(1).normal(size=(3, 11, 6)).astype(np.float32)
    feeds = dict(zip([i.name for i in session.get_inputs()], [longer, np.ones((3, 11), np.float32)]))
    np.testing.assert_allclose(
        session.run(None, feeds)[0],
        longer.mean(axis=1) @ np.linspace(-1.0, 1.0, 18, dtype=np.float32).reshape(6, 3),
        rtol=1e-5,
        atol=1e-6,
    )


@pytest.mark.parametrize(
    "axes, match",
    [
        (
            {"tokens": {1: "seq"}},
            r"names inputs the model does not take.*'tokens'.*Valid choices.*'input_0', 'input_1'",
        ),
        ({"input_1": {2: "seq"}}, r"Input 'input_1' has no axis 2"),
        ({1: "seq"}, r"One dynamic axis name stands for one size.*'seq': \[4, 5\]"),
        ({1: "not a name"}, r"Each dynamic axis is an int mapped to a name"),
    ],
)
def test_wrong_dynamic_axes_are_refused_before_anything_is_traced(axes, match):
    inputs = (np.ones((2, 5, 6), np.float32), np.ones((2, 4), np.float32))
    with pytest.raises(ConversionError, match=match):
        export(lambda x, m: x, backend="jax", example_inputs=inputs, dynamic_axes=axes)


@pytest.mark.slow
def test_the_export_command_keeps_named_axes_dynamic_and_verifies_at_other_sizes(tmp_path):
    pytest.importorskip("torch")
    result = _run(
        "export",
        "transformer",
        "--backend",
        "torch",
        "--dynamic-axis",
        "1=seq",
        "--batch",
        "3",
        "--output",
        str(tmp_path / "t.onnx"),
    )
    assert result.returncode == 0, result.stderr
    assert "input     input int32[batch, seq]" in result.stdout
    assert re.search(
        r"verified  output at batch 3, seq (\d+).*\n.*verified  output at batch 6, seq (?!\1)\d+", result.stdout
    ), result.stdout
    wrong = _run("export", "transformer", "--backend", "torch", "--dynamic-axis", "seq")
    assert wrong.returncode == 2 and "expected AXIS=NAME such as 1=seq, got 'seq'" in wrong.stderr


def test_example_inputs_the_model_cannot_take_are_reported_before_any_exporter_runs(exporter):
    """A wrong shape or dtype: the model's own one-line complaint, the inputs received, and
    nothing from inside a tracer (torch.export used to log 19 lines of fake-tensor internals)."""
    if exporter.name == "torch":
        import torch

        model = torch.nn.Sequential(torch.nn.Linear(8, 4))
    elif exporter.name == "tensorflow":
        keras = pytest.importorskip("keras")
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    else:
        import jax.numpy as jnp

        model = (lambda params, x: x @ params["w"], {"w": jnp.ones((8, 4))})
    with pytest.raises(
        ConversionError,
        match=r"The model fails on its example inputs.*(5|shape).*"
        r"Received: 'input: float32\[2, 5\]'",
    ):
        export(model, example_inputs=np.ones((2, 5), np.float32))


def test_a_list_of_rows_of_python_numbers_is_exported_as_one_input_with_a_note():
    jnp = pytest.importorskip("jax.numpy")
    rows = np.random.default_rng(0).normal(size=(4, 6)).tolist()  # x.tolist(): Python floats
    with pytest.warns(UserWarning, match=r"list of 4 rows of Python numbers: read as one input float32\[4, 6\]"):
        result = export(lambda x: jnp.tanh(x) * 2, example_inputs=rows)
    assert [(i.name, i.shape, i.dtype) for i in result.inputs] == [("input", ("batch", 6), "float32")]


def test_a_list_of_numbers_is_refused_with_the_fix_that_makes_one_array():
    with pytest.raises(
        ConversionError,
        match=r"list of 8 numbers, read as 8 separate 0-d inputs.*"
        r"Received: '\(\), \(\), \(\), \(\), \.\.\. \(8 inputs\)'.*"
        r"Fix: pass one array, batch first: np.asarray\(row, 'float32'\)\[None\]",
    ):
        export(lambda x: x, backend="jax", example_inputs=list(np.arange(8.0)))  # one row, as numbers


def test_arrays_that_look_like_rows_of_one_input_get_the_stack_fix_when_the_model_fails():
    torch = pytest.importorskip("torch")
    rows = list(np.ones((5, 8), np.float32))  # five 1-D arrays: five inputs, as documented
    with pytest.raises(ConversionError, match=r"these are 5 separate inputs of one shape.*np.stack\(rows\)"):
        export(torch.nn.Linear(8, 2), example_inputs=rows)


def test_an_exporters_error_is_summed_up_in_one_line_without_colour_or_its_own_next_steps():
    from xdevice.backends._export import exporter_failed

    class Inner(Exception):
        pass

    try:
        try:
            raise Inner("No ONNX function found for aten._linalg_eigh")
        except Inner as inner:
            raise RuntimeError(
                "Failed to convert the exported program to an ONNX model. \x1b[96mThis is step 3/3\x1b[0m of "
                "exporting the model to ONNX. Next steps:\n- If there is a missing ONNX function, implement it "
                "and register it to the registry.\n- Create an issue in the PyTorch GitHub repository against the "
                "\x1b[96m*onnx*\x1b[0m component.\n\n## Exception summary\n"
            ) from inner
    except RuntimeError as error:
        summed = str(exporter_failed("torch.onnx", error, "try another opset"))
    assert summed == (
        "torch.onnx could not export the model. Received: 'RuntimeError: Failed to convert the exported program to "
        "an ONNX model. (caused by Inner: No ONNX function found for aten._linalg_eigh)'. Fix: try another opset."
    )


def test_a_failed_torch_export_says_why_in_one_line_keeps_the_original_as_cause_and_prints_nothing(capfd):
    torch = pytest.importorskip("torch")

    class Eigen(torch.nn.Module):  # aten::linalg_eigh: neither of PyTorch's exporters translates it
        def forward(self, x):
            return torch.linalg.eigh(x @ x.transpose(-1, -2))[0]

    with pytest.raises(ConversionError) as caught:
        export(Eigen(), example_inputs=np.ones((3, 4, 4), np.float32))
    said = str(caught.value)
    assert "linalg_eigh" in said and "\n" not in said and "\x1b[" not in said
    assert "GitHub" not in said and "Next steps" not in said
    assert "Create an issue in the PyTorch GitHub repository" in str(caught.value.__cause__)  # the original, whole
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")  # torch's graph dumps (stdout and stderr) stayed off the terminal
