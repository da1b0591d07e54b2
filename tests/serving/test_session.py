"""Session: ONNX Runtime on a device, with the providers really in use and checked inputs."""

from __future__ import annotations

import threading

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402 - below the importorskip guard

from xdevice import ConfigurationError, Device, DeviceNotFound, InferenceError, devices  # noqa: E402 - below the importorskip guard
from xdevice.serving import session as session_module  # noqa: E402 - below the importorskip guard
from xdevice.serving.session import Session, TensorSpec, _check_providers, provider_list  # noqa: E402 - below the importorskip guard

GPU = Device("gpu", 0)


def _model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "tiny", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


@pytest.fixture(scope="module")
def mul_relu_add():
    """y = relu(x * 2) + 1 over x: float32[N, 4]; also mask = x > 0 (bool)."""
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["m"], name="mul0"),
        helper.make_node("Relu", ["m"], ["r"], name="relu0"),
        helper.make_node("Add", ["r", "one"], ["y"], name="add0"),
        helper.make_node("Greater", ["x", "zero"], ["mask"], name="gt0"),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("mask", TensorProto.BOOL, ["N", 4]),
        ],
        [two, one, zero],
    )


@pytest.fixture(scope="module")
def session(mul_relu_add):
    return Session(mul_relu_add, "cpu", threads=1)


def _expected(x):
    return np.maximum(x * 2, 0) + 1


X = np.arange(-4, 4, dtype=np.float32).reshape(2, 4)


def test_cpu_run_matches_numpy(session):
    out = session.run({"x": X})
    np.testing.assert_allclose(out["y"], _expected(X))
    np.testing.assert_array_equal(out["mask"], X > 0)


def test_specs_describe_inputs_and_outputs_with_symbolic_dims_as_none(session):
    assert session.inputs == [TensorSpec("x", "float32", (None, 4))]
    assert session.outputs == [TensorSpec("y", "float32", (None, 4)), TensorSpec("mask", "bool", (None, 4))]


def test_cpu_session_reports_registered_provider_and_node_counts(session):
    assert session.providers == ["CPUExecutionProvider"]
    assert session.assignment == {"CPUExecutionProvider": 4}
    assert "CPUExecutionProvider" in repr(session) and "cpu:0" in repr(session)


def test_a_python_list_is_cast_to_the_input_dtype(session):
    out = session.run({"x": X.tolist()}, outputs=["y"])
    assert list(out) == ["y"]
    np.testing.assert_allclose(out["y"], _expected(X))


def test_loads_from_a_path_and_names_the_session_after_the_file(mul_relu_add, tmp_path):
    path = tmp_path / "tiny.onnx"
    onnx.save(mul_relu_add, path)
    loaded = Session(path, warmup=False)
    assert loaded.name == "tiny" and loaded.model_path == path
    np.testing.assert_allclose(loaded.run({"x": X})["y"], _expected(X))


def test_torch_input_and_torch_output(session):
    torch = pytest.importorskip("torch")
    out = session.run({"x": torch.from_numpy(X.copy())}, to="torch")
    assert isinstance(out["y"], torch.Tensor) and out["mask"].dtype == torch.bool
    np.testing.assert_allclose(out["y"].numpy(), _expected(X))
    np.testing.assert_array_equal(out["mask"].numpy(), X > 0)


def test_jax_input_and_jax_output(session):
    jnp = pytest.importorskip("jax.numpy")
    out = session.run({"x": jnp.asarray(X)}, to="jax")
    assert type(out["y"]).__module__.startswith("jax")
    np.testing.assert_allclose(np.asarray(out["y"]), _expected(X))


def test_numpy_output_from_a_torch_input(session):
    torch = pytest.importorskip("torch")
    out = session.run({"x": torch.from_numpy(X.copy()).t().contiguous().t()})
    assert isinstance(out["y"], np.ndarray)


def test_unknown_input_name_lists_the_valid_names(session):
    with pytest.raises(InferenceError, match=r"Valid choices: x\."):
        session.run({"z": X})


def test_wrong_dtype_says_which_dtype_is_expected(session):
    with pytest.raises(InferenceError, match="Expected float32.*'float64'"):
        session.run({"x": X.astype(np.float64)})


def test_wrong_rank_and_wrong_fixed_dim_are_refused(session):
    with pytest.raises(InferenceError, match=r"rank 2, shape \(\?, 4\).*'\(8,\)'"):
        session.run({"x": X.ravel()})
    with pytest.raises(InferenceError, match="wrong shape"):
        session.run({"x": np.zeros((2, 3), np.float32)})


def test_unknown_output_name_and_framework_are_refused(session):
    with pytest.raises(InferenceError, match="Valid choices: y, mask"):
        session.run({"x": X}, outputs=["z"])
    with pytest.raises(InferenceError, match="Did you mean 'torch'"):
        session.run({"x": X}, to="trch")


def test_warmup_makes_the_session_ready(mul_relu_add):
    assert Session(mul_relu_add).ready is True
    assert Session(mul_relu_add, warmup=False).ready is True


def reshape_to_four():
    """``y = reshape(x, [4])`` over a dynamic axis: it runs on 4 rows only."""
    shape = helper.make_tensor("shape", TensorProto.INT64, [1], [4])
    return _model(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [shape],
    )


def test_warmup_failure_says_how_to_skip_it():
    model = reshape_to_four()  # fails on the warm-up's 1-row zeros
    with pytest.raises(InferenceError, match="warmup=False"):
        Session(model)
    assert Session(model, warmup=False).run({"x": np.ones(4, np.float32)})["y"].shape == (4,)


def test_warmup_runs_at_each_batch_size_asked_for():
    """A GPU session of a batched model warms up at every size its batcher can form
    (``serving.models.warmup_batches``): each size runs on zeros of that many rows. Reshape to
    a fixed 4 elements runs on 4 rows only, so the failing size shows which ones ran."""
    model = reshape_to_four()
    assert Session(model, warmup_batches=(4,)).ready
    with pytest.raises(InferenceError, match=r"on zeros failed \(batch 2\)"):
        Session(model, warmup_batches=(4, 2))


def test_string_inputs_accept_bytes_and_come_back_as_str():
    model = _model(
        [helper.make_node("Identity", ["s"], ["t"])],
        [helper.make_tensor_value_info("s", TensorProto.STRING, [None])],
        [helper.make_tensor_value_info("t", TensorProto.STRING, [None])],
    )
    session = Session(model)
    assert session.run({"s": [b"ab", "c\u00e9"]})["t"].tolist() == ["ab", "c\u00e9"]


def test_runs_from_several_threads(session):
    results, errors = [], []

    def work(i):
        try:
            results.append(np.allclose(session.run({"x": X + i})["y"], _expected(X + i)))
        except Exception as error:  # noqa: BLE001 - any failure in a thread is reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and results == [True] * 8


def test_bad_settings_are_configuration_errors(mul_relu_add):
    with pytest.raises(ConfigurationError, match="Did you mean 'extended'"):
        Session(mul_relu_add, optimization="extnded")
    with pytest.raises(ConfigurationError, match="threads"):
        Session(mul_relu_add, threads=0)
    with pytest.raises(ConfigurationError, match="TensorRT needs a GPU"):
        Session(mul_relu_add, tensorrt=True)


def test_a_gpu_session_without_cuda_provider_raises_instead_of_running_on_cpu(mul_relu_add):
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime build has CUDA; the fallback cannot be shown here")
    fix = "onnxruntime-gpu" if devices(kind="gpu") else "no GPU here; use cpu:0"  # the advice fits the machine
    with pytest.raises(DeviceNotFound, match=fix):
        Session(mul_relu_add, "gpu:0")


QUIET_GPU_SESSION = """
    from onnx import TensorProto, helper
    from xdevice.serving.session import Session
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor("unused", TensorProto.FLOAT, [1], [0.0])],  # ORT warns as it removes it
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    try:
        Session(model, "gpu:0")
    except Exception as error:
        print(type(error).__name__)
"""


def test_onnx_runtime_warnings_reach_stderr_only_when_asked_for(run_python):
    """A GPU session where ORT has no CUDA, on a model ORT warns about (an unused initializer):
    xdevice's error says what matters, so ORT's warnings show only with XDEVICE_VERBOSE
    (xdevice --verbose)."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime build has CUDA: a gpu:0 session may load, and no DeviceNotFound follows")
    quiet = run_python(QUIET_GPU_SESSION, env={"XDEVICE_VERBOSE": "0"})
    assert quiet.stdout.strip() == "DeviceNotFound", quiet.stderr
    assert quiet.stderr == ""
    verbose = run_python(QUIET_GPU_SESSION, env={"XDEVICE_VERBOSE": "1"})
    assert verbose.stdout.strip() == "DeviceNotFound", verbose.stderr
    assert "onnxruntime" in verbose.stderr


# -- the provider decision, with made-up sessions (the ORT-CUDA path, covered on CPU) ------

REQUESTED = ["CUDAExecutionProvider", "CPUExecutionProvider"]


def test_check_providers_refuses_gpu_when_cuda_did_not_register():
    with pytest.raises(DeviceNotFound, match="xdevice doctor"):
        _check_providers(GPU, REQUESTED, ["CPUExecutionProvider"], [("CPUExecutionProvider", "Add")], False)
    with pytest.raises(DeviceNotFound, match="pip install onnxruntime-gpu"):
        _check_providers(GPU, REQUESTED, ["CPUExecutionProvider"], None, False, gpus=1)


def test_on_a_machine_without_a_gpu_the_fix_is_the_cpu_not_onnxruntime_gpu(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(DeviceNotFound) as caught:
        _check_providers(GPU, REQUESTED, ["CPUExecutionProvider"], None, False, gpus=0)
    assert "this machine has no GPU" in str(caught.value)
    assert str(caught.value).endswith("Fix: no GPU here; use cpu:0.")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(DeviceNotFound, match=r"use cpu:0 \(or unset CUDA_VISIBLE_DEVICES='', if it hides a GPU\)"):
        _check_providers(GPU, REQUESTED, ["CPUExecutionProvider"], None, False, gpus=0)


def test_check_providers_refuses_missing_tensorrt():
    with pytest.raises(ConfigurationError, match="tensorrt=False"):
        _check_providers(GPU, ["TensorrtExecutionProvider", *REQUESTED], REQUESTED, [], False)


def test_strict_lists_the_ops_that_fell_back_to_cpu():
    nodes = [
        ("CUDAExecutionProvider", "MatMul"),
        ("CPUExecutionProvider", "NonZero"),
        ("CPUExecutionProvider", "Shape"),
        ("CPUExecutionProvider", "Shape"),
    ]
    _check_providers(GPU, REQUESTED, REQUESTED, nodes, strict=False)
    with pytest.raises(ConfigurationError, match=r"3 node\(s\).*NonZero x1, Shape x2"):
        _check_providers(GPU, REQUESTED, REQUESTED, nodes, strict=True)


def test_strict_passes_when_every_node_is_on_cuda():
    _check_providers(GPU, REQUESTED, REQUESTED, [("CUDAExecutionProvider", "MatMul")] * 3, strict=True)


def test_strict_refuses_when_ort_cannot_report_assignment():
    with pytest.raises(ConfigurationError, match="strict=False"):
        _check_providers(GPU, REQUESTED, REQUESTED, None, strict=True)


def test_check_providers_accepts_any_cpu_session():
    _check_providers(Device("cpu", 0), ["CPUExecutionProvider"], ["CPUExecutionProvider"], None, True)


def test_provider_list_puts_tensorrt_first_and_cpu_last():
    providers = provider_list(Device("gpu", 2), tensorrt=True)
    assert [name for name, _ in providers] == [
        "TensorrtExecutionProvider",
        "CUDAExecutionProvider",
        "CPUExecutionProvider",
    ]
    assert providers[0][1] == {"device_id": "2"}
    assert providers[1][1]["device_id"] == "2"
    assert provider_list(Device("cpu", 0)) == [("CPUExecutionProvider", {})]


def test_provider_list_asks_only_for_what_the_build_has():
    """The check after creation still names the provider that was asked for and did not register."""
    cpu_build = ["CPUExecutionProvider"]
    assert provider_list(GPU, available=cpu_build, tensorrt=True) == [("CPUExecutionProvider", {})]
    no_trt = provider_list(GPU, available=REQUESTED, tensorrt=True)
    assert [name for name, _ in no_trt] == REQUESTED


def test_strict_leaves_the_cpu_provider_out_as_ort_requires_with_fallback_disabled():
    assert [name for name, _ in provider_list(GPU, cpu_fallback=False)] == ["CUDAExecutionProvider"]


def test_configured_memory_limit_reaches_the_cuda_options(monkeypatch):
    limits = {Device("gpu", 0): 2**30, Device("gpu", 1): 2 * 2**30}
    monkeypatch.setattr(session_module._onnxruntime._configure, "memory_limit_for", limits.get)
    cuda = provider_list(Device("gpu", 1))[0]
    assert cuda == ("CUDAExecutionProvider", {"device_id": "1", "use_tf32": "0", "gpu_mem_limit": str(2 * 2**30)})


def test_strict_holds_without_node_assignment_when_ort_refused_cpu_fallback_itself():
    _check_providers(
        GPU, REQUESTED, ["CUDAExecutionProvider", "CPUExecutionProvider"], None, True, cpu_fallback_refused=True
    )


def test_each_instance_thread_runs_its_own_session(mul_relu_add):
    """``instance_group { count: 2 }`` on a GPU: two sessions (two CUDA streams), one per
    instance thread, each thread always on its own (``serving.models.Instances``). The two
    sessions compute different things, so an answer says which one ran."""
    import concurrent.futures

    from xdevice.serving.models import Instances

    identity = _model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    instances = Instances([Session(mul_relu_add), Session(identity)])
    both_started = threading.Barrier(2)

    def which(_):
        both_started.wait(timeout=10)
        ran = "identity" if np.array_equal(instances.run({"x": X})["y"], X) else "mul_relu_add"
        return threading.get_ident(), ran

    with concurrent.futures.ThreadPoolExecutor(2, initializer=instances.bind) as pool:
        seen = list(pool.map(which, range(2))) + list(pool.map(which, range(2)))
    by_thread: dict = {}
    for thread, ran in seen:
        by_thread.setdefault(thread, set()).add(ran)
    assert sorted(ran for kinds in by_thread.values() for ran in kinds) == ["identity", "mul_relu_add"]
    assert all(len(kinds) == 1 for kinds in by_thread.values())
