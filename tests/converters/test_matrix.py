"""The conversion matrix: every zoo model, from each framework to ONNX and into every target.

Source in {torch, tensorflow, jax} -> ONNX -> target in {torch, tensorflow, jax, numpy,
onnxruntime}; each target's output is compared with the source framework's own output at
float32 tolerance, on a batch size the export never saw.
"""

from __future__ import annotations

import numpy as np
import pytest

import xdevice
from xdevice import models
from xdevice._tolerance import compare
from xdevice.converters import export
from xdevice.converters.importer import from_onnx

SOURCES = [name for name in ("torch", "tensorflow", "jax") if name in xdevice.backends()]
TARGETS = [name for name in ("torch", "tensorflow", "jax", "numpy") if name in xdevice.backends()]


def _onnxruntime(proto, x):
    import onnxruntime

    session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


#: `make test` runs one source per model, every source at least once; `make test-models` (the
#: realworld marker) runs the rest of the matrix
QUICK = {("mlp", "torch"), ("cnn", "tensorflow"), ("resnet", "jax"), ("lstm", "tensorflow"), ("transformer", "torch")}
CASES = [
    pytest.param(name, source, id=f"{name}-{source}", marks=() if (name, source) in QUICK else pytest.mark.realworld)
    for name in models.NAMES
    for source in SOURCES
]


@pytest.mark.slow
@pytest.mark.parametrize("name, source", CASES)
def test_every_zoo_model_goes_from_each_framework_through_onnx_into_every_target(name, source):
    model = models.build(name, seed=0, backend=source)
    result = export(model, example_inputs=model.example_input(4, seed=1))
    x = model.example_input(7, seed=3)
    expected = xdevice.backend(source).ops.to_numpy(model(x))

    got = {"onnxruntime": _onnxruntime(result.model, x)}
    for target in TARGETS:
        imported = from_onnx(result.model, backend=target)
        out = imported(xdevice.backend(target).ops.asarray(x))
        assert xdevice.backend_of(out) == target
        got[target] = xdevice.backend(target).ops.to_numpy(out)

    failures = {target: compare(y, expected) for target, y in got.items()}
    failures = {target: str(c) for target, c in failures.items() if not c.ok}
    assert not failures, f"{name} from {source}: {failures}"
    assert all(y.shape == expected.shape and y.dtype == np.float32 for y in got.values())
