"""onnx's checks on an exported model, and what the model declares, read back (``TensorInfo``).

``onnx.checker`` (full check) and strict shape inference run on every model; the batch and
the axes asked to stay symbolic are checked to be so. The opset is read back from the model:
exporters may write another than the one asked for, and the one written is reported.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from xdevice._errors import ConversionError, message
from xdevice.converters.axes import BATCH

__all__ = ["TensorInfo", "tensor_info", "check_model", "check_batch", "check_axes", "producer_of", "opset_of"]


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One input or output of an exported model; a dynamic dimension is its name."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str

    def __str__(self) -> str:
        return f"{self.name} {self.dtype}[{', '.join(map(str, self.shape))}]"


def tensor_info(value: Any) -> TensorInfo:
    import onnx

    tensor = value.type.tensor_type
    try:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
    except (KeyError, TypeError, ValueError):
        dtype = onnx.TensorProto.DataType.Name(tensor.elem_type).lower()
    shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim)
    return TensorInfo(value.name, shape, dtype)


def check_model(proto: Any, location: Path | None, producer: str) -> None:
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


def check_batch(inputs: tuple[TensorInfo, ...], dynamic_batch: bool, producer: str) -> None:
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


def check_axes(inputs: tuple[TensorInfo, ...], axes: list[dict[int, str]], producer: str) -> None:
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


def producer_of(proto: Any) -> str:
    """The exporter and its version as the model names them ("pytorch 2.13.0"); tf2onnx appends
    its git hash, which a release build leaves as the word None ("1.17.0 None")."""
    version = " ".join(part for part in proto.producer_version.split() if part != "None")
    return f"{proto.producer_name} {version}".strip()


def opset_of(proto: Any) -> int:
    for entry in proto.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    raise ConversionError(
        message(
            "The exported model declares no default-domain opset",
            received=[(e.domain, e.version) for e in proto.opset_import],
        )
    )
