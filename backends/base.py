"""The Backend contract: the only interface core code uses to reach a framework.

Every backend implements every abstract method here with the same signature, and overrides
the optional hooks (the methods with a default) with the same signature too; a contract
test checks names, parameters and defaults. A backend package keeps the same files as every
other: ``devices.py``, ``memory.py``, ``numerics.py`` (matmul precision, determinism and the
framework's global seed), ``placement.py``, ``autodiff.py``, ``native.py`` and ``export.py``
each hold a mixin with one concern, ``replication.py`` the engine for data
parallelism where there is one, ``ops.py`` the backend's implementation of the op set
(``opset.Ops``), and ``backend.py`` assembles the mixins into the backend class.

Some things live outside the class, so that core can use them without importing the framework:

- the package's ``__init__`` imports no framework; it defines ``TITLE``, the framework's name
  for people (the class's ``title`` and the registry read it), and may define
  ``gpu_build()``: whether the installed build supports GPUs, read from package metadata
  (the registry asks it);
- ``training.py`` adapts the framework's own models to the trainer (``program(backend,
  model, device)``, and ``split(backend, model, devices)`` where a sequential model can be
  cut into stages); the trainer loads it through the registry, the backend never imports it;
- ``launch.py``, which imports no framework, is the hook through which the backend sets what
  its engine needs to run in the N processes ``xdevice launch`` started:
  ``environment(rendezvous) -> dict[str, str]`` (PyTorch's ``MASTER_ADDR``/``MASTER_PORT``,
  JAX's coordinator, TensorFlow's ``TF_CONFIG``), learnt through the launcher's
  ``xdevice._processes.Rendezvous``; every worker calls the hook of every installed backend
  before the script runs, so the launcher knows none of the variables, and a backend without
  ``launch.py`` needs none. ``join_processes`` reads them back;
- ``agent.py``, where a backend provides one, is a process launcher for ``xdevice launch``
  (PyTorch's: torchrun's elastic agent), found by the registry as the ``agent`` module
  (``_registry.providers("agent")``): ``arguments(script, args, **flags)`` and
  ``run(arguments) -> exit code``; its workers call ``_processes.environment``.

Capability flags say what a backend cannot do. Core checks them with :meth:`require`, so
asking for a missing capability raises a clear ``ConfigurationError`` instead of doing
nothing. Instantiating a backend imports its framework; importing this module does not.
"""

from __future__ import annotations

import abc
import contextlib
import os
from collections.abc import Callable
from typing import Any, ClassVar

from xdevice._device import Device
from xdevice._errors import ConfigurationError, ConversionError, message
from xdevice._types import Applied, Config, MemoryStats
from xdevice.backends.opset import Ops

__all__ = ["Backend", "OWNED_KINDS"]

#: What an object can be to the framework that owns it (:meth:`Backend.owns`).
OWNED_KINDS = ("array", "model", "device")


class Backend(abc.ABC):
    """One framework, seen through xdevice.

    Attributes:
        name: the backend's name, which is also the framework's import name.
        title: the framework's name for people ("PyTorch").
        accepts: for each kind :meth:`owns` answers, what of this framework's is accepted
            there, for people ("torch.Tensor"); error messages list them.
        saved_format: the file suffix of the framework's own saved program that
            :meth:`save_converted` writes (``".pt2"``), or None when there is none.
        supports_gpu: the framework can run on a GPU at all (numpy cannot).
        supports_bfloat16: the backend computes in bfloat16 (the numpy reference does not).
        supports_memory_limit: a per-device memory limit can be set.
        supports_preallocation: memory can be pre-allocated as a pool (memory_growth=False).
        supports_virtual_devices: one process can split a CPU into several devices.
        supports_replication: one process can train data-parallel over several devices
            (``replicas``).
        supports_processes: trains data-parallel across processes that ``xdevice launch``
            started (``process_replicas``).
        supports_tensor_parallel: splits the zoo transformers' layers over a mesh's ``model``
            axis (``Replicas.tensor_parallel``; ``fit(..., mesh={"data": 2, "model": 2})``).
        fsdp_first_axis: ``strategy="fsdp"`` splits every parameter along its first axis
            into ``torch.chunk`` pieces (FSDP2), not along its largest axis the count divides
            (:func:`xdevice.backends.training.shard_bytes`).
        has_default_device: the framework has a default device that ``xdevice.on`` sets.
        defaults_to_gpu: the framework puts new arrays on GPU 0 when there is one (JAX,
            TensorFlow): core code meant for any device, cpu:0 included, enters
            :meth:`default_device` for it.
        dlpack_alignment: the byte alignment a buffer must have for the framework to take
            it over without a copy (TensorFlow's kernels abort on a misaligned one); 1: any.
        dlpack_strided: the framework takes a strided (non row-major) buffer as a view.
    """

    name: ClassVar[str]
    title: ClassVar[str]
    #: the backend's implementation of the neutral op set
    ops: ClassVar[Ops]
    accepts: ClassVar[dict[str, str]] = {}
    saved_format: ClassVar[str | None] = None
    supports_gpu: ClassVar[bool] = True
    supports_bfloat16: ClassVar[bool] = True
    supports_memory_limit: ClassVar[bool] = False
    supports_preallocation: ClassVar[bool] = False
    supports_virtual_devices: ClassVar[bool] = False
    supports_replication: ClassVar[bool] = False
    supports_processes: ClassVar[bool] = False
    supports_tensor_parallel: ClassVar[bool] = False
    fsdp_first_axis: ClassVar[bool] = False
    has_default_device: ClassVar[bool] = True
    defaults_to_gpu: ClassVar[bool] = False
    dlpack_alignment: ClassVar[int] = 1
    dlpack_strided: ClassVar[bool] = True

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
    def device_from_native(self, native: Any) -> Device:
        """The :class:`Device` a framework's own device object names (the inverse of
        :meth:`native_device`; ``native`` is one that :meth:`owns` calls ``"device"``)."""

    @abc.abstractmethod
    def configure_devices(self, config: Config) -> list[Applied]:
        """Apply ``cpu_devices`` (visibility is set once by core, through CUDA's variable)."""

    def enable_float64(self) -> None:
        """Let the framework compute in float64 and int64 (JAX needs a switch; the others
        always can, so by default there is nothing to do)."""
        return None

    def kink_margin(self) -> contextlib.AbstractContextManager[list[float]]:
        """A context that collects, while active, how close each kinked op (relu and abs at
        0, max at ties) came to its kink, relative to its input's scale. Parity asks the
        reference backend (numpy's autodiff records it) to pick inputs whose gradients float32
        rounding cannot flip; a backend without the instrument collects nothing."""
        return contextlib.nullcontext([])

    def gpu_libraries(self) -> dict[str, str]:
        """The GPU libraries this build found, by name (``{"cudnn": "91002"}``); {} when it
        tells nothing or uses none."""
        return {}

    # -- memory.py ----------------------------------------------------------------------

    @abc.abstractmethod
    def configure_memory(self, config: Config, gpus: list[Device]) -> list[Applied]:
        """Apply ``memory_growth`` and ``memory_limit`` to ``gpus`` (facts from discovery)."""

    @abc.abstractmethod
    def memory_stats(self, device: Device) -> MemoryStats:
        """Bytes in use, peak and limit on ``device``; None for what cannot be told."""

    def measure_step(self, step: Callable[..., Any], args: tuple, device: Device) -> tuple[str, dict[str, int]] | None:
        """What one run of the training ``step`` (compiled by :meth:`jit` when the backend
        compiles) on ``args`` takes in memory on ``device``, as the framework itself counts it:
        ``(how it was counted, {part: bytes})`` with a ``"total"`` part; None where the
        framework offers no count (the estimate then is the arithmetic alone). It may run
        the step: ``args`` are copies the caller does not keep."""
        return None

    # -- numerics.py ----------------------------------------------------------------------

    @abc.abstractmethod
    def configure_numerics(self, config: Config) -> list[Applied]:
        """Apply ``config.matmul_precision`` (always set: core fills in the project's default)
        and ``config.deterministic``: one row each, whose detail says what was done. Core calls
        it when the backend starts and after each ``configure`` that changes them, and has
        already refused ``deterministic=True`` for a runtime that started; False means "not
        asked for" (core refuses to turn determinism off once on)."""

    @abc.abstractmethod
    def numerics(self) -> dict[str, object]:
        """The precision and determinism in effect, read back from the framework's own getters:
        ``{"matmul_precision": <the framework's own value>, "deterministic": bool, ...}``,
        plus whatever else decides float32 products (PyTorch's cuDNN convolutions, say)."""

    @abc.abstractmethod
    def seed(self, n: int) -> None:
        """Seed the framework's global random state (a framework without one does nothing)."""

    # -- placement.py -------------------------------------------------------------------

    @abc.abstractmethod
    def owns(self, x: Any) -> str | None:
        """What ``x`` is to this framework: ``"array"``, ``"model"`` (something it runs,
        trains or exports: a module, a Keras model, a ``tf.function``, a JAX function or
        ``(apply_fn, params)`` pair) or ``"device"`` (its own device object); None when
        ``x`` is not this framework's.

        Core asks only backends whose framework is already imported, and caches the answer
        by ``type(x)``, except for tuples, lists, dicts and plain functions: so the answer
        for any other object must hold for every object of its type.
        """

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

    def is_dense(self, x: Any) -> bool:
        """Whether ``x`` is laid out densely in row-major order (no strides, no offset gaps);
        arrays are dense unless a backend says."""
        return True

    def dense(self, x: Any) -> Any:
        """``x`` laid out densely in row-major order, as a DLPack consumer that ignores
        strides needs it (ONNX Runtime); arrays are dense already unless a backend says."""
        return x

    # -- autodiff.py ----------------------------------------------------------------------

    @abc.abstractmethod
    def value_and_grad(
        self, fn: Callable[..., Any], params: dict[str, Any], *args: Any, has_aux: bool = False
    ) -> tuple[Any, dict[str, Any]]:
        """``fn(params, *args)`` (a scalar) and its gradient for every entry of ``params``,
        with the framework's own autodiff. With ``has_aux``, ``fn`` returns ``(scalar, aux)``
        and the value returned is ``(scalar, aux)``; ``aux`` is not differentiated."""

    @abc.abstractmethod
    def jit(self, fn: Callable[..., Any], donate: tuple[int, ...] = ()) -> Callable[..., Any]:
        """``fn`` compiled the framework's way (``jax.jit``, ``tf.function``; PyTorch runs
        eagerly, so ``fn`` itself). ``donate``: positions of arguments whose buffers the
        compiled function may reuse for its results (JAX's ``donate_argnums``, asked for only
        where ``Replicas`` says the backend donates); others ignore it."""

    def capture(self, fn: Callable[..., Any], *example_args: Any) -> Callable[..., Any]:
        """``fn`` (a pure function of pytrees of this framework's arrays) as the framework's
        own program for arguments like ``example_args`` (same shapes and dtypes): the Python
        around the ops runs once, when it is traced. By default :meth:`jit`; PyTorch traces a
        ``torch.fx.GraphModule`` (``make_fx`` on fake tensors), which ``torch.compile`` and
        ``torch.export`` take as it is. A trace that needs concrete data raises."""
        return self.jit(fn)

    def capture_for_calls(self, fn: Callable[..., Any], *example_args: Any) -> Callable[..., Any]:
        """:meth:`capture` for a program that is only called, never handed out (an imported
        model's per-call program): a backend may make it faster to call. By default the same."""
        return self.capture(fn, *example_args)

    # -- native.py (optional: by default a zoo model's native form is a function) ---------

    def to_native(
        self, name: str, spec: dict, forward: Callable[..., Any], params: dict[str, Any], trainable: list[str]
    ) -> Any:
        """A zoo model as this framework's own trainable module, or None when the framework's
        models are functions (JAX, numpy: core then hands out ``(apply_fn, params)``).

        ``forward(weights, x, training, **inputs)`` is the zoo model over this backend's ops and returns
        ``(output, updated buffers)`` ({} in inference); ``params`` are this backend's arrays;
        ``trainable`` names those updated by gradient.
        """
        return None

    def from_native(self, native: Any) -> tuple[str, dict, dict[str, Any], Device] | None:
        """``(name, spec, numpy arrays, device)`` of a module :meth:`to_native` made, or None
        when ``native`` is not one."""
        return None

    # -- export.py ------------------------------------------------------------------------

    @abc.abstractmethod
    def export_onnx(self, target: Any, example_inputs: tuple[Any, ...], opset: int, axes: list[dict[int, str]]) -> Any:
        """``target`` (this framework's own callable model) as an ``onnx.ModelProto``, traced
        on the numpy ``example_inputs``, its outputs flattened by ``_model_io.flat_outputs``;
        ``axes`` names, per input, the axes that stay symbolic (``{0: "batch", 1: "seq"}``;
        one name is one size across inputs). ``opset`` is a request:
        the exporter may write another, which the caller reads back."""

    @abc.abstractmethod
    def native_outputs(self, target: Any, inputs: tuple[Any, ...]) -> list[Any]:
        """``target``'s outputs on the numpy ``inputs`` in inference mode, flattened as
        ``export_onnx`` flattens them, as numpy arrays: what its export must reproduce."""

    def one_example(self, target: Any, inputs: tuple[Any, ...]) -> Any:
        """``target`` made to take a batch, when it takes one example (axis 0 of ``inputs`` is
        not a batch it can trace symbolically, but a batch added in front is): a callable
        of the batched inputs, each row computed as ``target`` computes one example. None when
        ``target`` takes a batch already, or the framework has no way to add one. Default: None.
        """
        return None

    def reference_device(self, target: Any) -> Device:
        """The device :meth:`native_outputs` computes ``target`` on: where its weights live
        (export verification says it). Default: cpu:0."""
        return Device("cpu", 0)

    def save_converted(
        self, imported: Any, specs: list[tuple[str, str, tuple]], examples: list[Any], path: os.PathLike, dynamic: bool
    ) -> None:
        """Write an imported ONNX model (``converters.importer.ImportedModel`` on this
        backend) to ``path`` in the framework's own saved format (``saved_format``), loadable
        without xdevice. ``specs`` are ``(name, dtype, shape)`` per input, each dimension a
        size (fixed) or a name (symbolic: any size, one size per name across inputs; the
        name may need :func:`~xdevice.backends._export.identifier` first); ``examples`` are
        numpy inputs to trace with, one distinct size per name; ``dynamic`` is False when
        every dimension is fixed."""
        raise ConversionError(
            message(
                f"{self.title} has no saved program format of its own",
                received=self.name,
                choices=[name for name, cls in _known_classes().items() if cls.saved_format],
                fix="convert to one of those",
            )
        )

    # -- replication.py (optional: supports_replication, supports_processes) --------------

    def replicas(self, devices: list[Device]) -> Any:
        """Data parallelism over ``devices`` with the framework's own engine: a
        ``xdevice.backends.training.Replicas`` (the hooks a step uses are listed there)."""
        self.require("supports_replication", "data-parallel replication in one process")

    def join_processes(self) -> None:
        """Join the process group of the processes ``xdevice launch`` started, from their
        environment (``xdevice._processes``); idempotent. Raises ``ConfigurationError`` when
        it is too late (JAX and TensorFlow must join before their first computation)."""
        self.require("supports_processes", "training across processes started by xdevice launch")

    def process_replicas(self) -> Any:
        """The same hooks, for the processes ``xdevice launch`` started (each rank takes its
        slice of every batch); joins the framework's process group first."""
        self.require("supports_processes", "training across processes started by xdevice launch")

    # -- shared behaviour ---------------------------------------------------------------

    def require(self, capability: str, wanted: str) -> None:
        """Raise ConfigurationError unless this backend has ``capability``."""
        if not getattr(self, capability):
            able = [name for name, cls in _known_classes().items() if getattr(cls, capability, False)]
            raise ConfigurationError(
                message(
                    f"{self.title} cannot do {wanted} ({capability} is False for backend {self.name!r})",
                    expected="a backend that supports it",
                    received=self.name,
                    choices=able,
                    fix=f"leave {self.name!r} out with backends=[...], or drop the setting",
                )
            )

    def __repr__(self) -> str:
        return f"<xdevice backend {self.name!r}: {self.title} {self.version()}>"


def _known_classes() -> dict[str, type[Backend]]:
    """Backend classes already loaded (for listing capable alternatives in errors)."""
    from xdevice._registry import loaded_backends

    return {b.name: type(b) for b in loaded_backends()}
