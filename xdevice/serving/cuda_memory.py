"""Triton's CUDA shared-memory extension: a client on the same host allocates device memory,
takes its ``cudaIpcMemHandle_t`` (64 bytes, ``tritonclient.utils.cuda_shared_memory``) and
registers it with the GPU's ``device_id`` and the ``byte_size``; the server opens the handle (``cudaIpcOpenMemHandle``)
and keeps the device pointer until the region is unregistered (``cudaIpcCloseMemHandle``).
Decisions:
- The CUDA runtime is loaded with ctypes when the first registration comes, never before:
  the ``libcudart`` this process already loaded (ONNX Runtime's CUDA provider's), else the
  one in the NVIDIA runtime wheels onnxruntime-gpu installs (``nvidia/cu13/lib``,
  ``nvidia/cuda_runtime/lib``), else the linker's. None found is refused by name.
- A server whose models all run on the CPU refuses a registration by name (there is nothing
  to bind the memory to); so does an inference that names a CUDA region for a model on the
  CPU or on another GPU. The fix is system shared memory, or serving the model on that GPU
  with onnxruntime-gpu.
- An input in a region is bound to ONNX Runtime by IO binding on ``pointer + offset``
  (:class:`~xdevice.serving.iobinding.DevicePointer`), no copy. An output is bound on the
  session's GPU and copied device to device into the region once the run has given it its
  shape (ORT binds an output to a pointer only with its shape known before the run, and a
  model's output shape is often known only after; Triton's backends also copy into the
  region). Every offset and size is checked inside the registered ``byte_size`` first.
- BYTES tensors never lie in CUDA regions (ONNX Runtime keeps strings on the host).
- A region in use by a run when it is unregistered is closed when that run ends.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import ctypes
import dataclasses
import math
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from xdevice._device import Device
from xdevice._errors import message
from xdevice.serving.iobinding import DevicePointer
from xdevice.serving.protocol import BadRequest, Region, numpy_dtype
from xdevice.serving.session import numpy_dtype_of

__all__ = [
    "CudaError",
    "CudaRuntime",
    "CudaSharedMemory",
    "IpcHandle",
    "RuntimeMissing",
    "cudart_candidates",
    "raw_handle",
    "refuse_cuda",
]


#: the size of a ``cudaIpcMemHandle_t`` (``CUDA_IPC_HANDLE_SIZE``)
IPC_HANDLE_BYTES = 64
#: where to register instead, and what a GPU server needs: every CUDA refusal ends with it
CUDA_FIX = (
    "register system shared memory instead (tritonclient.utils.shared_memory), or serve the model on "
    "that GPU (xdevice serve --device gpu:N, or KIND_GPU) with onnxruntime-gpu installed"
)


def refuse_cuda(name: str, why: str) -> BadRequest:
    """The answer to a CUDA shared-memory registration or use this server cannot serve:
    refused by name, with what it needs and the fix.

    >>> str(refuse_cuda("gpu0", "the CUDA runtime library (libcudart) is not found"))[:58]
    "CUDA shared memory (region 'gpu0') is not available: the C"
    """
    return BadRequest(message(f"CUDA shared memory (region {name!r}) is not available: {why}", fix=CUDA_FIX))


def raw_handle(value: Any) -> bytes:
    """The IPC handle's bytes from an HTTP registration's ``raw_handle`` (``{"b64": ...}``,
    base64 as ``tritonclient`` sends it).

    >>> len(raw_handle({"b64": "A" * 86 + "=="}))
    64
    """
    text = value.get("b64") if isinstance(value, dict) else None
    if not isinstance(text, str):
        raise BadRequest(
            message(
                "Bad CUDA shared-memory registration: raw_handle",
                expected='{"b64": "<the cudaIpcMemHandle_t in base64>"}',
                received=_shown(value),
            )
        )
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(
            message(
                "Bad CUDA shared-memory registration: raw_handle.b64 is not base64",
                expected=f"the {IPC_HANDLE_BYTES}-byte cudaIpcMemHandle_t in base64",
                received=_shown(text),
                fix="send tritonclient.utils.cuda_shared_memory.get_raw_handle(region)",
            )
        ) from None


def _shown(value: Any) -> Any:
    """``value`` as an error shows it: cut to about 60 characters (a handle may be long).

    >>> _shown("A" * 100)
    'AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA... (100 characters)'
    """
    if isinstance(value, str) and len(value) > 60:
        return f"{value[:57]}... ({len(value)} characters)"
    text = repr(value)
    return value if len(text) <= 60 else f"{text[:57]}..."


def cudart_candidates(roots: Iterable[str | os.PathLike] | None = None, maps: str | None = None) -> list[str]:
    """Where the CUDA runtime library may be, best first: the ``libcudart`` already loaded in
    this process (``maps``: ``/proc/self/maps``' text), the NVIDIA runtime wheels' library
    folders under each of ``roots`` (default: ``sys.path``), then the linker's name for it.

    >>> cudart_candidates([], maps="7f00-7f01 r-xp 0 0:0 1 /opt/cuda/lib64/libcudart.so.13.0.1")[0]
    '/opt/cuda/lib64/libcudart.so.13.0.1'
    """
    import ctypes.util

    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            maps = ""
    found = []
    for line in maps.splitlines():
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        if "/libcudart.so" in path and path not in found:
            found.append(path)
    for root in sys.path if roots is None else roots:
        nvidia = Path(root) / "nvidia"
        for pattern in ("cu[0-9]*/lib/libcudart.so*", "cuda_runtime/lib/libcudart.so*"):
            found += sorted((str(p) for p in nvidia.glob(pattern) if str(p) not in found), reverse=True)
    linked = ctypes.util.find_library("cudart") if roots is None else None
    if linked:
        found.append(linked)
    return found


class IpcHandle(ctypes.Structure):
    """``cudaIpcMemHandle_t``, passed by value to ``cudaIpcOpenMemHandle``."""

    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_BYTES)]

    @classmethod
    def of(cls, handle: bytes) -> IpcHandle:
        """The handle holding ``handle``'s bytes, all of them (a ``c_char`` array set from
        bytes would stop at the first NUL, and handles hold many).

        >>> bytes(IpcHandle.of(bytes(range(64)))) == bytes(range(64))
        True
        """
        return cls.from_buffer_copy(handle)


class RuntimeMissing(Exception):
    """No CUDA runtime library loads here; the text says what was tried."""


class CudaError(RuntimeError):
    """A CUDA runtime call failed; the text names the call and CUDA's error."""


class CudaRuntime:
    """The CUDA runtime calls CUDA shared memory needs, through ctypes on one ``libcudart``.

    Raises:
        OSError / AttributeError: the library does not load, or lacks one of the calls.
    """

    _IPC_LAZY_ENABLE_PEER_ACCESS = 1  # cudaIpcMemLazyEnablePeerAccess, as Triton opens handles
    _MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: the direction from the (unified) addresses
    _CALLS = ("cudaIpcOpenMemHandle", "cudaIpcCloseMemHandle", "cudaMemcpy", "cudaSetDevice", "cudaGetDevice")

    def __init__(self, path: str):
        library = ctypes.CDLL(path)
        for call in self._CALLS:
            getattr(library, call)
        library.cudaGetErrorString.restype = ctypes.c_char_p
        library.cudaIpcOpenMemHandle.argtypes = [ctypes.POINTER(ctypes.c_void_p), IpcHandle, ctypes.c_uint]
        library.cudaIpcCloseMemHandle.argtypes = [ctypes.c_void_p]
        library.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.path, self._library = path, library
        self._lock = threading.Lock()  # the current device is per thread; calls here set it and put it back

    @classmethod
    def find(cls, candidates: Iterable[str] | None = None) -> CudaRuntime:
        """The runtime from the first of ``candidates`` (default: :func:`cudart_candidates`)
        that loads.

        Raises:
            RuntimeMissing: none loads; says which were tried and why each failed.
        """
        tried = list(cudart_candidates() if candidates is None else candidates)
        failures = []
        for path in tried:
            try:
                return cls(path)
            except (OSError, AttributeError) as error:
                failures.append(f"{path}: {error}")
        if not failures:
            raise RuntimeMissing(
                "the CUDA runtime library (libcudart) is not found: none is loaded in this process, none is in "
                "the NVIDIA wheels on sys.path (nvidia/cu*/lib, nvidia/cuda_runtime/lib), none on the linker's path"
            )
        raise RuntimeMissing(f"no CUDA runtime library (libcudart) loads here: {'; '.join(failures)}")

    def open(self, handle: bytes, device_id: int) -> int:
        """The device pointer of the memory another process exported as ``handle``."""
        pointer = ctypes.c_void_p()
        with self._on(device_id):
            self._check(
                self._library.cudaIpcOpenMemHandle(
                    ctypes.byref(pointer), IpcHandle.of(handle), self._IPC_LAZY_ENABLE_PEER_ACCESS
                ),
                "cudaIpcOpenMemHandle",
            )
        return int(pointer.value or 0)

    def close(self, pointer: int, device_id: int) -> None:
        with self._on(device_id):
            self._check(self._library.cudaIpcCloseMemHandle(ctypes.c_void_p(pointer)), "cudaIpcCloseMemHandle")

    def copy(self, destination: int, source: int, size: int, device_id: int) -> None:
        """``size`` bytes from ``source`` to ``destination`` (device addresses), finished on
        return: the client may read them as soon as the response arrives."""
        with self._on(device_id):
            self._check(self._library.cudaMemcpy(destination, source, size, self._MEMCPY_DEFAULT), "cudaMemcpy")
            self._check(self._library.cudaDeviceSynchronize(), "cudaDeviceSynchronize")

    @contextlib.contextmanager
    def _on(self, device_id: int) -> Iterator[None]:
        current = ctypes.c_int(-1)
        with self._lock:
            self._check(self._library.cudaGetDevice(ctypes.byref(current)), "cudaGetDevice")
            self._check(self._library.cudaSetDevice(device_id), "cudaSetDevice")
            try:
                yield
            finally:
                if current.value not in (-1, device_id):
                    self._library.cudaSetDevice(current.value)

    def _check(self, status: int, call: str) -> None:
        if status:
            text = (self._library.cudaGetErrorString(status) or b"").decode(errors="replace")
            raise CudaError(f"{call} failed with CUDA error {status}: {text}")


_runtime: CudaRuntime | None = None
_runtime_lock = threading.Lock()


def cuda_runtime() -> CudaRuntime:
    """The process's CUDA runtime, found and loaded on first use (:meth:`CudaRuntime.find`).

    Raises:
        RuntimeMissing: none loads (asked again on the next call: a library may be installed).
    """
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = CudaRuntime.find()
        return _runtime


@dataclasses.dataclass
class _Opened:
    device_id: int
    byte_size: int
    pointer: int
    users: int = 0  # runs using the region now: an unregistered region closes when the last ends
    retired: bool = False


class CudaSharedMemory:
    """The registered CUDA regions, by name: device pointers opened from clients' IPC handles.

    Args:
        runtime: what finds the CUDA runtime that opens, copies and closes, called when the
            first region is registered (default: the process's :func:`cuda_runtime`).

    >>> regions = CudaSharedMemory()
    >>> regions.status()
    []
    """

    def __init__(self, runtime: Callable[[], CudaRuntime] = cuda_runtime) -> None:
        self._regions: dict[str, _Opened] = {}
        self._find = runtime
        self._runtime: CudaRuntime | None = None
        self._lock = threading.Lock()

    def __contains__(self, name: object) -> bool:
        return name in self._regions

    @staticmethod
    def check(name: str, handle: Any, device_id: Any, byte_size: Any) -> None:
        """A registration's fields checked, before anything is opened (either transport)."""
        if not name:
            raise BadRequest(message("Bad CUDA shared-memory registration", expected="a region name", received=name))
        if not isinstance(handle, bytes) or len(handle) != IPC_HANDLE_BYTES:
            raise BadRequest(
                message(
                    "Bad CUDA shared-memory registration: raw_handle",
                    expected=f"the {IPC_HANDLE_BYTES} bytes of a cudaIpcMemHandle_t",
                    received=f"{len(handle)} bytes" if isinstance(handle, bytes) else type(handle).__name__,
                    fix="send tritonclient.utils.cuda_shared_memory.get_raw_handle(region)",
                )
            )
        for field, value, least in (("device_id", device_id, 0), ("byte_size", byte_size, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise BadRequest(
                    message(
                        f"Bad CUDA shared-memory registration: {field}",
                        expected=f"a whole number >= {least}",
                        received=_shown(value),
                    )
                )

    def register(self, name: str, handle: bytes, device_id: int, byte_size: int) -> None:
        """Open ``handle`` (memory of ``byte_size`` bytes on GPU ``device_id``) as region ``name``;
        the fields :meth:`check`-ed first by the caller (the data plane, before it refuses a
        registration it cannot serve)."""
        if name in self._regions:
            raise BadRequest(
                message(
                    f"Shared-memory region {name!r} is already registered",
                    fix="unregister it first, or register under another name",
                )
            )
        runtime = self._runtime_now(name)
        try:
            pointer = runtime.open(handle, device_id)
        except CudaError as error:
            raise BadRequest(
                message(
                    f"Cannot open the CUDA IPC handle of region {name!r} on GPU {device_id}",
                    received=str(error),
                    fix="register a handle from cudaIpcGetMemHandle in another process on this host, "
                    "with the device_id it was allocated on (a process cannot open its own handle); "
                    "an error about the driver or the device is this server's: run `xdevice doctor`",
                )
            ) from None
        with self._lock:
            self._regions[name] = _Opened(device_id, byte_size, pointer)

    def status(self, name: str | None = None) -> list[dict]:
        """``{"name", "device_id", "byte_size"}`` of every region, or of region ``name``."""
        if name:
            self._get(name)  # an unknown name is a 404
        names = [name] if name else sorted(self._regions)
        return [
            {"name": n, "device_id": self._regions[n].device_id, "byte_size": self._regions[n].byte_size} for n in names
        ]

    def unregister(self, name: str | None = None) -> None:
        """Forget region ``name`` (None or "": every region) and close its handle (once no
        run uses it)."""
        with self._lock:
            gone = [self._regions.pop(n) for n in ([name] if name else list(self._regions)) if n in self._regions]
            for opened in gone:
                opened.retired = True
            closing = [opened for opened in gone if opened.users == 0]
        for opened in closing:
            self._close(opened)

    def close(self) -> None:
        self.unregister()

    @contextlib.contextmanager
    def using(self, names: Iterable[str]) -> Iterator[None]:
        """Keep the regions ``names`` open while a run uses them (an unknown name: 404)."""
        wanted = set(names)
        with self._lock:
            missing = sorted(wanted - set(self._regions))
            held = [] if missing else [self._regions[name] for name in wanted]
            for opened in held:
                opened.users += 1
        if missing:
            self._get(missing[0])
        try:
            yield
        finally:
            with self._lock:
                for opened in held:
                    opened.users -= 1
                closing = [opened for opened in held if opened.retired and opened.users == 0]
            for opened in closing:
                self._close(opened)

    def input(self, input_name: str, region: Region, datatype: str, shape: tuple[int, ...]) -> DevicePointer:
        """Input ``input_name`` in its region: its device pointer, checked to hold the tensor."""
        if datatype == "BYTES":
            raise BadRequest(
                message(
                    f"Input {input_name!r}: BYTES tensors cannot lie in CUDA shared memory "
                    "(ONNX Runtime keeps strings on the host)",
                    fix="send it inline or through system shared memory",
                )
            )
        dtype = numpy_dtype(datatype)
        size = math.prod(shape) * dtype.itemsize
        if size != region.byte_size:
            raise BadRequest(
                message(
                    f"Input {input_name!r}: shared_memory_byte_size does not match the shape",
                    expected=f"{size} bytes ({list(shape)} x {datatype})",
                    received=f"{region.byte_size} bytes",
                )
            )
        opened = self._fits(f"Input {input_name!r}", region, size)
        return DevicePointer(opened.pointer + region.offset, Device("gpu", opened.device_id), dtype.name, shape)

    def device(self, what: str, region: Region) -> Device:
        """The GPU region ``region.name`` lies on, the region checked to hold the tensor's
        declared ``byte_size`` at its offset (``what`` names the tensor in errors)."""
        return Device("gpu", self._fits(what, region, 0).device_id)

    def write(self, output_name: str, region: Region, value: Any) -> np.ndarray:
        """Copy ONNX Runtime's ``value`` (an ``OrtValue`` on the GPU) into its region, device
        to device; returns a stand-in with its shape and dtype and no data, for the response."""
        shape = tuple(value.shape())
        dtype = numpy_dtype_of(value.data_type())
        if dtype is None:
            raise BadRequest(
                message(f"Output {output_name!r} cannot go to CUDA shared memory", received=value.data_type())
            )
        size = math.prod(shape) * dtype.itemsize
        opened = self._fits(f"Output {output_name!r}", region, size)
        if size:
            self._runtime_now(region.name).copy(
                opened.pointer + region.offset, value.data_ptr(), size, opened.device_id
            )
        return np.broadcast_to(np.zeros((), dtype), shape)

    def _fits(self, what: str, region: Region, size: int) -> _Opened:
        """The region, checked to hold ``size`` bytes (0: only the declared part) at
        ``region.offset`` within the tensor's declared ``byte_size`` and the registered one."""
        opened = self._get(region.name)
        if size > region.byte_size or region.offset + region.byte_size > opened.byte_size:
            holds = f"{size} bytes within shared_memory_byte_size {region.byte_size}, and " if size else ""
            raise BadRequest(
                message(
                    f"{what} does not fit shared-memory region {region.name!r}",
                    expected=f"{holds}offset + byte size within the region's {opened.byte_size} bytes",
                    received=f"offset {region.offset}, byte size {region.byte_size}",
                )
            )
        return opened

    def _get(self, name: str) -> _Opened:
        try:
            return self._regions[name]
        except KeyError:
            raise BadRequest(
                message(
                    "Unknown CUDA shared-memory region",
                    received=name,
                    choices=sorted(self._regions),
                    fix="register it first (POST /v2/cudasharedmemory/region/<name>/register)",
                ),
                status=404,
            ) from None

    def _runtime_now(self, name: str) -> CudaRuntime:
        if self._runtime is None:
            try:
                self._runtime = self._find()
            except RuntimeMissing as missing:
                raise refuse_cuda(name, str(missing)) from None
        return self._runtime

    def _close(self, opened: _Opened) -> None:
        with contextlib.suppress(BadRequest, CudaError):  # a handle the driver already dropped: nothing to free
            self._runtime_now("").close(opened.pointer, opened.device_id)
