"""ONNX's signal ops (DFT, STFT, the windows, MelWeightMatrix) on every backend, compiled
where the backend compiles, against ONNX's reference evaluator and numpy's FFT."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx", reason="ONNX signal-op tests need onnx (pip install onnx)")
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from tests.converters.graphs import onnx_model
from xdevice import ConversionError
from xdevice.converters.importer import from_onnx

node, info = helper.make_node, helper.make_tensor_value_info


def _model(nodes, inputs, outputs, initializers=(), opset=20):
    return onnx_model(nodes, inputs, outputs, initializers, opset=opset)


def _int(name, value):
    return numpy_helper.from_array(np.asarray(value, np.int64), name)


def _run_compiled(backend, model, *inputs):
    """The model's outputs as numpy, run through the backend's compiler (eager where it has none)."""
    imported = from_onnx(model, backend=backend.name, check=False)
    outputs = backend.jit(imported.apply)(imported.params, *(backend.ops.asarray(x) for x in inputs))
    return [backend.ops.to_numpy(y) for y in outputs]


def _dft_model(shape, *, axis, length=None, inverse=0, onesided=0, elem=TensorProto.FLOAT):
    inits = [_int("axis", axis)] + ([_int("length", length)] if length is not None else [])
    dft = node("DFT", ["x", "length" if length is not None else "", "axis"], ["y"], inverse=inverse, onesided=onesided)
    return _model([dft], [info("x", elem, shape)], [info("y", elem, None)], inits)


DFT_CASES = {
    # name: (input shape, axis, dft_length, inverse, onesided)
    "real forward on a middle axis": ((2, 6, 3, 1), 1, None, 0, 0),
    "complex forward, zero-padded": ((2, 5, 2), -2, 8, 0, 0),
    "complex inverse, truncated": ((3, 9, 2), 1, 6, 1, 0),
    "real to one-sided (odd length)": ((4, 7, 1), 1, None, 0, 1),
    "one-sided to real (IRFFT, default length)": ((2, 5, 2), 1, None, 1, 1),
    "one-sided to real (IRFFT, odd length)": ((2, 5, 2), 1, 9, 1, 1),
}


@pytest.mark.parametrize("case", list(DFT_CASES))
def test_dft_matches_the_onnx_reference_on_every_backend(backend, case):
    shape, axis, length, inverse, onesided = DFT_CASES[case]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    model = _dft_model(shape, axis=axis, length=length, inverse=inverse, onesided=onesided)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    (got,) = _run_compiled(backend, model, x)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_dft_opset_17_reads_the_axis_from_its_attribute(backend):
    x = np.arange(24, dtype=np.float32).reshape(1, 4, 6, 1)
    model = _model(
        [node("DFT", ["x"], ["y"], axis=2)],
        [info("x", TensorProto.FLOAT, x.shape)],
        [info("y", TensorProto.FLOAT, None)],
        opset=17,
    )
    (got,) = _run_compiled(backend, model, x)
    want = np.fft.fft(x[..., 0], axis=2)
    np.testing.assert_allclose(got, np.stack([want.real, want.imag], axis=-1), rtol=1e-5, atol=1e-4)


def test_dft_keeps_float64_in_float64(backend):
    if backend.ops.dtype(backend.ops.asarray(np.zeros(1))) != "float64":
        pytest.skip(f"{backend.name} holds float64 as float32 here (JAX without jax_enable_x64)")
    x = np.random.default_rng(1).standard_normal((3, 64, 2))
    model = _dft_model(x.shape, axis=1, inverse=1, elem=TensorProto.DOUBLE)
    (got,) = _run_compiled(backend, model, x)
    want = np.fft.ifft(x[..., 0] + 1j * x[..., 1], axis=1)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, np.stack([want.real, want.imag], axis=-1), rtol=0, atol=1e-13)


def test_dft_on_the_real_imaginary_axis_is_refused_by_name(backend):
    model = _dft_model((2, 4, 1), axis=-1)
    with pytest.raises(ConversionError, match=r"DFT node 'DFT': the axis is out of range"):
        _run_compiled(backend, model, np.ones((2, 4, 1), np.float32))


def test_stft_of_a_hann_windowed_signal_matches_the_onnx_reference(backend):
    """The window comes from a HannWindow node, the frames from STFT: a spectrogram front end."""
    signal = np.random.default_rng(2).standard_normal((2, 50, 1)).astype(np.float32)
    model = _model(
        [
            node("HannWindow", ["frame_length"], ["window"]),
            node("STFT", ["signal", "frame_step", "window", "frame_length"], ["spectrum"]),
        ],
        [info("signal", TensorProto.FLOAT, signal.shape)],
        [info("spectrum", TensorProto.FLOAT, None)],
        [_int("frame_step", 6), _int("frame_length", 16)],
        opset=17,
    )
    (want,) = ReferenceEvaluator(model).run(None, {"signal": signal})
    (got,) = _run_compiled(backend, model, signal)
    assert got.shape == want.shape == (2, 1 + (50 - 16) // 6, 16 // 2 + 1, 2)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_stft_of_a_complex_signal_gives_every_bin_when_not_onesided(backend):
    signal = np.random.default_rng(3).standard_normal((1, 20, 2)).astype(np.float32)
    model = _model(
        [node("STFT", ["signal", "frame_step", "", "frame_length"], ["spectrum"], onesided=0)],
        [info("signal", TensorProto.FLOAT, signal.shape)],
        [info("spectrum", TensorProto.FLOAT, None)],
        [_int("frame_step", 5), _int("frame_length", 10)],
        opset=17,
    )
    (got,) = _run_compiled(backend, model, signal)
    frames = [signal[0, s : s + 10, 0] + 1j * signal[0, s : s + 10, 1] for s in (0, 5, 10)]
    want = np.fft.fft(np.stack(frames), axis=-1)
    np.testing.assert_allclose(got[0], np.stack([want.real, want.imag], axis=-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows_match_the_onnx_reference_in_the_dtype_asked_for(backend, op, periodic):
    model = _model(
        [node(op, ["size"], ["window"], periodic=periodic, output_datatype=TensorProto.DOUBLE)],
        [],
        [info("window", TensorProto.DOUBLE, None)],
        [_int("size", 11)],
        opset=17,
    )
    (want,) = ReferenceEvaluator(model).run(None, {})
    (got,) = _run_compiled(backend, model)
    assert got.dtype == np.float64 or backend.ops.dtype(backend.ops.asarray(np.zeros(1))) != "float64"
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_a_symmetric_window_of_one_sample_is_one(backend):
    """ONNX's formula divides by size - 1 = 0 there; torch.hann_window(1, periodic=False) gives [1]."""
    model = _model(
        [node("HannWindow", ["size"], ["window"], periodic=0)],
        [],
        [info("window", TensorProto.FLOAT, None)],
        [_int("size", 1)],
        opset=17,
    )
    (got,) = _run_compiled(backend, model)
    assert got.tolist() == [1.0]


MEL_CASES = {
    "speech features": (40, 512, 16000, 20.0, 8000.0),  # a common ASR front end: 16 kHz, 20 Hz to 8 kHz
    "bands narrower than a bin": (8, 16, 8192, 0.0, 4096.0),  # filters one bin wide: 1 at their centre
}


@pytest.mark.parametrize("case", list(MEL_CASES))
def test_mel_weight_matrix_matches_the_onnx_reference(backend, case):
    bands, length, rate, lower, upper = MEL_CASES[case]
    inits = [
        numpy_helper.from_array(np.asarray(v, dtype), name)
        for name, v, dtype in [
            ("bands", bands, np.int32),
            ("length", length, np.int32),
            ("rate", rate, np.int32),
            ("lower", lower, np.float32),
            ("upper", upper, np.float32),
        ]
    ]
    model = _model(
        [node("MelWeightMatrix", ["bands", "length", "rate", "lower", "upper"], ["weights"])],
        [],
        [info("weights", TensorProto.FLOAT, None)],
        inits,
        opset=17,
    )
    (want,) = ReferenceEvaluator(model).run(None, {})
    (got,) = _run_compiled(backend, model)
    assert got.shape == (length // 2 + 1, bands) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
