"""One precision and one seed on the GPU: ``configure(matmul_precision=...)`` changes the frameworks'
own float32 matmul as documented, ``seed`` + ``configure(deterministic=True)`` makes a fit repeat
bitwise, and ONNX Runtime's CUDA sessions follow the precision. Each runs in a fresh interpreter:
determinism and memory settings precede the runtime."""

from __future__ import annotations

import json

import pytest

from .conftest import needs, needs_ampere, needs_ort_gpu

pytestmark = pytest.mark.gpu

# a float32 matmul on gpu:0 in each framework's own terms, and its error against float64
MATMUL = """
    import hashlib, json, numpy as np, xdevice
    xdevice.configure(matmul_precision={precision!r}, backends=[{name!r}])
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((512, 512), dtype=np.float32), rng.standard_normal((512, 512), dtype=np.float32)
    if {name!r} == "torch":
        import torch
        out = (torch.tensor(a, device="cuda:0") @ torch.tensor(b, device="cuda:0")).cpu().numpy()
    else:
        import jax
        gpu = jax.devices("gpu")[0]
        out = np.asarray(jax.device_put(a, gpu) @ jax.device_put(b, gpu))
    exact = a.astype(np.float64) @ b.astype(np.float64)
    error = float(np.abs(out - exact).max() / np.abs(exact).max())
    said = xdevice.backend({name!r}).numerics()["matmul_precision"]  # the framework's own getter
    print(json.dumps([error, hashlib.sha256(out.tobytes()).hexdigest(), said]))
"""
# what each framework's own getter reads back for each setting
READ_BACK = {
    "torch": {p: p for p in ("highest", "high", "medium")},
    "jax": {"highest": "highest", "high": "high", "medium": "bfloat16"},
}


def matmul(run_python, name: str, precision: str) -> tuple[float, str]:
    result = run_python(MATMUL.format(name=name, precision=precision))
    assert result.returncode == 0, result.stderr[-3000:]
    error, digest, said = json.loads(result.stdout.splitlines()[-1])
    assert said == READ_BACK[name][precision]
    return error, digest


@pytest.mark.parametrize("name", ["torch", "jax"])
def test_highest_is_ieee_float32(run_python, name):
    needs(name)
    error, _ = matmul(run_python, name, "highest")
    assert error < 1e-5


@pytest.mark.parametrize("precision, bound", [("high", 1e-2), ("medium", 5e-2)])
@pytest.mark.parametrize("name", ["torch", "jax"])
def test_a_lower_precision_changes_the_matmul_within_its_documented_error(run_python, name, precision, bound):
    """On Ampere and newer, "high" rounds through TF32 (or bf16x3) and "medium" through bf16:
    the product differs from the "highest" one, by no more than that format's error."""
    needs(name)
    needs_ampere()
    _, highest = matmul(run_python, name, "highest")
    error, lower = matmul(run_python, name, precision)
    assert lower != highest
    assert error < bound


DETERMINISTIC_FIT = """
    import hashlib, json, numpy as np, xdevice
    from xdevice import fit, models
    xdevice.configure(deterministic=True, backends=[{name!r}])

    def trained():
        xdevice.seed(0)
        model = models.build("mlp", backend={name!r}, hidden=[256, 256], inputs=32, classes=8)
        rng = np.random.default_rng(0)
        x = rng.standard_normal((1024, 32), dtype=np.float32)
        fit(model, (x, rng.integers(0, 8, 1024)), device="gpu:0", optimizer="adam", lr=0.01, epochs=2,
            batch_size=128, verbose=0)
        params = model.numpy_params()
        return hashlib.sha256(b"".join(np.ascontiguousarray(params[k]).tobytes() for k in sorted(params))).hexdigest()

    print(json.dumps([trained(), trained()]))
"""


@pytest.mark.parametrize("name", ["torch", "jax"])
def test_seeded_deterministic_fits_on_the_gpu_are_bitwise_equal(run_python, name):
    """Twice in one process and once more in another: the same parameters to the last bit."""
    needs(name)
    runs = [run_python(DETERMINISTIC_FIT.format(name=name)) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
    digests = [d for run in runs for d in json.loads(run.stdout.splitlines()[-1])]
    assert len(set(digests)) == 1


@pytest.mark.parametrize("precision, tf32", [("highest", "0"), ("high", "1")])
def test_an_onnx_runtime_cuda_session_follows_the_precision(run_python, tmp_path, precision, tf32):
    needs("torch", "onnx")  # exports with torch.onnx
    needs_ort_gpu()
    result = run_python(f"""
        import json, xdevice
        from xdevice import models
        from xdevice.converters import export
        from xdevice.serving import Session
        xdevice.configure(matmul_precision={precision!r})
        export(models.build("mlp", backend="torch", inputs=8, hidden=[8], classes=2), {str(tmp_path / "m.onnx")!r})
        session = Session({str(tmp_path / "m.onnx")!r}, "gpu:0")
        options = session._session.get_provider_options()["CUDAExecutionProvider"]
        print(json.dumps([session.providers[0], options["use_tf32"]]))
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.splitlines()[-1]) == ["CUDAExecutionProvider", tf32]
