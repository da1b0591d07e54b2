"""A tour of the device layer on every installed framework (what `make demo` runs).

1. configure devices and memory once, before any framework starts;
2. list what the machine has, and what each framework sees of it;
3. run a computation in each framework on the best device, with ``xdevice.on``;
4. hand one tensor from framework to framework through DLPack, without copying;
5. build the reference zoo once and check every backend against the numpy reference;
6. hand a model to each framework as its own object, and read it back exactly;
7. export it to ONNX from one framework and import it into every other, checked.
"""

from __future__ import annotations

import sys

import xdevice
from xdevice import models


def main() -> int:
    section("1. configure (before any framework starts)")
    print(xdevice.configure(cpu_devices=2, memory_growth=True))

    section("2. devices: the machine (OS + NVML, no framework started), then each framework")
    for found in xdevice.devices():
        memory = f"{found.memory_total / 2**30:.1f} GiB" if found.memory_total else "memory unknown"
        print(f"  {found}: {found.name or '-'}, {memory}, usable by {', '.join(found.backends)}")
    for name in xdevice.backends():
        seen = xdevice.devices(backend=name)
        print(f"  {name:<10} {xdevice.backend(name).version():<14} sees {', '.join(map(str, seen))}")

    best = "gpu:0" if xdevice.devices(kind="gpu") else "cpu:1"
    section(f"3. a placed computation: `with xdevice.on({best!r}, log=True)`")
    with xdevice.on(best, log=True) as placement:
        for name, result in matmul_in_each_framework():
            print(
                f"  {name:<10} default set to {placement.devices.get(name, '-')!s:<6} "
                f"new arrays landed on {placement.actual.get(name, '-')!s:<6} "
                f"sum(ones(64,64) @ ones(64,64)) = {result:.0f}"
            )

    section("4. one tensor through every framework, zero-copy (same data pointer)")
    names = xdevice.backends()
    x = xdevice.convert(aligned_arange(8), to=names[-1])
    for target in names:
        y = xdevice.convert(x, to=target, copy=False)
        pointer = xdevice.backend(target).data_pointer(y)
        print(
            f"  {xdevice.backend_of(x):>10} -> {target:<10} on {xdevice.device_of(y)} "
            f"pointer {pointer:#x}  values {xdevice.backend(target).to_numpy(y)[:4].tolist()}..."
        )
        x = y

    section("5. the reference zoo: one set of weights, the same answers on every backend")
    report = xdevice.ParityReport()
    for name in models.NAMES:
        report += xdevice.parity(name, grads=True)
    print(report)

    section("6. to_native: the model as each framework's own object, and back")
    model = models.build("cnn", seed=0)
    x = model.example_input(2)
    for name in xdevice.backends():
        native = models.to_native(model, name)
        kind = {"torch": "a torch.nn.Module", "tensorflow": "a tf.Module of tf.Variables"}.get(
            name, "(apply_fn, params)"
        )
        back = models.from_native(native)
        same = all((back.numpy_params()[k] == model.numpy_params()[k]).all() for k in model.params)
        print(f"  {name:<10} {kind:<28} weights back exactly: {same}")

    exporters = [name for name in ("torch", "tensorflow", "jax") if name in xdevice.backends()]
    converted = True
    if exporters:
        from xdevice.converters import export, from_onnx

        source = exporters[0]
        section(f"7. ONNX: export the cnn from {source} (verified in ONNX Runtime), import it everywhere")
        native = model.to(source)
        result = export(native, example_inputs=model.example_input(4))
        print(
            f"  opset {result.opset}, batch axis {result.inputs[0].shape[0]!r}, "
            f"export {result.seconds:.1f} s, worst error in ONNX Runtime "
            f"{result.max_abs_error:.1e}"
        )
        expected = xdevice.backend(source).to_numpy(native(x))
        for name in xdevice.backends():
            imported = from_onnx(result.model, backend=name)
            comparison = xdevice.compare(xdevice.backend(name).to_numpy(imported(x)), expected)
            converted &= comparison.ok
            print(f"  {source} -> onnx -> {name:<10} max abs error {comparison.max_abs:.1e}  ok: {comparison.ok}")
    return 0 if report.ok and converted else 1


def matmul_in_each_framework():
    """64x64 ones @ ones in each loaded framework's own API; every entry is 64."""
    if "torch" in xdevice.backends():
        import torch

        yield "torch", float((torch.ones(64, 64) @ torch.ones(64, 64)).sum())
    if "jax" in xdevice.backends():
        import jax.numpy as jnp

        yield "jax", float((jnp.ones((64, 64)) @ jnp.ones((64, 64))).sum())
    if "tensorflow" in xdevice.backends():
        import tensorflow as tf

        yield "tensorflow", float(tf.reduce_sum(tf.ones((64, 64)) @ tf.ones((64, 64))))


def aligned_arange(n: int):
    """0..n-1 as float32 on a 64-byte boundary (JAX shares only aligned host memory)."""
    import numpy as np

    raw = np.zeros(n * 4 + 64, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64
    out = raw[start : start + n * 4].view(np.float32)
    out[:] = np.arange(n)
    return out


def section(title: str) -> None:
    print(f"\n== {title}")


if __name__ == "__main__":
    import warnings

    warnings.simplefilter("ignore", xdevice.DeviceFallbackWarning)  # the table shows fallbacks
    sys.exit(main())
