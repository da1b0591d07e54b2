"""Reading ONNX models safely: size limits, corrupt files, and external data kept in its folder.

ONNX stores large tensors as external data files named by a relative path inside the
model. A path that climbs out of the model's folder (``../``), is absolute, or goes
through a link outside it is refused before any byte is read: a model is data, and must
not make this process read arbitrary files. Nothing is ever unpickled.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from xdevice._errors import ConversionError, message

__all__ = ["load_model", "MAX_MODEL_BYTES"]

#: protobuf cannot parse a single message over 2 GiB; larger models keep weights external.
MAX_MODEL_BYTES = 2**31 - 1


def load_model(model: Any, *, check: bool = True):
    """An ``onnx.ModelProto`` from a path, bytes, or a ModelProto, with external data
    loaded from the model's own folder only.

    Raises:
        ConversionError: the file is missing, too large, truncated or corrupt, or names
            external data outside its folder.
    """
    import onnx

    path = None
    if isinstance(model, onnx.ModelProto):
        proto, folder = model, None
    elif isinstance(model, (bytes, bytearray)):
        proto, folder = _parse(bytes(model), "the given bytes"), None
    else:
        path = Path(os.fspath(model))
        if not path.is_file():
            raise ConversionError(message("No ONNX model at this path", received=str(path), fix="check the path"))
        size = path.stat().st_size
        if size > MAX_MODEL_BYTES:
            raise ConversionError(
                message(
                    "ONNX model file too large for protobuf",
                    expected=f"at most {MAX_MODEL_BYTES} bytes",
                    received=f"{size} bytes",
                    fix="save the weights as external data next to the model",
                )
            )
        proto, folder = _parse(path.read_bytes(), str(path)), path.parent.resolve()
    external = _has_external_data(proto)
    if external:
        if folder is None:
            raise ConversionError(
                message(
                    "This model keeps tensors in external files, but came without its folder",
                    fix="pass the .onnx file's path so its external data can be found",
                )
            )
        for tensor in _external_tensors(proto):
            _check_inside(tensor, folder)
    if check:  # through the file when there is one: a proto with its external data loaded may pass 2 GiB
        _validate(onnx, str(path) if path is not None else proto)
    if external:
        from onnx.external_data_helper import load_external_data_for_model

        load_external_data_for_model(proto, str(folder))
    return proto


def _validate(onnx: Any, model: Any) -> None:
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as error:
        raise ConversionError(
            message(
                "The ONNX model is not valid",
                received=str(error).splitlines()[0],
                fix="re-export it, or run onnx.checker for details",
            )
        ) from error


def _parse(data: bytes, where: str):
    import onnx
    from google.protobuf.message import DecodeError

    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as error:
        raise ConversionError(
            message(
                "Cannot parse the ONNX model: truncated or not ONNX",
                received=f"{where}: {error}",
                fix="check that the file was written completely",
            )
        ) from error
    if not proto.graph.node and not proto.graph.output:
        raise ConversionError(message("Not an ONNX model (no graph)", received=where))
    return proto


def _external_tensors(proto):
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    return [t for t in _get_all_tensors(proto) if uses_external_data(t)]


def _has_external_data(proto) -> bool:
    return bool(_external_tensors(proto))


def _check_inside(tensor, folder: Path) -> None:
    location = next((entry.value for entry in tensor.external_data if entry.key == "location"), "")
    target = (folder / location).resolve()
    if not location or os.path.isabs(location) or not target.is_relative_to(folder):
        raise ConversionError(
            message(
                f"External data of tensor {tensor.name!r} points outside the model's folder",
                expected=f"a relative path inside {folder}",
                received=location,
                fix="keep external data files next to the .onnx file",
            )
        )
    if not target.is_file():
        raise ConversionError(message(f"External data of tensor {tensor.name!r} is missing", received=str(target)))
