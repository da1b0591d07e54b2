"""The Backend contract: the only interface core code uses to reach a framework.

Every backend implements every abstract method here with the same signature (a contract
test checks names, parameters and defaults). A backend package keeps the same files as
every other: ``devices.py``, ``memory.py``, ``placement.py``, ``autodiff.py``, ``native.py``
and ``export.py`` each hold a mixin with one concern, ``ops.py`` holds the backend's implementation of the op set
(``opset.Ops``), and the package's ``__init__`` assembles them into the backend class.

Capability flags say what a backend cannot do. Core checks them with :meth:`require`, so
asking for a missing capability raises a clear ``ConfigurationError`` instead of doing
nothing. Instantiating a backend imports its framework; importing this module does not.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable
from typing import Any, ClassVar

from xdevice._device import Device
from xdevice._errors import ConfigurationError, message
from xdevice._types import Applied, Config, MemoryStats
from xdevice.backends.opset import Ops

__all__ = ["Backend"]


class Backend(abc.ABC):
    """One framework, seen through xdevice.

    Attributes:
        name: the backend's name, which is also the framework's import name.
        title: the framework's name for people ("PyTorch").
        supports_memory_limit: a per-device memory limit can be set.
        supports_preallocation: memory can be pre-allocated as a pool (memory_growth=False).
        supports_virtual_devices: one process can split a CPU into several devices.
        supports_replication: one process can train data-parallel over several devices
            (``replicas``).
        supports_processes: trains data-parallel across processes that ``xdevice launch``
            started (``process_replicas``).
        has_default_device: the framework has a default device that ``xdevice.on`` sets.
    """

    name: ClassVar[str]
    title: ClassVar[str]
    #: the backend's implementation of the neutral op set
    ops: ClassVar[Ops]
    supports_memory_limit: ClassVar[bool] = False
    supports_preallocation: ClassVar[bool] = False
    supports_virtual_devices: ClassVar[bool] = False
    supports_replication: ClassVar[bool] = False
    supports_processes: ClassVar[bool] = False
    has_default_device: ClassVar[bool] = True

    # -- devices.py ---------------------------------------------------------------------

    @abc.abstractmethod
    def version(self) -> str:
        """The framework's version string."""

    @abc.abstractmethod
    def runtime_started(self) -> bool:
        """Whether settings that must precede the runtime's start can no longer change."""

    @abc.abstractmethod
    def list_devices(self) -> list[Device]:
        """The devices this framework can place arrays on, with what it knows of them."""

    @abc.abstractmethod
    def native_device(self, device: Device) -> Any:
        """The framework's own object or string for ``device`` (assumed to exist)."""

    @abc.abstractmethod
    def configure_devices(self, config: Config) -> list[Applied]:
        """Apply ``cpu_devices`` (visibility is set once by core, through CUDA's variable)."""

    # -- memory.py ----------------------------------------------------------------------

    @abc.abstractmethod
    def configure_memory(self, config: Config, gpus: list[Device]) -> list[Applied]:
        """Apply ``memory_growth`` and ``memory_limit`` to ``gpus`` (facts from discovery)."""

    @abc.abstractmethod
    def memory_stats(self, device: Device) -> MemoryStats:
        """Bytes in use, peak and limit on ``device``; None for what cannot be told."""

    # -- placement.py -------------------------------------------------------------------

    @abc.abstractmethod
    def is_array(self, x: Any) -> bool:
        """Whether ``x`` is one of this framework's arrays (the framework is loaded)."""

    @abc.abstractmethod
    def device_of(self, x: Any) -> Device:
        """The device that holds ``x``."""

    @abc.abstractmethod
    def to_device(self, x: Any, device: Device) -> Any:
        """``x`` on ``device``, in the same framework (``x`` itself if already there)."""

    @abc.abstractmethod
    def default_device(self, device: Device) -> contextlib.AbstractContextManager[Any]:
        """A context in which new arrays of this framework are created on ``device``."""

    @abc.abstractmethod
    def from_dlpack(self, x: Any) -> Any:
        """An array of this framework viewing ``x`` (any ``__dlpack__`` producer)."""

    @abc.abstractmethod
    def data_pointer(self, x: Any) -> int:
        """The address of ``x``'s first element (to tell a view from a copy)."""

    @abc.abstractmethod
    def to_numpy(self, x: Any) -> Any:
        """``x`` as a numpy array on the host (a copy when ``x`` is on an accelerator)."""

    @abc.abstractmethod
    def zeros(self, shape: tuple[int, ...], dtype: str = "float32") -> Any:
        """A new array of zeros on the current default device."""

    # -- autodiff.py ----------------------------------------------------------------------

    @abc.abstractmethod
    def value_and_grad(self, fn: Callable[..., Any], params: dict[str, Any], *args: Any,
                       has_aux: bool = False) -> tuple[Any, dict[str, Any]]:
        """``fn(params, *args)`` (a scalar) and its gradient for every entry of ``params``,
        with the framework's own autodiff. With ``has_aux``, ``fn`` returns ``(scalar, aux)``
        and the value returned is ``(scalar, aux)``; ``aux`` is not differentiated."""

    @abc.abstractmethod
    def jit(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` compiled the framework's way (``jax.jit``, ``tf.function``; PyTorch runs
        eagerly, so ``fn`` itself)."""

    # -- native.py ------------------------------------------------------------------------

    @abc.abstractmethod
    def to_native(self, name: str, spec: dict, apply: Callable[..., Any], params: dict[str, Any],
                  trainable: list[str]) -> Any:
        """A zoo model as this framework's own trainable object (``params`` are this
        backend's arrays; ``trainable`` names those updated by gradient)."""

    @abc.abstractmethod
    def from_native(self, native: Any) -> tuple[str, dict, dict[str, Any], Device] | None:
        """``(name, spec, numpy arrays, device)`` of an object ``to_native`` made, or None
        when ``native`` is not one of this framework's."""

    # -- export.py ------------------------------------------------------------------------

    @abc.abstractmethod
    def export_onnx(self, target: Any, example_inputs: tuple[Any, ...], opset: int,
                    dynamic_batch: bool) -> Any:
        """``target`` (this framework's own callable model) as an ``onnx.ModelProto``, traced
        on the numpy ``example_inputs``, its outputs flattened by ``_common.flat_outputs``;
        with ``dynamic_batch`` axis 0 of every input is symbolic. ``opset`` is a request:
        the exporter may write another, which the caller reads back."""

    @abc.abstractmethod
    def native_outputs(self, target: Any, inputs: tuple[Any, ...]) -> list[Any]:
        """``target``'s outputs on the numpy ``inputs`` in inference mode, flattened as
        ``export_onnx`` flattens them, as numpy arrays: what its export must reproduce."""

    # -- replication.py (optional: supports_replication) ----------------------------------

    def replicas(self, devices: list[Device]) -> Any:
        """Data parallelism over ``devices`` with the framework's own engine: an
        ``xdevice.training.replication.Replicas`` (the hooks a step uses are listed there)."""
        self.require("supports_replication", "data-parallel replication in one process")

    def process_replicas(self) -> Any:
        """The same hooks, for the processes ``xdevice launch`` started (each rank takes its
        slice of every batch); joins the framework's process group first."""
        self.require("supports_processes", "training across processes started by xdevice launch")

    # -- shared behaviour ---------------------------------------------------------------

    def require(self, capability: str, wanted: str) -> None:
        """Raise ConfigurationError unless this backend has ``capability``."""
        if not getattr(self, capability):
            able = [name for name, cls in _known_classes().items() if getattr(cls, capability, False)]
            raise ConfigurationError(message(
                f"{self.title} cannot do {wanted} ({capability} is False for backend {self.name!r})",
                expected="a backend that supports it", received=self.name, choices=able,
                fix=f"leave {self.name!r} out with backends=[...], or drop the setting"))

    def __repr__(self) -> str:
        return f"<xdevice backend {self.name!r}: {self.title} {self.version()}>"


def _known_classes() -> dict[str, type[Backend]]:
    """Backend classes already loaded (for listing capable alternatives in errors)."""
    from xdevice._registry import loaded_backends

    return {b.name: type(b) for b in loaded_backends()}
