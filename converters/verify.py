"""Verification in ONNX Runtime: an ONNX model's outputs against its source's, under the tolerance table.

ONNX Runtime runs the model on the CPU; every output is compared with the source framework's
under ``xdevice._tolerance``'s table, and a disagreement raises ``ConversionError`` naming the
output, the worst index and both values.

The session is built by ``xdevice._onnxruntime`` under ``xdevice.configure``'s settings, as
every session xdevice creates. Each check states the precision it ran under: ONNX Runtime's
CPU provider computes float32 in IEEE float32 whatever the setting, and the source ran under
the process-wide float32 matmul precision (``Verification.precision``), which is below IEEE
float32 on a GPU unless it is ``"highest"``, on the device its weights live on
(``Verification.device``; ``export`` computes the source there).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from xdevice import _configure, _onnxruntime, _quiet
from xdevice._device import Device
from xdevice._device import device as as_device
from xdevice._errors import ConversionError, message
from xdevice._tolerance import Comparison, compare
from xdevice.backends._model_io import flat_outputs
from xdevice.converters.detect import as_inputs
from xdevice.converters.external_data import staged

__all__ = ["verify", "Verification", "run_and_compare"]


@dataclasses.dataclass(frozen=True)
class Verification:
    """One output of the ONNX model compared with the source framework's, at one batch size
    (or, for a model exported without a batch axis, at the example's input shapes)."""

    output: str
    batch: int
    comparison: Comparison
    scale: float = 1.0  # the absolute allowance was multiplied by it: max |expected| when below 1
    sizes: str = ""  # the other dynamic axes' sizes, when there are some ("seq 31")
    precision: str = "highest"  # the float32 matmul precision the source ran under (ORT's CPU: always IEEE)
    device: str | None = None  # where the source computed ("cpu:0", "gpu:0"); None: not said
    shapes: tuple[tuple[int, ...], ...] | None = None  # the inputs' shapes where axis 0 is no batch

    @property
    def check(self) -> str:
        """Which check was used, in words."""
        c = self.comparison
        if self.scale == 1.0:
            return f"|onnx - source| <= {c.atol:g} + {c.rtol:g} * |source|"
        return (
            f"|onnx - source| <= {c.atol:.3g} + {c.rtol:g} * |source| (atol scaled to the output's "
            f"magnitude, {self.scale:.3g})"
        )

    def __str__(self) -> str:
        where = _at(self.batch, self.shapes) + (f", {self.sizes}" if self.sizes else "")
        source = f"source on {self.device}, " if self.device else ""
        return (
            f"{self.output} {where}: max abs error {self.comparison.max_abs:.2g} ({self.check}; "
            f"{source}matmul precision {self.precision})"
        )


def verify(model: Any, source: Callable[..., Any], inputs: Any, device: Any = None) -> list[Verification]:
    """Run ``model`` (a ModelProto) in ONNX Runtime on the CPU and compare every output with
    ``source(*inputs)`` under the tolerance table.

    Args:
        model: the ONNX model.
        source: the reference, called with the numpy ``inputs``; returns an array or a
            tuple/list/dict of them, flattened in the order the model lists its outputs.
        inputs: an array or a tuple of arrays, in the model's input order.
        device: where ``source`` computes (any device spelling), said in each check; None:
            not said.

    Raises:
        ConversionError: an output disagrees; the message names the output, the batch, the
            worst index and both values.

    >>> verify(result.model, lambda x: expected, x)  # doctest: +SKIP
    [Verification(output='output', batch=8, comparison=Comparison(max_abs=1e-07, ...))]
    """
    with staged(model, None) as location:  # a model over 2 GiB reaches ONNX Runtime as a file
        return run_and_compare(model, source, as_inputs(inputs), location, device=device)


def run_and_compare(
    proto: Any,
    source: Callable[..., Any],
    inputs: Sequence[Any],
    location: Path | None,
    sizes: str = "",
    device: Any = None,
    batched: bool = True,
) -> list[Verification]:
    """``verify``'s work on flat numpy ``inputs``, the model staged at ``location`` (None: in
    memory); ``sizes`` names the other dynamic axes' sizes, ``device`` where ``source`` computes;
    ``batched`` is False for a model whose axis 0 is no batch (checks then name input shapes)."""
    import numpy as np
    import onnxruntime

    cpu = Device("cpu", 0)
    available = onnxruntime.get_available_providers()
    options = _onnxruntime.session_options(cpu, available=available, ort=onnxruntime)
    options.log_severity_level = 2 if _quiet.verbose() else 4  # a failure is raised below, not logged
    model = str(location) if location is not None else proto.SerializeToString()
    providers = _onnxruntime.configured_provider_options(available, cpu)
    session = onnxruntime.InferenceSession(model, options, providers=providers)
    precision = _configure.matmul_precision()
    where = str(as_device(device)) if device is not None else None
    names = [i.name for i in session.get_inputs()]
    if len(names) != len(inputs):
        raise ConversionError(
            message(
                "The ONNX model takes another number of inputs than given",
                expected=f"{len(names)} ({', '.join(names)})",
                received=len(inputs),
            )
        )
    given = getattr(inputs, "names", ())
    feeds = dict(zip(given, inputs)) if set(given) == set(names) else dict(zip(names, inputs))
    try:
        actual = session.run(None, feeds)
    except Exception as error:
        raise ConversionError(
            message(
                f"ONNX Runtime failed to run the exported model on inputs of shapes {[x.shape for x in inputs]}",
                received=str(error).strip().splitlines()[0][-400:],
                fix="the exporter fixed a size that depends on these dimensions: make the model shape-agnostic "
                "there, or keep those dimensions static",
            )
        ) from error
    expected = [np.asarray(y) for y in flat_outputs(source(*inputs))]
    outputs = [o.name for o in session.get_outputs()]
    if len(actual) != len(expected):
        raise ConversionError(
            message(
                "The ONNX model has another number of outputs than its source",
                expected=str(len(expected)),
                received=f"{len(actual)}: {outputs}",
            )
        )
    batch = int(inputs[0].shape[0]) if np.ndim(inputs[0]) else 1
    shapes = None if batched else tuple(tuple(int(d) for d in np.shape(x)) for x in inputs)
    at = _at(batch, shapes)
    checks = []
    for name, a, e in zip(outputs, actual, expected):
        if a.shape != e.shape:
            raise ConversionError(
                message(
                    f"ONNX output {name!r} has another shape than the source's {at}",
                    expected=str(e.shape),
                    received=a.shape,
                    fix="check that the model is batch-agnostic, or pass dynamic_batch=False",
                )
            )
        scale = _scale(e)
        comparison = compare(a, e, e.dtype.name, scale=scale)
        check = Verification(name, batch, comparison, scale, sizes, precision, where, shapes)
        if not comparison.ok:
            raise ConversionError(
                message(
                    f"ONNX output {name!r} disagrees with the source {at}: "
                    f"{comparison.actual!r} at index {comparison.worst_index} where the source gives "
                    f"{comparison.expected!r}",
                    expected=f"{check.check} ({e.dtype.name}, the source at matmul precision {precision!r})",
                    received=f"max abs error {comparison.max_abs:.3g}, max rel {comparison.max_rel:.3g}",
                    fix="export with another opset or from another backend, or report the exporter bug"
                    if precision == "highest"
                    else "verify under xdevice.configure(matmul_precision='highest'): the source ran in "
                    f"{precision!r} (TF32 or bfloat16 on a GPU), ONNX Runtime on the CPU in IEEE float32",
                )
            )
        checks.append(check)
    return checks


def _at(batch: int, shapes: tuple[tuple[int, ...], ...] | None) -> str:
    """Where a check ran, in words: ``"at batch 8"``, or ``"with input shape (12,)"`` for a
    model whose axis 0 is no batch."""
    if shapes is None:
        return f"at batch {batch}"
    return f"with input shape{'s' if len(shapes) > 1 else ''} " + ", ".join(str(s) for s in shapes)


def _scale(expected: Any) -> float:
    """The magnitude an output's absolute allowance is measured against: 1, or ``max |e|``
    when that is smaller (outputs of ~1e-11 would pass an absolute 1e-5 whatever they were)."""
    import numpy as np

    if expected.dtype.kind not in "fc" or not expected.size:
        return 1.0
    finite = np.abs(expected[np.isfinite(expected)])
    peak = float(finite.max()) if finite.size else 1.0
    return min(1.0, max(peak, float(np.finfo(expected.dtype).tiny)))
