"""One float32 matmul precision and one determinism switch for every framework: each precision
read back from the framework's own getter, the project's default without configure(), late
determinism refused with the fix, and seeded deterministic fits equal bit for bit, twice and
across thread counts.

Precision can change while a runtime runs, so it is checked in this process (and put back);
determinism cannot, so those cases run in fresh interpreters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import xdevice
from xdevice import ConfigurationError, _configure, _registry

PRECISIONS = ("highest", "high", "medium")

#: the zoo LSTM of tests/training/test_reproducible.py: its torch fit differs at 1 and 2 threads
LSTM = dict(vocab=8, embedding=64, hidden=8, length=16, classes=3)

#: a program that trains the LSTM and saves its weights to OUT; THREADS is the intra-op thread
#: count asked of the framework, before xdevice.configure(deterministic=...) runs
FIT = """
    import sys
    import numpy as np
    backend, threads, deterministic, fits, out = sys.argv[1:]
    threads, deterministic, fits = int(threads), deterministic == "1", int(fits)
    if backend == "torch":
        import torch; torch.set_num_threads(threads)
    elif backend == "tensorflow":
        import tensorflow as tf; tf.config.threading.set_intra_op_parallelism_threads(threads)
    import xdevice
    from xdevice import models
    if deterministic:
        xdevice.configure(deterministic=True)
    weights = {{}}
    for run in range(fits):
        xdevice.seed(1)  # the model's weights and the data order: no seed= below
        model = models.build("lstm", backend=backend, **{lstm})
        x = model.example_input(128, seed=0)
        history = xdevice.fit(model, (x, x.sum(axis=1) % 3), epochs=1, batch_size=64, lr=0.01, verbose=0)
        weights.update({{f"{{run}}/{{k}}": v for k, v in history.model.numpy_params().items()}})
    np.savez(out, **weights)
"""


def framework_precision(name: str) -> object:
    """What the framework itself says, through its own getters (not xdevice's ``numerics``)."""
    if name == "torch":
        import torch

        return (
            torch.get_float32_matmul_precision(),
            torch.backends.cuda.matmul.fp32_precision,
            torch.backends.cudnn.allow_tf32,  # cuDNN convolutions (this getter raises on mixed APIs)
        )
    if name == "jax":
        import jax

        return jax.config.jax_default_matmul_precision
    if name == "tensorflow":
        import tensorflow as tf

        return tf.config.experimental.tensor_float_32_execution_enabled()
    return xdevice.backend(name).numerics()["matmul_precision"]  # numpy has no switch: always float32


EXPECTED = {
    "torch": {
        "highest": ("highest", "ieee", False),
        "high": ("high", "tf32", True),
        "medium": ("medium", "tf32", True),
    },
    "jax": {"highest": "highest", "high": "high", "medium": "bfloat16"},
    "tensorflow": {"highest": False, "high": True, "medium": True},  # TensorFlow has TF32 or nothing
    "numpy": {"highest": "highest", "high": "highest", "medium": "highest"},
}


@pytest.fixture
def numerics_put_back():
    """configure() is process-wide: the tests after this one get the settings they had."""
    saved = (_configure._process, dict(_configure._applied), dict(_configure._numerics))
    yield
    with _configure._lock:
        _configure._process = saved[0]
        _configure._applied.clear()
        _configure._applied.update(saved[1])
        for loaded in _registry.loaded_backends():
            loaded.configure_numerics(_configure.current_config())
        _configure._numerics.clear()
        _configure._numerics.update(saved[2])


@pytest.mark.parametrize("precision", PRECISIONS)
def test_each_precision_reads_back_from_the_frameworks_own_getter(backend, precision, numerics_put_back):
    report = xdevice.configure(matmul_precision=precision, backends=[backend.name])
    assert framework_precision(backend.name) == EXPECTED[backend.name][precision]
    assert xdevice.current_config().matmul_precision == precision == _configure.matmul_precision()
    assert report.how(backend.name, "matmul_precision") == (
        "skipped" if backend.name == "numpy" and precision != "highest" else "applied"
    )


def test_without_configure_every_backend_runs_at_the_project_default(backend):
    assert xdevice.current_config().matmul_precision == "highest"
    assert framework_precision(backend.name) == EXPECTED[backend.name]["highest"]
    assert backend.numerics()["matmul_precision"] in ("highest", "ieee")


def test_a_precision_set_before_the_import_applies_as_the_program_imports_the_framework(run_python):
    result = run_python("""
        import xdevice
        report = xdevice.configure(matmul_precision="medium")
        import torch
        print(report.how("torch", "matmul_precision"), torch.get_float32_matmul_precision())
    """)
    assert result.stdout.split() == ["pending", "medium"], result.stderr


def test_a_precision_not_ours_is_refused_with_the_choices_and_the_name_meant():
    with pytest.raises(ConfigurationError) as error:
        xdevice.configure(matmul_precision="tf32")
    assert "Valid choices: highest, high, medium" in str(error.value)
    assert "Did you mean 'high'?" in str(error.value)
    with pytest.raises(ConfigurationError, match="deterministic must be True or False"):
        xdevice.configure(deterministic="yes")


def test_determinism_after_the_runtime_started_is_refused_with_the_fix(started_runtime, run_python):
    name, start = started_runtime
    result = run_python(f"""
        import xdevice
        {start}
        try:
            xdevice.configure(deterministic=True)
        except xdevice.ConfigurationError as error:
            print(error)
        print(xdevice.current_config().deterministic)
    """)
    title = xdevice.backend(name).title
    assert f"{title} already started, so deterministic=True can no longer take effect" in result.stdout, result.stderr
    assert "Fix: call xdevice.configure(deterministic=True) at the top of your program" in result.stdout
    assert result.stdout.split()[-1] == "False"  # nothing changed


def test_determinism_after_torch_started_cuda_is_refused_before_anything_changes(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # as after the first CUDA tensor
    with pytest.raises(ConfigurationError) as error:
        xdevice.configure(deterministic=True, backends=["torch"])
    assert "PyTorch already started" in str(error.value) and "CUBLAS_WORKSPACE_CONFIG" in str(error.value)
    assert not xdevice.current_config().deterministic and not torch.are_deterministic_algorithms_enabled()


def test_determinism_once_on_cannot_be_turned_off(run_python):
    result = run_python("""
        import xdevice
        xdevice.configure(deterministic=True, backends=["numpy"])
        try:
            xdevice.configure(deterministic=False)
        except xdevice.ConfigurationError as error:
            print(error)
    """)
    assert "deterministic=True cannot be turned off in a running process" in result.stdout, result.stderr


@pytest.fixture(scope="module")
def lstm_fits(tmp_path_factory, request):
    """``fit(backend, threads, deterministic, fits)``: the weights of the LSTM trained ``fits`` times
    in one fresh interpreter, ``{"0/name": array, ...}``; each combination runs once per module."""
    done: dict[tuple, dict[str, np.ndarray]] = {}
    folder = tmp_path_factory.mktemp("fits")
    program = folder / "fit.py"
    program.write_text(textwrap.dedent(FIT.format(lstm=LSTM)))

    def fit(backend: str, threads: int, deterministic: bool, fits: int = 1) -> dict[str, np.ndarray]:
        key = (backend, threads, deterministic, fits)
        if key not in done:
            out = folder / f"{'-'.join(map(str, key))}.npz"
            arguments = [backend, threads, int(deterministic), fits, out]
            command = [sys.executable, str(program), *map(str, arguments)]
            env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
            result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
            assert result.returncode == 0, result.stderr
            with np.load(out) as saved:
                done[key] = dict(saved)
        return done[key]

    return fit


def test_two_seeded_deterministic_fits_are_bitwise_equal(backend, lstm_fits):
    weights = lstm_fits(backend.name, threads=2, deterministic=True, fits=2)
    names = [key[2:] for key in weights if key.startswith("0/")]
    assert names
    for name in names:
        np.testing.assert_array_equal(weights[f"1/{name}"], weights[f"0/{name}"], err_msg=name)


@pytest.mark.parametrize("name", ["torch", "tensorflow"])  # JAX's XLA CPU is thread-count invariant already
def test_a_deterministic_fit_asked_for_two_threads_equals_a_one_thread_fit_bitwise(name, lstm_fits):
    """Without deterministic=True a 2-thread fit differs from a 1-thread one (about 1e-7 of this
    LSTM's weights: the BLAS and Eigen split the long sums of its weight gradients by thread
    count). Both sides run deterministic=True: TensorFlow's deterministic kernels sum in another
    order than its default ones at any thread count."""
    if name not in xdevice.backends():
        pytest.skip(f"{name} is not installed")
    asked_for_two = lstm_fits(name, threads=2, deterministic=True, fits=2)
    one_thread = lstm_fits(name, threads=1, deterministic=True)
    assert set(one_thread) <= set(asked_for_two)
    for key, value in one_thread.items():
        np.testing.assert_array_equal(asked_for_two[key], value, err_msg=key)


def test_the_numerics_report_says_what_was_done_in_each_framework(run_python):
    result = run_python("""
        import json, xdevice
        report = xdevice.configure(matmul_precision="high", deterministic=True, backends=["numpy", "torch"])
        print(json.dumps({f"{a.backend} {a.setting}": [a.how, a.detail] for a in report}))
    """)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert rows["torch matmul_precision"] == [
        "applied",
        "torch.set_float32_matmul_precision('high'); cuDNN convolutions in TF32",
    ]
    assert rows["torch deterministic"][0] == "applied"
    assert "use_deterministic_algorithms(True), CUBLAS_WORKSPACE_CONFIG=:4096:8" in rows["torch deterministic"][1]
    assert "set_num_threads(1)" in rows["torch deterministic"][1]
    assert rows["numpy matmul_precision"][0] == "skipped"


def test_parity_states_the_precision_it_ran_under_for_each_backend(backend):
    report = xdevice.parity("mlp", backends=[backend.name], grads=False)
    assert report.precision == "highest" and not report.precision_note
    assert report.precisions == {backend.name: backend.numerics()["matmul_precision"]}
    assert f"matmul precision highest ({backend.name} " in str(report)
    assert json.loads(report.to_json())["matmul_precision"] == "highest"


def test_parity_at_float32_tolerance_under_tf32_runs_under_highest_and_says_so(backend, numerics_put_back):
    xdevice.configure(matmul_precision="high")
    report = xdevice.parity("mlp", backends=[backend.name], grads=False)
    assert report.ok and report.precision == "highest"
    assert "switched from 'high' to 'highest' for this check" in report.precision_note
    assert report.precisions[backend.name] in ("highest", "ieee")  # what the framework said during the check
    assert xdevice.current_config().matmul_precision == "high"  # and put back after it
    assert framework_precision(backend.name) == EXPECTED[backend.name]["high"]


def test_parity_at_a_half_precision_tolerance_keeps_the_configured_precision(numerics_put_back):
    xdevice.configure(matmul_precision="medium")
    report = xdevice.parity("mlp", backends=["numpy"], dtype="float16", grads=False)
    assert report.precision == "medium" and not report.precision_note


def test_the_doctor_prints_each_frameworks_precision_and_each_gpus_compute_capability():
    from xdevice._doctor import numerics_findings

    numerics = {
        "torch": {"matmul_precision": "highest", "deterministic": True, "cudnn_conv": "ieee"},
        "jax": {"matmul_precision": "high", "deterministic": False},
    }
    gpus = [xdevice.Device("gpu", 0, name="NVIDIA A100", compute_capability=(8, 0)), xdevice.Device("gpu", 1)]
    texts = [finding.text for finding in numerics_findings(numerics, gpus)]
    assert texts == [
        "torch: matmul precision highest, deterministic on (cudnn_conv ieee)",
        "jax: matmul precision high, deterministic off",
        "gpu:0 NVIDIA A100: compute capability 8.0: TF32 available, so 'high' and 'medium' change float32 products",
        "gpu:1: compute capability unknown",
    ]
