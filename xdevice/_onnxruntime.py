"""What an ONNX Runtime session needs for one device: providers, their options, session options.

Every session xdevice creates (serving, export verification, ``xdevice doctor``) is built from
these, so each one runs under the process-wide settings of ``xdevice.configure``: the float32
matmul precision, determinism and the GPU memory limit. The functions that decide are pure
(tested with made-up provider lists); only :func:`session_options` and :func:`preload_dlls`
touch ONNX Runtime, which is imported inside them, never when this module loads.

Decisions:
- ``use_tf32`` is ``"0"`` for ``matmul_precision="highest"`` and ``"1"`` otherwise. ONNX
  Runtime's CUDA provider uses TF32 for float32 MatMul/Gemm and cuDNN convolutions unless told
  not to (the option exists since ONNX Runtime 1.18, xdevice's minimum); it has no bfloat16
  mode, so ``"medium"`` allows TF32 as ``"high"`` does. ONNX Runtime's CPU provider always
  computes float32 in IEEE float32. TensorRT has no such option (only the process-wide
  ``NVIDIA_TF32_OVERRIDE=0``): a TensorRT session may use TF32 whatever the setting.
- ``cudnn_conv_algo_search`` is ``"DEFAULT"`` under ``configure(deterministic=True)``: ORT's
  default, ``EXHAUSTIVE``, times every algorithm and keeps the fastest, which may differ from
  run to run; ``DEFAULT`` is a fixed algorithm. ``SessionOptions.use_deterministic_compute``
  is set with it (kernels with a deterministic variant use it).
- ``gpu_mem_limit`` is the limit ``configure(memory_limit=...)`` set for the device: it caps
  ORT's CUDA arena (cuDNN workspaces come on top of it, as ORT's documentation says).
- The CPU provider is listed after CUDA, so nodes CUDA cannot run go to the CPU, unless CPU
  fallback is refused (``cpu_fallback=False``): then ``session.disable_cpu_ep_fallback`` is
  ``"1"`` and the CPU provider is *not* listed, since ORT refuses a session that lists it with
  fallback disabled ("Conflicting session configuration"). Refusing is not the default for a
  served GPU session: ORT's CUDA provider places shape arithmetic (Shape -> Gather -> Concat
  feeding a Reshape) on the CPU by design, and with fallback disabled any model with dynamic
  shapes fails to load. ``Session(strict=True)`` refuses it.
- CUDA is requested only where this ONNX Runtime build has it (``get_available_providers``):
  a CPU-only build asked for a GPU then gets a CPU session, which the caller's check after
  creation turns into the error that fits (no GPU here, or install onnxruntime-gpu).
- ``onnxruntime.preload_dlls()`` (onnxruntime-gpu >= 1.21) runs once per process before the
  first CUDA session, and only on a build with the CUDA provider: it loads the CUDA and cuDNN
  libraries from the ``nvidia-*`` wheels (or torch's) where the system has none. It reports by
  printing; that text goes to the ``xdevice`` logger at DEBUG, and the check of the session's
  providers after creation says whether CUDA really loaded.
"""

from __future__ import annotations

import contextlib
import io
import logging
import threading
from collections.abc import Sequence
from typing import Any

from xdevice import _configure
from xdevice._device import Device
from xdevice._errors import ConfigurationError, message

__all__ = [
    "CPU",
    "CUDA",
    "DISABLE_CPU_FALLBACK",
    "PRECISIONS",
    "CONV_ALGO_SEARCHES",
    "provider_options",
    "configured_provider_options",
    "session_config",
    "session_options",
    "wants_preload",
    "preload_dlls",
]

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
DISABLE_CPU_FALLBACK = "session.disable_cpu_ep_fallback"  # kOrtSessionOptionsDisableCPUEPFallback
PRECISIONS = ("highest", "high", "medium")  # torch.set_float32_matmul_precision's names
CONV_ALGO_SEARCHES = ("EXHAUSTIVE", "HEURISTIC", "DEFAULT")  # the CUDA provider's cudnn_conv_algo_search

logger = logging.getLogger("xdevice")
_preload_lock = threading.Lock()
_preloaded = False


def provider_options(
    available: Sequence[str],
    device: Device,
    *,
    precision: str,
    memory_limit: int | None = None,
    conv_algo_search: str | None = None,
    cpu_fallback: bool = True,
) -> list[tuple[str, dict[str, str]]]:
    """The providers to request for ``device``, most preferred first, with their options.

    Args:
        available: ``onnxruntime.get_available_providers()`` (what this build has).
        device: ``cpu:N`` or ``gpu:N``; a GPU is named to CUDA by its index (``device_id``).
        precision: the float32 matmul precision, one of :data:`PRECISIONS`.
        memory_limit: bytes of GPU memory ORT's CUDA arena may take (None: no limit).
        conv_algo_search: cuDNN's convolution algorithm search, one of
            :data:`CONV_ALGO_SEARCHES` (None: ORT's default, ``EXHAUSTIVE``).
        cpu_fallback: list the CPU provider after CUDA for nodes CUDA cannot run; with
            False it is left out (see :func:`session_config`, which must agree).

    Raises:
        ConfigurationError: an unknown precision or algorithm search.

    >>> provider_options([CUDA, CPU], Device("gpu", 1), precision="highest", memory_limit=2**30)[0]
    ('CUDAExecutionProvider', {'device_id': '1', 'use_tf32': '0', 'gpu_mem_limit': '1073741824'})
    """
    if precision not in PRECISIONS:
        raise ConfigurationError(
            message("Unknown matmul precision for ONNX Runtime", received=precision, choices=PRECISIONS)
        )
    if conv_algo_search is not None and conv_algo_search not in CONV_ALGO_SEARCHES:
        raise ConfigurationError(
            message("Unknown cuDNN convolution algorithm search", received=conv_algo_search, choices=CONV_ALGO_SEARCHES)
        )
    if device.kind != "gpu" or CUDA not in available:
        return [(CPU, {})]
    cuda = {"device_id": str(device.index), "use_tf32": "0" if precision == "highest" else "1"}
    if memory_limit is not None:
        cuda["gpu_mem_limit"] = str(int(memory_limit))
    if conv_algo_search is not None:
        cuda["cudnn_conv_algo_search"] = conv_algo_search
    return [(CUDA, cuda), *([(CPU, {})] if cpu_fallback else [])]


def configured_provider_options(
    available: Sequence[str], device: Device, *, cpu_fallback: bool = True
) -> list[tuple[str, dict[str, str]]]:
    """:func:`provider_options` under the process-wide settings of ``xdevice.configure``:
    its matmul precision, its memory limit for ``device``, and ``"DEFAULT"`` algorithm search
    when deterministic."""
    return provider_options(
        available,
        device,
        precision=_configure.matmul_precision(),
        memory_limit=_configure.memory_limit_for(device) if device.kind == "gpu" else None,
        conv_algo_search="DEFAULT" if _configure.deterministic() else None,
        cpu_fallback=cpu_fallback,
    )


def session_config(available: Sequence[str], device: Device, *, cpu_fallback: bool = False) -> dict[str, str]:
    """The session configuration entries for ``device``: ``session.disable_cpu_ep_fallback``
    is ``"1"`` when a GPU is requested from a build that has CUDA and CPU fallback is refused
    (pair it with ``provider_options(..., cpu_fallback=False)``, which leaves the CPU provider
    out, as ORT requires).

    >>> session_config([CUDA, CPU], Device("gpu", 0))
    {'session.disable_cpu_ep_fallback': '1'}
    >>> session_config([CUDA, CPU], Device("cpu", 0))
    {}
    """
    if device.kind == "gpu" and CUDA in available and not cpu_fallback:
        return {DISABLE_CPU_FALLBACK: "1"}
    return {}


def session_options(
    device: Device,
    *,
    available: Sequence[str] | None = None,
    cpu_fallback: bool = True,
    options: Any = None,
    ort: Any = None,
) -> Any:
    """``options`` (a new ``onnxruntime.SessionOptions`` when None) set for ``device``: the
    entries of :func:`session_config`, and ``use_deterministic_compute`` under
    ``configure(deterministic=True)``.

    Args:
        available: the build's providers (default: ``ort.get_available_providers()``).
        cpu_fallback: allow nodes on the CPU provider (False refuses them, on a GPU).
        ort: the ``onnxruntime`` module (default: imported here).
    """
    if ort is None:
        ort = _imported()
    if available is None:
        available = ort.get_available_providers()
    if options is None:
        options = ort.SessionOptions()
    for key, value in session_config(available, device, cpu_fallback=cpu_fallback).items():
        options.add_session_config_entry(key, value)
    if _configure.deterministic():
        options.use_deterministic_compute = True
    return options


def wants_preload(ort: Any, device: Device) -> bool:
    """Whether ``onnxruntime.preload_dlls()`` should run before a session on ``device``: a GPU
    is requested, ``ort`` has ``preload_dlls`` (onnxruntime-gpu >= 1.21) and is a build with
    the CUDA provider (a CPU-only build has the function too, and nothing to load)."""
    if device.kind != "gpu" or not callable(getattr(ort, "preload_dlls", None)):
        return False
    try:
        return CUDA in ort.get_available_providers()
    except Exception:  # noqa: BLE001 - a broken build: the session's own check reports it
        return False


def preload_dlls(device: Device, *, ort: Any = None) -> bool:
    """Run ``onnxruntime.preload_dlls()`` once per process when :func:`wants_preload` says so,
    before the first CUDA session; returns whether it ran now. What it prints, and any error,
    goes to the ``xdevice`` logger at DEBUG: the session's provider check says whether CUDA
    loaded."""
    global _preloaded
    if ort is None:
        ort = _imported()
    if _preloaded or not wants_preload(ort, device):
        return False
    with _preload_lock:
        if _preloaded:
            return False
        _preloaded = True
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                ort.preload_dlls()
        except Exception as error:  # noqa: BLE001 - preloading only helps; the provider check after creation reports
            logger.debug("onnxruntime.preload_dlls() failed: %s", error)
        if printed.getvalue().strip():
            logger.debug("onnxruntime.preload_dlls(): %s", printed.getvalue().strip())
        return True


def _imported() -> Any:
    """``onnxruntime``, imported on first use: loading this module never imports it."""
    import onnxruntime

    return onnxruntime
