"""Triton's system shared-memory extension: regions a client on the same host registers, so
tensors skip the copy through the socket (CUDA shared memory: ``cuda_memory.py``).

A client creates a POSIX shared-memory object
(``tritonclient.utils.shared_memory``), registers it under a name with its ``key``, ``offset``
and ``byte_size``, then names the region in an input's or a requested output's
``shared_memory_region`` parameters (with ``shared_memory_byte_size`` and
``shared_memory_offset``): the server reads that input from the region and writes that output
into it. The server maps the object read-write while it is registered; every read and write
is checked to lie inside the registered part.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
from pathlib import Path

import numpy as np

from xdevice._errors import message
from xdevice.serving.protocol import BadRequest, Region, tensor_from_bytes

__all__ = ["SystemSharedMemory"]


#: where Linux keeps POSIX shared-memory objects (``shm_open``'s namespace)
SHM_ROOT = Path("/dev/shm")


@dataclasses.dataclass
class _Mapped:
    key: str
    offset: int
    byte_size: int
    memory: mmap.mmap


class SystemSharedMemory:
    """The registered regions, by name.

    >>> regions = SystemSharedMemory()
    >>> regions.status()
    []
    """

    def __init__(self) -> None:
        self._regions: dict[str, _Mapped] = {}

    def __contains__(self, name: object) -> bool:
        return name in self._regions

    def register(self, name: str, key: str, offset: int = 0, byte_size: int = 0) -> None:
        """Map the shared-memory object ``key`` (``/name`` as ``shm_open`` takes it) and keep
        ``byte_size`` bytes from ``offset`` as region ``name``."""
        if not name or not isinstance(key, str) or not key.strip("/") or "/" in key.strip("/"):
            raise BadRequest(
                message(
                    "Bad shared-memory registration", expected="a region name and a key like '/input0'", received=key
                )
            )
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (offset, byte_size)):
            raise BadRequest(
                message(
                    "Bad shared-memory registration", expected="offset and byte_size >= 0", received=(offset, byte_size)
                )
            )
        if name in self._regions:
            raise BadRequest(
                message(
                    f"Shared-memory region {name!r} is already registered",
                    fix="unregister it first, or register under another name",
                )
            )
        path = SHM_ROOT / key.strip("/")
        try:
            handle = os.open(path, os.O_RDWR)
        except OSError as error:
            raise BadRequest(
                message(
                    f"Cannot open shared-memory key {key!r} for region {name!r}",
                    received=error.strerror,
                    fix="create it on this host first (tritonclient.utils.shared_memory.create_shared_memory_region)",
                )
            ) from None
        try:
            size = os.fstat(handle).st_size
            if byte_size == 0 or offset + byte_size > size:
                raise BadRequest(
                    message(
                        f"Shared-memory region {name!r} does not fit its object",
                        expected=f"1 to {size - offset} bytes from offset {offset} (the object holds {size})",
                        received=byte_size,
                    )
                )
            memory = mmap.mmap(handle, size)
        finally:
            os.close(handle)
        self._regions[name] = _Mapped(key, offset, byte_size, memory)

    def status(self, name: str | None = None) -> list[dict]:
        """``{"name", "key", "offset", "byte_size"}`` of every region, or of region ``name``."""
        if name:
            self._get(name)  # an unknown name is a 404
        names = [name] if name else sorted(self._regions)
        return [self._entry(n) for n in names]

    def _entry(self, name: str) -> dict:
        mapped = self._regions[name]
        return {"name": name, "key": mapped.key, "offset": mapped.offset, "byte_size": mapped.byte_size}

    def unregister(self, name: str | None = None) -> None:
        """Forget region ``name`` (None or "": every region) and unmap it."""
        for gone in [name] if name else list(self._regions):
            mapped = self._regions.pop(gone, None)
            if mapped is not None:
                mapped.memory.close()

    def read(self, input_name: str, region: Region, datatype: str, shape: tuple[int, ...]) -> np.ndarray:
        """The input ``input_name`` from its region (a copy, so the region may change after)."""
        start = self._bounds(f"Input {input_name!r}", region, region.byte_size)
        raw = self._regions[region.name].memory[start : start + region.byte_size]
        return tensor_from_bytes(input_name, raw, datatype, shape, "shared_memory_byte_size")

    def write(self, output_name: str, region: Region, data: bytes) -> None:
        """The output ``output_name``'s bytes into its region; it must hold them."""
        start = self._bounds(f"Output {output_name!r}", region, len(data))
        self._regions[region.name].memory[start : start + len(data)] = data

    def close(self) -> None:
        self.unregister()

    def _get(self, name: str) -> _Mapped:
        try:
            return self._regions[name]
        except KeyError:
            raise BadRequest(
                message(
                    "Unknown shared-memory region",
                    received=name,
                    choices=sorted(self._regions),
                    fix="register it first (POST /v2/systemsharedmemory/region/<name>/register, "
                    "or /v2/cudasharedmemory/... for GPU memory)",
                ),
                status=404,
            ) from None

    def _bounds(self, what: str, region: Region, size: int) -> int:
        """Where ``size`` bytes at ``region.offset`` start in the mapping, checked to lie in
        the registered part and in the tensor's declared ``byte_size``."""
        mapped = self._get(region.name)
        if size > region.byte_size or region.offset + region.byte_size > mapped.byte_size:
            raise BadRequest(
                message(
                    f"{what} does not fit shared-memory region {region.name!r}",
                    expected=f"{size} bytes within shared_memory_byte_size {region.byte_size}, "
                    f"and offset + byte size within the region's {mapped.byte_size} bytes",
                    received=f"offset {region.offset}, byte size {region.byte_size}",
                )
            )
        return mapped.offset + region.offset
