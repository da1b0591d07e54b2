"""An imported ONNX model, fine-tuned on any backend, exports again: its own graph with the
fine-tuned weights, with no framework exporter and no ``backend=`` detour.

Each walk runs in a child process that must exit 0: PyTorch's exporter once killed the
interpreter (SIGSEGV) on this path, and a crash must fail the test, not end the run."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from xdevice.testing.pytest_plugin import selected_backends

pytest.importorskip("onnxruntime")

WALK = textwrap.dedent("""
    import sys
    import numpy as np
    import onnxruntime as ort
    import xdevice
    from xdevice.converters import export, from_onnx
    from xdevice import models

    backend = sys.argv[1]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 12)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    source = sys.argv[2]  # a framework with an exporter (numpy has none)
    first = export(models.build("mlp", backend=source, inputs=12, hidden=[16], classes=2, seed=0),
                   example_inputs=x[:4])
    model = from_onnx(first.model, backend=backend)
    before = xdevice.backend(backend).ops.to_numpy(model(x))
    history = xdevice.fit(model, (x, y), optimizer="adam", lr=0.05, epochs=3, batch_size=32, verbose=0)
    tuned = xdevice.backend(backend).ops.to_numpy(model(x))
    again = export(model, example_inputs=x[:4])
    session = ort.InferenceSession(again.model.SerializeToString(), providers=["CPUExecutionProvider"])
    served = session.run(None, {again.inputs[0].name: x})[0]
    assert again.backend == backend, again.backend
    assert again.verification and again.max_abs_error < 1e-5, str(again)
    assert np.abs(tuned - before).max() > 1e-2, "fine-tuning did not move the outputs"
    np.testing.assert_allclose(served, tuned, rtol=1e-5, atol=1e-5)
    print("ok", history.last("loss"))
""")


EXPORTER = next((b for b in selected_backends() if b != "numpy"), "numpy")


@pytest.mark.parametrize("name", selected_backends())
@pytest.mark.realworld_on("jax", "tensorflow")  # 13 s each; torch and numpy run in make test
def test_an_imported_model_fine_tuned_on_each_backend_exports_its_new_weights(name):
    done = subprocess.run(
        [sys.executable, "-c", WALK, name, name if name != "numpy" else EXPORTER],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0 and done.stdout.startswith("ok"), (
        f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    )
