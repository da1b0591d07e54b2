"""ONNX export: any model in, a checked and verified ONNX model out (``export``, ``ExportResult``).

``export`` finds the framework by what the model is (``detect.py``): the backend that owns it
(``_registry.owner``; only frameworks already imported are asked), so nothing is imported to
find out:

| model | exported by |
|---|---|
| a zoo :class:`~xdevice.models.Model` | its backend, or ``backend=`` (moved there first) |
| a ``torch.nn.Module`` | torch (``torch.export`` + ``torch.onnx``) |
| a Keras model, a ``tf.Module``, a ``tf.function`` | tensorflow (tf2onnx) |
| an ``(apply_fn, params)`` pair of JAX or numpy arrays | jax (jax2onnx); a zoo ``apply_fn``: its backend |
| a plain function | ``backend=``, else jax |

The backend's exporter writes a ModelProto; every result then goes through the same
steps, one module each. Inputs and outputs are renamed ``input`` and ``output`` (``input_0``,
``input_1``... when there are several) and, with ``dynamic_batch``, axis 0 of every input and
output is the symbolic dimension ``batch`` (``naming.py``; ``axes.py`` reads ``dynamic_axes``).
``onnx.checker`` (full check) and strict shape inference run on every model, and the opset
is read back from it: exporters may write another than the one asked for, and the one
written is reported (``checks.py``). With ``verify``, ONNX Runtime runs the model on the CPU
against the source framework's own outputs, on the example inputs and, when the batch is
dynamic, on a second batch size, under ``xdevice._tolerance``'s table; a disagreement raises
``ConversionError`` naming the output, the worst index and both values (``verify.py``). The
source computes its outputs on the device its weights live on (a torch module on CUDA there,
JAX and TensorFlow weights where they were placed, the CPU for a model without any), inside
that device's scope, and each check says which device it was.

A model larger than protobuf's 2 GiB limit is written with its tensors in one external data
file next to the ``.onnx`` (``<name>.onnx.data``, in the same folder; ``external_data.py``).

This module imports no framework, and onnx and ONNX Runtime only when it runs.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from xdevice import _registry
from xdevice.converters.axes import BATCH, axis_sizes, resampled, resized, symbolic_axes
from xdevice.converters.checks import (
    TensorInfo,
    check_axes,
    check_batch,
    check_model,
    opset_of,
    producer_of,
    tensor_info,
)
from xdevice.converters.detect import OwnGraph, is_imported, runs_on, source_of
from xdevice.converters.external_data import staged
from xdevice.converters.naming import graph_inputs, name_inputs_and_outputs
from xdevice.converters.verify import Verification, run_and_compare

__all__ = ["export", "ExportResult"]


@dataclasses.dataclass(frozen=True)
class ExportResult:
    """What ``export`` made, and how it checked it.

    Attributes:
        model: the ``onnx.ModelProto`` (tensors in memory, even when written externally).
        path: where it was written, or None.
        backend: the framework that exported it.
        opset: the default-domain opset the model declares (read back, not the one asked for).
        requested_opset: the opset that was asked for.
        producer: the exporter that wrote it, as the model names it ("pytorch 2.13.0").
        inputs, outputs: names, shapes (``"batch"`` where dynamic) and dtypes.
        verification: one comparison per output and batch size (empty with ``verify=False``).
        seconds: time the framework's exporter took.
        batching: how the batch axis came to be, when export added it: a model that takes one
            example, exported batched through ``jax.vmap`` (see ``export``); "" otherwise.
    """

    model: Any
    path: Path | None
    backend: str
    opset: int
    requested_opset: int
    producer: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    verification: tuple[Verification, ...]
    seconds: float
    batching: str = ""

    @property
    def dynamic_batch(self) -> bool:
        return any(BATCH in t.shape for t in self.inputs)

    @property
    def max_abs_error(self) -> float | None:
        """The largest absolute error over every verified output, or None if not verified."""
        return max((v.comparison.max_abs for v in self.verification), default=None)

    def __str__(self) -> str:
        asked = "" if self.opset == self.requested_opset else f" (asked for {self.requested_opset})"
        lines = [
            f"exported from {self.backend} by {self.producer} in {self.seconds:.2f} s",
            f"opset     {self.opset}{asked}",
        ]
        lines += [f"batch     {self.batching}"] if self.batching else []
        lines += [f"input     {t}" for t in self.inputs]
        lines += [f"output    {t}" for t in self.outputs]
        lines += [f"verified  {v}" for v in self.verification] or ["verified  no (verify=False)"]
        if self.path is not None:
            lines.append(f"written   {self.path}")
        return "\n".join(lines)


def export(
    model: Any,
    path: str | os.PathLike | None = None,
    *,
    backend: str | None = None,
    example_inputs: Any = None,
    opset: int = 18,
    dynamic_batch: bool = True,
    dynamic_axes: Mapping[Any, Any] | None = None,
    verify: bool = True,
) -> ExportResult:
    """``model`` as an ONNX model: exported, checked, and verified against its source.

    Args:
        model: a zoo ``Model`` or a native model (see the module docstring).
        path: where to write the ``.onnx`` (folders are created); None keeps it in memory.
        backend: the framework to export from: required for a plain function of another
            framework than JAX; for a zoo model, moves it there first.
        example_inputs: an array or a tuple of arrays (numpy or the framework's), batch first,
            or a dict of them (named inputs). Zoo models default to ``model.example_input()``;
            a text model's dict has ``x`` under ``"input"`` (or its first other key) and any
            inputs its definition names besides (``{"input_ids": ids, "attention_mask":
            mask}``); the graph inputs are named by the keys. Native models need them.
        opset: the ONNX opset to ask the exporter for.
        dynamic_batch: make axis 0 of every input and output the symbolic ``batch``. A JAX
            model that takes one example (an equinox module called on a ``(12,)`` vector, to be
            batched with ``jax.vmap``) gets a batch axis in front, added by ``jax.vmap``: the
            ONNX input is ``(batch, 12)``, said in a warning and in ``batching``. False
            exports the model exactly as called, every axis its example's size.
        dynamic_axes: more symbolic dimensions, by name: ``{1: "seq"}`` on every input with
            an axis 1, or per input ``{"tokens": {1: "seq"}}``; one name is one size across
            inputs. Verification then also runs with those axes at another size.
        verify: compare ONNX Runtime's outputs with the framework's (see the module docstring).

    Raises:
        ConversionError: the exporter failed, the model fails onnx's checks, or its outputs
            disagree with the source's.

    >>> from xdevice import models
    >>> result = export(models.build("mlp", backend="torch"), "mlp.onnx")  # doctest: +SKIP
    >>> result.opset, result.inputs[0].shape  # doctest: +SKIP
    (18, ('batch', 784))
    """
    from xdevice import models

    name, target, inputs, second = source_of(model, backend, example_inputs, dynamic_batch)
    exporter = OwnGraph(target) if is_imported(target) else _registry.backend(name)
    runs_on(exporter, target, inputs)
    where = _reference_device(exporter, target)
    batching = ""
    if dynamic_batch and not isinstance(model, models.Model):  # a zoo model takes a batch
        batched = exporter.one_example(target, inputs)
        if batched is not None:
            batching = _said_batched(inputs)
            target, inputs = batched, inputs.replaced([x[None] for x in inputs])
            second = resampled(inputs)
    axes = symbolic_axes(inputs, dynamic_batch, dynamic_axes)
    second = resized(second if dynamic_batch else inputs, axes)
    start = time.perf_counter()
    proto = exporter.export_onnx(target, inputs, opset, axes)
    seconds = time.perf_counter() - start
    name_inputs_and_outputs(proto, dynamic_batch, inputs.names, axes)
    producer = producer_of(proto)
    source = lambda *xs: exporter.native_outputs(target, inputs.replaced(xs))
    with staged(proto, path) as location:
        check_model(proto, location, producer)
        inputs_info = tuple(tensor_info(v) for v in graph_inputs(proto))
        check_batch(inputs_info, dynamic_batch, producer)
        check_axes(inputs_info, axes, producer)
        checks: list[Verification] = []
        if verify:
            checks += run_and_compare(proto, source, inputs, location, axis_sizes(inputs, axes), where, dynamic_batch)
            if any(axes):
                checks += run_and_compare(
                    proto, source, second, location, axis_sizes(second, axes), where, dynamic_batch
                )
    return ExportResult(
        model=proto,
        path=Path(path) if path is not None else None,
        backend=name,
        opset=opset_of(proto),
        requested_opset=opset,
        producer=producer,
        inputs=inputs_info,
        outputs=tuple(tensor_info(v) for v in proto.graph.output),
        verification=tuple(checks),
        seconds=seconds,
        batching=batching,
    )


def _said_batched(inputs: Any) -> str:
    """Say, once, that a model taking one example is exported with a batch axis added in front
    (``jax.vmap``), and how to export it as called; the words go into ``ExportResult.batching``."""
    import warnings

    shapes = ", ".join(str(tuple(x.shape)) for x in inputs)
    batched = ", ".join(str(("batch", *x.shape)).replace("'", "") for x in inputs)
    said = (
        f"the model takes one example (input {shapes}), not a batch: exported batched through "
        f"jax.vmap, ONNX input {batched}; export(..., dynamic_batch=False) exports it as called"
    )
    warnings.warn(f"xdevice.export: {said}", UserWarning, stacklevel=3)
    return said


def _reference_device(exporter: Any, target: Any) -> Any:
    """The device ``exporter.native_outputs`` computes ``target``'s reference outputs on: where
    its weights live (``Backend.reference_device``; cpu:0 unless the backend says)."""
    return exporter.reference_device(target)
