"""ONNX export: any model in, a checked and verified ONNX model out.

``export`` finds the framework by what the model is: the backend that owns it
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
steps. Inputs and outputs are renamed ``input`` and ``output`` (``input_0``, ``input_1``...
when there are several) and, with ``dynamic_batch``, axis 0 of every input and output is the
symbolic dimension ``batch``. ``onnx.checker`` (full check) and strict shape inference run on
every model. The opset is read back from the model: exporters may write another than the
one asked for, and the one written is reported. With ``verify``, ONNX Runtime runs the model
on the CPU against the source framework's own outputs, on the example inputs and, when the
batch is dynamic, on a second batch size, under ``xdevice._tolerance``'s table; a
disagreement raises ``ConversionError`` naming the output, the worst index and both values.

A model larger than protobuf's 2 GiB limit is written with its tensors in one external data
file next to the ``.onnx`` (``<name>.onnx.data``, in the same folder).

This module imports no framework, and onnx and ONNX Runtime only when it runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from xdevice import _registry
from xdevice._errors import ConversionError, message
from xdevice._tensors import to_host
from xdevice._tolerance import Comparison, compare
from xdevice.backends._common import OUTPUT_NAMES, Inputs, flat_outputs

__all__ = ["export", "verify", "ExportResult", "Verification", "TensorInfo", "BATCH"]

#: the name of the dynamic batch dimension in every exported model
BATCH = "batch"
#: protobuf cannot serialise one message of 2 GiB; larger models keep tensors outside
EXTERNAL_DATA_BYTES = 2**31 - 2**24


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One input or output of an exported model; a dynamic dimension is its name."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str

    def __str__(self) -> str:
        return f"{self.name} {self.dtype}[{', '.join(map(str, self.shape))}]"


@dataclasses.dataclass(frozen=True)
class Verification:
    """One output of the ONNX model compared with the source framework's, at one batch size."""

    output: str
    batch: int
    comparison: Comparison
    scale: float = 1.0  # the absolute allowance was multiplied by it: max |expected| when below 1
    sizes: str = ""  # the other dynamic axes' sizes, when there are some ("seq 31")

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
        where = f"batch {self.batch}" + (f", {self.sizes}" if self.sizes else "")
        return f"{self.output} at {where}: max abs error {self.comparison.max_abs:.2g} ({self.check})"


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
        example_inputs: an array or a tuple of arrays (numpy or the framework's), batch first.
            Zoo models default to ``model.example_input()``; native models need them.
        opset: the ONNX opset to ask the exporter for.
        dynamic_batch: make axis 0 of every input and output the symbolic ``batch``.
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
    name, target, inputs, second = _source(model, backend, example_inputs, dynamic_batch)
    axes = _axes(inputs, dynamic_batch, dynamic_axes)
    second = _resized(second if dynamic_batch else inputs, axes)
    exporter = _OwnGraph(target) if _is_imported(target) else _registry.backend(name)
    _runs_on(exporter, target, inputs)
    start = time.perf_counter()
    proto = exporter.export_onnx(target, inputs, opset, axes)
    seconds = time.perf_counter() - start
    _name_inputs_and_outputs(proto, dynamic_batch, inputs.names, axes)
    producer = _producer(proto)
    source = lambda *xs: exporter.native_outputs(target, inputs.replaced(xs))
    with _staged(proto, path) as location:
        _check(proto, location, producer)
        inputs_info = tuple(_info(v) for v in _graph_inputs(proto))
        _check_batch(inputs_info, dynamic_batch, producer)
        _check_axes(inputs_info, axes, producer)
        checks: list[Verification] = []
        if verify:
            checks += _verify(proto, source, inputs, location, _sizes(inputs, axes))
            if any(axes):
                checks += _verify(proto, source, second, location, _sizes(second, axes))
    return ExportResult(
        model=proto,
        path=Path(path) if path is not None else None,
        backend=name,
        opset=_opset(proto),
        requested_opset=opset,
        producer=producer,
        inputs=inputs_info,
        outputs=tuple(_info(v) for v in proto.graph.output),
        verification=tuple(checks),
        seconds=seconds,
    )


def verify(model: Any, source: Callable[..., Any], inputs: Any) -> list[Verification]:
    """Run ``model`` (a ModelProto) in ONNX Runtime on the CPU and compare every output with
    ``source(*inputs)`` under the tolerance table.

    Args:
        model: the ONNX model.
        source: the reference, called with the numpy ``inputs``; returns an array or a
            tuple/list/dict of them, flattened in the order the model lists its outputs.
        inputs: an array or a tuple of arrays, in the model's input order.

    Raises:
        ConversionError: an output disagrees; the message names the output, the batch, the
            worst index and both values.

    >>> verify(result.model, lambda x: expected, x)  # doctest: +SKIP
    [Verification(output='output', batch=8, comparison=Comparison(max_abs=1e-07, ...))]
    """
    with _staged(model, None) as location:  # a model over 2 GiB reaches ONNX Runtime as a file
        return _verify(model, source, _as_inputs(inputs), location)


# -- what the model is ------------------------------------------------------------------------


def _source(
    model: Any, backend: str | None, example_inputs: Any, dynamic_batch: bool
) -> tuple[str, Any, tuple[Any, ...], tuple[Any, ...]]:
    """``(backend name, native target, example inputs, inputs at a second batch size)``."""
    from xdevice import models

    if isinstance(model, models.Model):
        name = backend or model.backend
        _registry.backend(name)  # an unknown name fails here, with the choices
        target = models.to_native(model, name)
        if example_inputs is None:
            inputs = Inputs.of(model.example_input())
            second = inputs.replaced([model.example_input(_second_batch(len(inputs[0])), seed=1)])
            return name, target, inputs, second
    else:
        if example_inputs is None:
            raise ConversionError(
                message(
                    "A native model needs example_inputs to be exported",
                    expected="an array, a tuple of arrays, or a dict of them (named inputs), batch first",
                    received=f"{type(model).__qualname__} with example_inputs=None",
                    fix="export(model, example_inputs=np.zeros((2, 784), 'float32')) with your input's shape",
                )
            )
        name = model.backend.name if _is_imported(model) else backend or _framework_of(model)
        target = model
    inputs = _as_inputs(example_inputs)
    _check_example(inputs, dynamic_batch)
    return name, target, inputs, _resampled(inputs)


def _is_imported(model: Any) -> bool:
    """An ``ImportedModel`` (only possible once the importer module was loaded)."""
    module = sys.modules.get("xdevice.converters.importer.model")
    return module is not None and isinstance(model, module.ImportedModel)


class _OwnGraph:
    """The exporter of an imported ONNX model: its own graph with its current weights
    (``ImportedModel.to_onnx``), on whichever backend it runs. No framework tracer is
    involved, so a model fine-tuned on any backend exports the same way, and none can bring
    the interpreter down (PyTorch's TorchScript fallback did, on its interpreter's Python)."""

    def __init__(self, model: Any):
        self.model = model
        self.name = model.backend.name

    def export_onnx(self, target: Any, inputs: Inputs, opset: int, axes: list[dict[int, str]]) -> Any:
        return target.to_onnx()

    def native_outputs(self, target: Any, inputs: Inputs) -> list[Any]:
        outputs = target(*inputs)
        return [to_host(y) for y in (outputs if isinstance(outputs, tuple) else (outputs,))]


def _framework_of(model: Any) -> str:
    """The backend that exports a native ``model``: the one that owns it (``_registry.owner``)."""
    found = _registry.owner(model)
    if found is None or found[1] != "model":
        raise ConversionError(
            message(
                "Cannot tell which framework this model belongs to",
                expected="a zoo Model, or a model of a loaded framework",
                received=type(model).__qualname__,
                choices=_registry.accepted("model"),
                fix="pass backend=... to say which framework runs it",
            )
        )
    return found[0].name


def _as_inputs(inputs: Any) -> Inputs:
    """Example inputs as numpy arrays (framework arrays are copied to the host), flat, with
    their names and structure (positional, or a dict: named)."""
    return Inputs.of(inputs, convert=to_host)


def _check_example(inputs: tuple[Any, ...], dynamic_batch: bool) -> None:
    if not inputs:
        raise ConversionError(message("No example inputs", expected="at least one array"))
    if dynamic_batch and (any(x.ndim == 0 for x in inputs) or len({x.shape[0] for x in inputs}) > 1):
        raise ConversionError(
            message(
                "A dynamic batch needs every input to have the same batch size on axis 0",
                received=[x.shape for x in inputs],
                fix="pass dynamic_batch=False for other inputs",
            )
        )


def _runs_on(exporter: Any, target: Any, inputs: Inputs) -> None:
    """The model, called once on its example inputs before any exporter traces it: a wrong
    shape or dtype is reported as that, with the framework's one-line cause, rather than from
    deep inside a tracer."""
    try:
        exporter.native_outputs(target, inputs)
    except Exception as error:
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))  # Keras colours its messages
        lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
        cause = next(
            (line for line in lines if "shape" in line.lower() or "dtype" in line.lower()), lines[0] if lines else ""
        )
        raise ConversionError(
            message(
                f"The model fails on its example inputs, so there is nothing to export ({exporter.name} "
                f"raised {type(error).__name__}: {cause[:300]})",
                expected="example inputs of the shapes and dtypes the model takes, batch first",
                received=", ".join(f"{name}: {x.dtype}{list(x.shape)}" for name, x in zip(inputs.names, inputs)),
                fix="call the model on those inputs yourself to see what it wants, then pass such arrays",
            )
        ) from error


def _axes(inputs: Inputs, dynamic_batch: bool, dynamic_axes: Mapping[Any, Any] | None) -> list[dict[int, str]]:
    """Per input, its symbolic axes: ``{axis: name}`` (``{0: "batch"}`` with a dynamic batch)."""
    axes: list[dict[int, str]] = [{0: BATCH} if dynamic_batch and x.ndim else {} for x in inputs]
    if not dynamic_axes:
        return axes
    usage = (
        'dynamic_axes={1: "seq"} (every input with an axis 1) or {"<input>": {1: "seq"}} '
        f"with the inputs {list(inputs.names)}"
    )
    if not isinstance(dynamic_axes, Mapping):
        raise ConversionError(message("dynamic_axes must be a dict", received=repr(dynamic_axes), fix=usage))
    per_input = all(isinstance(k, str) for k in dynamic_axes)
    for index, (name, x) in enumerate(zip(inputs.names, inputs)):
        wanted = dynamic_axes.get(name, {}) if per_input else dynamic_axes
        if not isinstance(wanted, Mapping):
            raise ConversionError(
                message(f"dynamic_axes[{name!r}] must be a dict of axis to name", received=repr(wanted), fix=usage)
            )
        for axis, symbol in wanted.items():
            if not isinstance(axis, int) or not isinstance(symbol, str) or not symbol.isidentifier():
                raise ConversionError(
                    message("Each dynamic axis is an int mapped to a name", received=f"{axis!r}: {symbol!r}", fix=usage)
                )
            if per_input and not -x.ndim <= axis < x.ndim:
                raise ConversionError(
                    message(
                        f"Input {name!r} has no axis {axis}",
                        expected=f"an axis of its {x.ndim} (shape {x.shape})",
                        received=axis,
                        fix=usage,
                    )
                )
            if -x.ndim <= axis < x.ndim:
                axes[index][axis % x.ndim] = symbol
    unknown = [k for k in dynamic_axes if per_input and k not in inputs.names]
    if unknown:
        raise ConversionError(
            message(
                "dynamic_axes names inputs the model does not take",
                received=unknown,
                choices=list(inputs.names),
                fix=usage,
            )
        )
    sizes: dict[str, set] = {}
    for x, found in zip(inputs, axes):
        for axis, symbol in found.items():
            sizes.setdefault(symbol, set()).add(x.shape[axis])
    clashing = {symbol: sorted(found) for symbol, found in sizes.items() if len(found) > 1}
    if clashing:
        raise ConversionError(
            message(
                "One dynamic axis name stands for one size, but the example inputs differ there",
                received=clashing,
                fix="give those axes different names",
            )
        )
    return axes


def _sizes(inputs: Inputs, axes: list[dict[int, str]]) -> str:
    """The sizes of the dynamic axes but the batch, in words: ``"seq 31"``."""
    found = {
        symbol: x.shape[axis] for x, named in zip(inputs, axes) for axis, symbol in named.items() if symbol != BATCH
    }
    return ", ".join(f"{symbol} {size}" for symbol, size in found.items())


def _resized(inputs: Inputs, axes: list[dict[int, str]]) -> Inputs:
    """``inputs`` with every named axis but the batch at another size, one shorter (a model may
    bound a sequence by its position table) or, from 2, longer; entries are taken cyclically,
    so token ids stay valid. For the second verification."""
    import numpy as np

    sizes = {
        symbol: x.shape[axis] - 1 if x.shape[axis] > 2 else x.shape[axis] + 1
        for x, found in zip(inputs, axes)
        for axis, symbol in found.items()
        if symbol != BATCH
    }
    if not sizes:
        return inputs
    resized = []
    for x, found in zip(inputs, axes):
        for axis, symbol in found.items():
            if symbol != BATCH:
                x = np.take(x, np.arange(sizes[symbol]) % max(x.shape[axis], 1), axis=axis)
        resized.append(x)
    return inputs.replaced(resized)


def _second_batch(batch: int) -> int:
    return batch + 3  # another size, odd, so a batch pinned to the example's cannot pass


def _resampled(inputs: Inputs) -> Inputs:
    """The example's rows, reversed and repeated, as a batch of another size."""
    import numpy as np

    if not inputs[0].ndim:
        return inputs
    batch = inputs[0].shape[0]
    rows = np.arange(_second_batch(batch))[::-1] % max(batch, 1)
    return inputs.replaced(np.take(x, rows, axis=0) for x in inputs)


# -- after the exporter -----------------------------------------------------------------------


def _graph_inputs(proto: Any) -> list[Any]:
    initializers = {t.name for t in proto.graph.initializer}
    return [v for v in proto.graph.input if v.name not in initializers]


def _name_inputs_and_outputs(
    proto: Any, dynamic_batch: bool, input_names: tuple[str, ...], axes: list[dict[int, str]]
) -> None:
    """The example inputs' names (``input``/``input_<i>``, or a dict's keys), the source's
    output names (``output``/``output_<i>``, or a dict's keys, as the backend recorded them),
    and one ``batch`` symbol on axis 0, whatever the exporter chose (``x``/``Identity:0``/
    ``in_0``; ``s77``, ``unk__25``, ``B``). An input the exporter named after an example
    input keeps that name; the others are matched in order."""
    graph = proto.graph
    inputs, outputs = _graph_inputs(proto), list(graph.output)
    if len(inputs) != len(input_names):
        extra = [v.name for v in inputs if v.name.split(":")[0] not in input_names][len(input_names) - len(inputs) :]
        raise ConversionError(
            message(
                f"The exporter turned values of the model into graph inputs: the ONNX model takes {len(inputs)} "
                f"inputs where the model takes {len(input_names)}",
                expected=", ".join(input_names),
                received=[v.name for v in inputs],
                fix=f"make {extra or 'them'} constants or weights of the model (a tensor the model closes over "
                "rather than a variable), or export from another framework",
            )
        )
    by_name = {v.name.split(":")[0]: v.name for v in inputs}
    wanted = {by_name[n]: n for n in input_names if n in by_name}
    unnamed = iter(n for n in input_names if n not in wanted.values())
    for v in inputs:
        if v.name not in wanted:
            wanted[v.name] = next(unnamed)
    recorded = {p.key: p.value for p in proto.metadata_props}.get(OUTPUT_NAMES)
    names = json.loads(recorded) if recorded else [_label("output", i, len(outputs)) for i in range(len(outputs))]
    _drop_metadata(proto, OUTPUT_NAMES)
    for v, name in zip(
        outputs,
        names if len(names) == len(outputs) else [_label("output", i, len(outputs)) for i in range(len(outputs))],
    ):
        if v.name not in wanted:  # a graph input passed straight through keeps its input name
            wanted[v.name] = name
    taken = _all_names(graph) - set(wanted)
    for old in [n for n in taken if n in wanted.values()]:  # an inner value already has the name
        wanted[old] = _fresh(old, taken | set(wanted.values()))
    _rename(graph, wanted)
    _name_axes(proto, axes)
    if not dynamic_batch:
        return
    symbols = {
        v.type.tensor_type.shape.dim[0].dim_param for v in _graph_inputs(proto) if v.type.tensor_type.shape.dim
    } - {""}
    for v in [*_graph_inputs(proto), *graph.output]:  # a size the exporter pinned stays, for _check_batch
        dims = v.type.tensor_type.shape.dim
        if dims and not dims[0].HasField("dim_value"):
            dims[0].dim_param = BATCH
    for v in graph.value_info:
        for d in v.type.tensor_type.shape.dim:
            if d.dim_param in symbols:
                d.dim_param = BATCH


def _name_axes(proto: Any, axes: list[dict[int, str]]) -> None:
    """The requested names on the inputs' symbolic axes, and on every output and inner value
    that carries the exporter's symbol for one (``s77``, ``unk__25``)."""
    graph, renamed = proto.graph, {}
    for v, found in zip(_graph_inputs(proto), axes):
        dims = v.type.tensor_type.shape.dim
        for axis, symbol in found.items():
            if symbol != BATCH and axis < len(dims) and not dims[axis].HasField("dim_value"):
                if dims[axis].dim_param:
                    renamed[dims[axis].dim_param] = symbol
                dims[axis].dim_param = symbol
    for v in [*graph.output, *graph.value_info]:
        for d in v.type.tensor_type.shape.dim:
            if d.dim_param in renamed:
                d.dim_param = renamed[d.dim_param]


def _drop_metadata(proto: Any, key: str) -> None:
    kept = [p for p in proto.metadata_props if p.key != key]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)


def _label(stem: str, index: int, count: int) -> str:
    return stem if count == 1 else f"{stem}_{index}"


def _fresh(name: str, taken: set[str]) -> str:
    n = 1
    while f"{name}_{n}" in taken:
        n += 1
    return f"{name}_{n}"


def _all_names(graph: Any) -> set[str]:
    names = {v.name for v in (*graph.input, *graph.output, *graph.value_info)}
    names |= {t.name for t in graph.initializer}
    for node in graph.node:
        names |= set(node.input) | set(node.output)
        for sub in _subgraphs(node):
            names |= _all_names(sub)
    return names - {""}


def _subgraphs(node: Any) -> list[Any]:
    return [g for a in node.attribute for g in ([a.g] if a.HasField("g") else []) + list(a.graphs)]


def _rename(graph: Any, mapping: dict[str, str]) -> None:
    """Rename values everywhere, subgraphs included (ONNX names are unique across scopes)."""
    for node in graph.node:
        node.input[:] = [mapping.get(n, n) for n in node.input]
        node.output[:] = [mapping.get(n, n) for n in node.output]
        for sub in _subgraphs(node):
            _rename(sub, mapping)
    for value in (*graph.input, *graph.output, *graph.value_info, *graph.initializer):
        value.name = mapping.get(value.name, value.name)


def _check(proto: Any, location: Path | None, producer: str) -> None:
    """onnx's full check, which includes strict shape inference (through the file when it is large)."""
    import onnx

    try:
        onnx.checker.check_model(proto if location is None else str(location), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        raise ConversionError(
            message(
                f"The ONNX model {producer} wrote fails onnx's checks",
                received=str(error).strip()[:800],
                fix="try another opset, or export from another backend",
            )
        ) from error


def _check_batch(inputs: tuple[TensorInfo, ...], dynamic_batch: bool, producer: str) -> None:
    pinned = [t for t in inputs if dynamic_batch and t.shape and t.shape[0] != BATCH]
    if pinned:
        raise ConversionError(
            message(
                f"{producer} fixed the batch size instead of keeping it dynamic",
                expected=f"axis 0 of every input named {BATCH!r}",
                received=[str(t) for t in pinned],
                fix="make the model batch-agnostic (-1 in reshapes, sizes from the input's shape), "
                "or pass dynamic_batch=False",
            )
        )


def _check_axes(inputs: tuple[TensorInfo, ...], axes: list[dict[int, str]], producer: str) -> None:
    pinned = [
        f"{t.name}[{axis}]={t.shape[axis]}"
        for t, found in zip(inputs, axes)
        for axis, symbol in found.items()
        if symbol != BATCH and axis < len(t.shape) and t.shape[axis] != symbol
    ]
    if pinned:
        raise ConversionError(
            message(
                f"{producer} fixed dimensions asked to stay dynamic",
                expected="the names given in dynamic_axes",
                received=pinned,
                fix="compute sizes from the input's shape in the model (no Python int of them), "
                "or leave those axes out of dynamic_axes",
            )
        )


def _producer(proto: Any) -> str:
    """The exporter and its version as the model names them ("pytorch 2.13.0"); tf2onnx appends
    its git hash, which a release build leaves as the word None ("1.17.0 None")."""
    version = " ".join(part for part in proto.producer_version.split() if part != "None")
    return f"{proto.producer_name} {version}".strip()


def _opset(proto: Any) -> int:
    for entry in proto.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    raise ConversionError(
        message(
            "The exported model declares no default-domain opset",
            received=[(e.domain, e.version) for e in proto.opset_import],
        )
    )


def _info(value: Any) -> TensorInfo:
    import onnx

    tensor = value.type.tensor_type
    try:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
    except (KeyError, TypeError, ValueError):
        dtype = onnx.TensorProto.DataType.Name(tensor.elem_type).lower()
    shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim)
    return TensorInfo(value.name, shape, dtype)


# -- writing ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _staged(proto: Any, path: str | os.PathLike | None) -> Iterator[Path | None]:
    """The model on disk when it must be (``path`` given, or too large to pass in memory);
    yields where, or None. A model that fails what runs inside is not left behind."""
    large = proto.ByteSize() >= EXTERNAL_DATA_BYTES
    if path is None and not large:
        yield None
        return
    with contextlib.ExitStack() as stack:
        if path is None:
            path = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "model.onnx"
        written = _write(proto, Path(path), large)
        try:
            yield written[0]
        except BaseException:
            for file in written:
                file.unlink(missing_ok=True)
            raise


def _write(proto: Any, path: Path, large: bool) -> list[Path]:
    import onnx

    path.parent.mkdir(parents=True, exist_ok=True)
    if not large:
        onnx.save_model(proto, str(path))
        return [path]
    data = path.with_name(path.name + ".data")
    data.unlink(missing_ok=True)  # onnx appends to an existing data file
    onnx.save_model(
        proto,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=data.name,
        size_threshold=1024,
    )
    # saving moved the tensors out of the in-memory model: read them back in
    onnx.load_external_data_for_model(proto, str(path.parent))
    return [path, data]


# -- verification -----------------------------------------------------------------------------


def _verify(
    proto: Any, source: Callable[..., Any], inputs: Sequence[Any], location: Path | None, sizes: str = ""
) -> list[Verification]:
    import numpy as np
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    model = str(location) if location is not None else proto.SerializeToString()
    session = onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
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
    checks = []
    for name, a, e in zip(outputs, actual, expected):
        if a.shape != e.shape:
            raise ConversionError(
                message(
                    f"ONNX output {name!r} has another shape than the source's at batch {batch}",
                    expected=str(e.shape),
                    received=a.shape,
                    fix="check that the model is batch-agnostic, or pass dynamic_batch=False",
                )
            )
        scale = _scale(e)
        comparison = compare(a, e, e.dtype.name, scale=scale)
        check = Verification(name, batch, comparison, scale, sizes)
        if not comparison.ok:
            raise ConversionError(
                message(
                    f"ONNX output {name!r} disagrees with the source at batch {batch}: "
                    f"{comparison.actual!r} at index {comparison.worst_index} where the source gives "
                    f"{comparison.expected!r}",
                    expected=f"{check.check} ({e.dtype.name})",
                    received=f"max abs error {comparison.max_abs:.3g}, max rel {comparison.max_rel:.3g}",
                    fix="export with another opset or from another backend, or report the exporter bug",
                )
            )
        checks.append(check)
    return checks


def _scale(expected: Any) -> float:
    """The magnitude an output's absolute allowance is measured against: 1, or ``max |e|``
    when that is smaller (outputs of ~1e-11 would pass an absolute 1e-5 whatever they were)."""
    import numpy as np

    if expected.dtype.kind not in "fc" or not expected.size:
        return 1.0
    finite = np.abs(expected[np.isfinite(expected)])
    peak = float(finite.max()) if finite.size else 1.0
    return min(1.0, max(peak, float(np.finfo(expected.dtype).tiny)))
