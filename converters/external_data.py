"""Writing an exported model: over protobuf's 2 GiB limit, its tensors go in one external data file.

The data file sits next to the ``.onnx`` (``<name>.onnx.data``, in the same folder); a model
too large to pass in memory reaches onnx's checker and ONNX Runtime as a file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["EXTERNAL_DATA_BYTES", "staged"]

#: protobuf cannot serialise one message of 2 GiB; larger models keep tensors outside
EXTERNAL_DATA_BYTES = 2**31 - 2**24


@contextlib.contextmanager
def staged(proto: Any, path: str | os.PathLike | None) -> Iterator[Path | None]:
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
