"""ONNX Runtime sessions under xdevice's settings: providers, their options, session options, preloading.

The decisions are pure functions of made-up provider lists and devices (the CUDA path is
covered here on CPU); one real CPU session built through them runs a small model.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

from xdevice import ConfigurationError, Device
from xdevice import _onnxruntime as ortx
from xdevice._onnxruntime import CPU, CUDA, DISABLE_CPU_FALLBACK

GPU = Device("gpu", 0)
HOST = Device("cpu", 0)
CUDA_BUILD = [CUDA, CPU]
CPU_BUILD = [CPU]


@pytest.fixture
def settings(monkeypatch):
    """Made-up process-wide settings, as ``xdevice.configure`` would leave them."""
    state = {"precision": "highest", "deterministic": False, "limits": {}}
    monkeypatch.setattr(ortx._configure, "matmul_precision", lambda: state["precision"])
    monkeypatch.setattr(ortx._configure, "deterministic", lambda: state["deterministic"])
    monkeypatch.setattr(ortx._configure, "memory_limit_for", lambda device: state["limits"].get(device))
    return state


# -- providers and their options ------------------------------------------------------------


def test_a_cpu_device_gets_only_the_cpu_provider():
    assert ortx.provider_options(CUDA_BUILD, HOST, precision="high", memory_limit=2**30) == [(CPU, {})]


def test_a_gpu_asked_of_a_cpu_only_build_gets_the_cpu_provider_for_the_check_after_creation():
    assert ortx.provider_options(CPU_BUILD, GPU, precision="highest") == [(CPU, {})]


@pytest.mark.parametrize(("precision", "tf32"), [("highest", "0"), ("high", "1"), ("medium", "1")])
def test_use_tf32_follows_the_matmul_precision(precision, tf32):
    providers = ortx.provider_options(CUDA_BUILD, Device("gpu", 3), precision=precision)
    assert providers == [(CUDA, {"device_id": "3", "use_tf32": tf32}), (CPU, {})]


def test_the_memory_limit_becomes_gpu_mem_limit_in_bytes():
    (name, cuda), _ = ortx.provider_options(CUDA_BUILD, GPU, precision="highest", memory_limit=1.5 * 2**30)
    assert name == CUDA and cuda["gpu_mem_limit"] == str(3 * 2**29)


def test_every_option_value_is_a_string_as_ort_reads_them():
    providers = ortx.provider_options(
        CUDA_BUILD, GPU, precision="high", memory_limit=2**30, conv_algo_search="HEURISTIC"
    )
    assert all(isinstance(v, str) for _, options in providers for v in options.values())


def test_refusing_cpu_fallback_leaves_the_cpu_provider_out():
    """ORT refuses a session that lists the CPU provider with session.disable_cpu_ep_fallback set."""
    providers = ortx.provider_options(CUDA_BUILD, GPU, precision="highest", cpu_fallback=False)
    assert [name for name, _ in providers] == [CUDA]


def test_unknown_precision_and_algorithm_search_are_refused_with_the_choices():
    with pytest.raises(ConfigurationError, match="Did you mean 'highest'"):
        ortx.provider_options(CUDA_BUILD, GPU, precision="hihgest")
    with pytest.raises(ConfigurationError, match="EXHAUSTIVE, HEURISTIC, DEFAULT"):
        ortx.provider_options(CUDA_BUILD, GPU, precision="highest", conv_algo_search="fastest")


def test_configured_options_read_configure_settings(settings):
    settings.update(precision="high", limits={Device("gpu", 1): 2**30})
    (_, cuda), _ = ortx.configured_provider_options(CUDA_BUILD, Device("gpu", 1))
    assert cuda == {"device_id": "1", "use_tf32": "1", "gpu_mem_limit": str(2**30)}


def test_deterministic_fixes_the_cudnn_algorithm_search_to_default(settings):
    (_, cuda), _ = ortx.configured_provider_options(CUDA_BUILD, GPU)
    assert "cudnn_conv_algo_search" not in cuda  # ORT's own default, EXHAUSTIVE: the fastest, timed
    settings["deterministic"] = True
    (_, cuda), _ = ortx.configured_provider_options(CUDA_BUILD, GPU)
    assert cuda["cudnn_conv_algo_search"] == "DEFAULT"


CONFIGURED_OPTIONS = """
    import xdevice
    from xdevice import Device
    from xdevice import _onnxruntime as ortx
    xdevice.configure(matmul_precision="high", deterministic=True)
    print(ortx.configured_provider_options([ortx.CUDA, ortx.CPU], Device("gpu", 0))[0][1])
"""


def test_configure_reaches_the_cuda_options(run_python):
    """The real settings, in a fresh interpreter: configure() before any framework starts."""
    done = run_python(CONFIGURED_OPTIONS)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(
        {"device_id": "0", "use_tf32": "1", "cudnn_conv_algo_search": "DEFAULT"}
    )


# -- session options ------------------------------------------------------------------------


def test_cpu_fallback_is_disabled_only_for_a_gpu_on_a_cuda_build():
    assert ortx.session_config(CUDA_BUILD, GPU) == {DISABLE_CPU_FALLBACK: "1"}
    assert ortx.session_config(CUDA_BUILD, HOST) == {}
    assert ortx.session_config(CPU_BUILD, GPU) == {}  # no CUDA to keep the nodes on: the check says so
    assert ortx.session_config(CUDA_BUILD, GPU, cpu_fallback=True) == {}


def test_session_options_carry_the_entries_into_a_real_session_options(settings):
    ort = pytest.importorskip("onnxruntime")
    gpu = ortx.session_options(GPU, available=CUDA_BUILD, cpu_fallback=False, ort=ort)
    assert gpu.get_session_config_entry(DISABLE_CPU_FALLBACK) == "1"
    host = ortx.session_options(HOST, available=CUDA_BUILD, cpu_fallback=False, ort=ort)
    with pytest.raises(Exception, match=DISABLE_CPU_FALLBACK):  # ORT: no such entry
        host.get_session_config_entry(DISABLE_CPU_FALLBACK)
    assert host.use_deterministic_compute is False
    settings["deterministic"] = True
    assert ortx.session_options(HOST, available=CPU_BUILD, ort=ort).use_deterministic_compute is True


# -- preload_dlls ---------------------------------------------------------------------------


def _made_up_ort(available, *, has_preload=True):
    calls = []

    def preload_dlls():
        calls.append("preload")
        print("Failed to load libcudnn.so.9: no such file")  # what the real one prints

    module = types.SimpleNamespace(get_available_providers=lambda: list(available), calls=calls)
    if has_preload:
        module.preload_dlls = preload_dlls
    return module


def test_preload_is_wanted_only_for_a_gpu_on_a_cuda_build_that_has_it():
    assert ortx.wants_preload(_made_up_ort(CUDA_BUILD), GPU)
    assert not ortx.wants_preload(_made_up_ort(CUDA_BUILD), HOST)
    assert not ortx.wants_preload(_made_up_ort(CPU_BUILD), GPU)  # CPU builds >= 1.21 have the function too
    assert not ortx.wants_preload(_made_up_ort(CUDA_BUILD, has_preload=False), GPU)  # onnxruntime-gpu < 1.21


def test_preload_runs_once_per_process_and_keeps_its_printing_off_stdout(monkeypatch, capsys, caplog):
    monkeypatch.setattr(ortx, "_preloaded", False)
    ort = _made_up_ort(CUDA_BUILD)
    with caplog.at_level("DEBUG", logger="xdevice"):
        assert ortx.preload_dlls(GPU, ort=ort) is True
        assert ortx.preload_dlls(Device("gpu", 1), ort=ort) is False
    assert ort.calls == ["preload"]
    assert capsys.readouterr().out == ""
    assert "libcudnn" in caplog.text


def test_preload_is_never_called_for_a_cpu_session_or_a_cpu_only_build(monkeypatch):
    monkeypatch.setattr(ortx, "_preloaded", False)
    cuda_build, cpu_build = _made_up_ort(CUDA_BUILD), _made_up_ort(CPU_BUILD)
    assert ortx.preload_dlls(HOST, ort=cuda_build) is False
    assert ortx.preload_dlls(GPU, ort=cpu_build) is False
    assert cuda_build.calls == cpu_build.calls == []


def test_a_failing_preload_is_logged_not_raised(monkeypatch, caplog):
    monkeypatch.setattr(ortx, "_preloaded", False)
    ort = _made_up_ort(CUDA_BUILD)
    ort.preload_dlls = lambda: (_ for _ in ()).throw(RuntimeError("Invalid parameter of directory"))
    with caplog.at_level("DEBUG", logger="xdevice"):
        assert ortx.preload_dlls(GPU, ort=ort) is True
    assert "Invalid parameter of directory" in caplog.text


# -- a real session through the new path ----------------------------------------------------


def test_a_cpu_session_built_from_these_options_runs_a_small_model(settings):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Relu", ["xw"], ["y"])],
        "matmul_relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [onnx.numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    settings["deterministic"] = True
    available = ort.get_available_providers()
    session = ort.InferenceSession(
        model.SerializeToString(),
        ortx.session_options(HOST, available=available, ort=ort),
        providers=ortx.configured_provider_options(available, HOST),
    )
    x = np.array([[1, -2, 3, 0.5], [-1, -1, -1, -1]], dtype=np.float32)
    (y,) = session.run(None, {"x": x})
    np.testing.assert_allclose(y, np.maximum(x @ w, 0), rtol=1e-6)
    assert session.get_providers() == [CPU]


# -- export verification states its precision -----------------------------------------------


@pytest.fixture
def relu_model():
    pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    model = onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def test_verification_states_the_precision_the_source_ran_under(settings, relu_model):
    from xdevice.converters import verify

    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    (check,) = verify(relu_model, lambda x: np.maximum(x, 0), x)
    assert check.precision == "highest" and str(check).endswith("matmul precision highest)")
    settings["precision"] = "high"
    (check,) = verify(relu_model, lambda x: np.maximum(x, 0), x)
    assert check.precision == "high"


def test_a_disagreement_under_reduced_precision_says_to_verify_at_highest(settings, relu_model):
    from xdevice import ConversionError
    from xdevice.converters import verify

    settings["precision"] = "medium"
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    with pytest.raises(ConversionError, match=r"matmul_precision='highest'.*IEEE float32"):
        verify(relu_model, lambda x: np.maximum(x, 0) + 0.01, x)
