"""Hand-offs between frameworks never crash: any NumPy view (offset, strides, dtype,
read-only) converted to any framework and on to any other computes the right values.

TensorFlow takes a misaligned DLPack buffer and then aborts the interpreter in its first
kernel, so the whole property runs in a child process: an abort fails the test with the
child's output instead of ending the run."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("hypothesis")  # the test extra; a bare GPU image may lack it

from xdevice.testing.pytest_plugin import selected_backends

PROPERTY = textwrap.dedent("""
    import sys
    import numpy as np
    from hypothesis import given, settings, HealthCheck, strategies as st
    import xdevice
    from xdevice import _registry

    BACKENDS = sys.argv[1].split(",")
    DTYPES = ["float32", "float64", "int32", "int64", "uint8", "float16"]

    @settings(max_examples=int(sys.argv[2]), deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(source=st.sampled_from(BACKENDS), target=st.sampled_from(BACKENDS),
           dtype=st.sampled_from(DTYPES), offset=st.integers(0, 17), step=st.integers(1, 3),
           rows=st.integers(0, 9), transpose=st.booleans(), readonly=st.booleans())
    def handoff(source, target, dtype, offset, step, rows, transpose, readonly):
        base = np.arange(offset + rows * 6 * step + 8, dtype=dtype)
        view = base[offset:offset + rows * 6 * step:step].reshape(rows, 6)
        if transpose:
            view = view.T
        view.flags.writeable = not readonly
        expected = np.array(view)
        held = xdevice.convert(view, to=source)
        result = xdevice.convert(held, to=target)
        ops = _registry.backend(target).ops
        doubled = ops.to_numpy(ops.add(result, result))  # a kernel reads the shared buffer
        product = ops.to_numpy(ops.matmul(ops.cast(result, "float32"),
                                          ops.cast(ops.transpose(result), "float32")))
        np.testing.assert_array_equal(doubled, expected + expected)
        np.testing.assert_allclose(product, expected.astype("float32") @ expected.T.astype("float32"),
                                   rtol=1e-5)

    handoff()
    print("ok")
""")


def _run(backends: list[str], examples: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PROPERTY, ",".join(backends), str(examples)], capture_output=True, text=True, timeout=600
    )


def test_every_view_of_numpy_data_hands_off_between_every_pair_of_frameworks():
    done = _run(selected_backends(), 300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), (
        f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )


@pytest.mark.skipif("tensorflow" not in selected_backends(), reason="TensorFlow is not installed")
def test_a_misaligned_numpy_view_given_to_tensorflow_computes_the_right_matmul():
    script = textwrap.dedent("""
        import numpy as np, tensorflow as tf, xdevice
        buf = np.arange(1 + 64 * 64, dtype=np.float32)
        x = buf[1:].reshape(64, 64)  # 4 bytes past an aligned start
        assert x.ctypes.data % 64
        t = xdevice.convert(x, to="tensorflow")
        np.testing.assert_allclose(tf.matmul(t, t).numpy(), x @ x, rtol=1e-5)
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", f"exit {done.returncode}\n{done.stderr[-3000:]}"


@pytest.mark.skipif(not {"jax", "tensorflow"} <= set(selected_backends()), reason="needs JAX and TensorFlow installed")
def test_a_column_major_array_jax_took_without_a_copy_reaches_tensorflow_row_major():
    # JAX takes an aligned transposed NumPy view without a copy and keeps its column-major
    # layout; TensorFlow refuses those strides ("Invalid strides array from DLPack"), so the
    # hand-off copies. Hypothesis met this case one run in several; here it runs every time.
    script = textwrap.dedent("""
        import numpy as np, tensorflow as tf, xdevice
        buf = np.arange(64, dtype=np.float32)
        start = (-buf.ctypes.data % 64) // 4  # the first 64-byte aligned element
        x = buf[start : start + 24].reshape(4, 6).T  # aligned, column-major
        assert x.ctypes.data % 64 == 0 and not x.flags.c_contiguous
        held = xdevice.convert(x, to="jax")
        jax_backend = xdevice.backend("jax")
        assert not jax_backend.is_dense(held)  # a consumer that ignores strides (ONNX Runtime) gets
        dense = jax_backend.dense(held)  # a row-major copy
        assert jax_backend.is_dense(dense)
        np.testing.assert_array_equal(np.asarray(dense), x)
        t = xdevice.convert(held, to="tensorflow")
        np.testing.assert_array_equal(tf.add(t, t).numpy(), x + x)
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", f"exit {done.returncode}\n{done.stderr[-3000:]}"
