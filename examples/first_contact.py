"""First contact with real data: scikit-learn's handwritten digits, trained on every installed framework.

What a newcomer does on the first day, end to end, on a public data set that a package
installs (``pip install 'xdevice[data]'`` brings scikit-learn):

1. load the UCI digits (1,797 images of 8x8 pixels, given as 64 float64 features from 0 to
   16; 10 classes) and split them with ``train_test_split`` (stratified, a quarter held out);
2. build the zoo ``mlp`` for them, ``inputs=64`` and one hidden layer of 128 (its defaults are
   MNIST's 784-512-512-10), on each installed backend from one seed; train it with
   ``xdevice.fit`` (Adam) for a few epochs and report the held-out accuracy per backend: same
   weights, same batches, so the losses and accuracies agree;
3. hand the test split to each framework with ``xdevice.convert`` (a view of NumPy memory
   where the framework can take it, a copy where it cannot) and check that each trained
   model predicts the same classes from its own framework's arrays as from NumPy's;
4. export one trained model to ONNX (verified against its source by ``export`` itself) and
   check that ONNX Runtime gives the same logits and the same accuracy.

Exits 0 when every check holds, 1 when one fails (the line saying which starts with FAILED):

    .venv/bin/python examples/first_contact.py [--epochs 4] [--backends torch jax]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import xdevice
from xdevice import models
from xdevice.converters import export

EXPORTERS = ("torch", "jax", "tensorflow")  # the backends with an ONNX exporter, in order of preference


def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The digits, scaled to [0, 1] and split 3:1; float32, the dtype the frameworks train in
    (scikit-learn's float64 would be refused by the zoo with ``x.astype('float32')`` as the fix)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    return train_test_split(x, data.target, test_size=0.25, stratify=data.target, random_state=0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    installed = xdevice.backends()
    parser.add_argument(
        "--backends", nargs="+", default=installed, choices=installed, help="default: every installed one"
    )
    args = parser.parse_args()
    failures: list[str] = []

    x_train, x_test, y_train, y_test = digits()
    print(f"1. digits: {len(x_train)} training rows, {len(x_test)} test rows, {x_train.shape[1]} features, 10 classes")

    print(f"2. the zoo mlp (inputs=64, hidden=[128]) trained with xdevice.fit, {args.epochs} epochs, on each backend")
    trained, accuracy = {}, {}
    for name in args.backends:
        model = models.build("mlp", inputs=64, hidden=[128], backend=name, seed=0)
        history = xdevice.fit(model, (x_train, y_train), lr=5e-3, epochs=args.epochs, batch_size=32, verbose=0)
        predicted = model.ops.to_numpy(model(x_test)).argmax(axis=1)
        trained[name], accuracy[name] = model, float((predicted == y_test).mean())
        print(
            f"  {name:<11} loss {history.steps[0]:.4f} (first step) -> {history.last('loss'):.4f} (last epoch), "
            f"test accuracy {accuracy[name]:.2%}"
        )
    spread = max(accuracy.values()) - min(accuracy.values())
    if spread > 1 / len(y_test):  # one borderline row may flip between frameworks' float32 sums
        failures.append(f"the backends disagree on test accuracy by {spread:.2%}")
    if min(accuracy.values()) < 0.9:
        failures.append(f"a test accuracy below 90% ({min(accuracy, key=accuracy.get)})")

    print("3. the test split handed to each framework with xdevice.convert")
    for name, model in trained.items():
        theirs = xdevice.convert(x_test, to=name)
        same = model.ops.to_numpy(model(theirs)).argmax(axis=1) == model.ops.to_numpy(model(x_test)).argmax(axis=1)
        print(f"  {name:<11} {type(theirs).__module__}.{type(theirs).__qualname__}: same classes on {same.mean():.0%}")
        if not same.all():
            failures.append(f"{name} predicts differently from its own arrays")

    source = next((name for name in EXPORTERS if name in trained), None)
    if source is None:
        print("4. no backend with an ONNX exporter among those trained: nothing to export")
    else:
        import onnxruntime

        print(f"4. the {source} model exported to ONNX and run in ONNX Runtime")
        result = export(trained[source])  # verified against the source; kept in memory
        session = onnxruntime.InferenceSession(result.model.SerializeToString(), providers=["CPUExecutionProvider"])
        served = session.run(None, {result.inputs[0].name: x_test})[0]
        own = trained[source].ops.to_numpy(trained[source](x_test))
        error, served_accuracy = float(np.abs(served - own).max()), float((served.argmax(1) == y_test).mean())
        print(f"  opset {result.opset}: max abs error {error:.1e}, test accuracy {served_accuracy:.2%}")
        if error > 1e-4 or served_accuracy != accuracy[source]:
            failures.append(f"ONNX Runtime disagrees with {source} (max abs error {error:.1e})")

    print("OK" if not failures else "FAILED: " + "; ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
