"""One ONNX model loaded in ONNX Runtime on one device, reporting the providers really in use.

ONNX Runtime lists CUDA as available even when its libraries are missing, then runs on the
CPU with only a log line. A :class:`Session` therefore reads back what the session
registered (``providers``) and where each node went (``assignment``), and refuses a GPU
session that is not on the GPU. ``strict=True`` also refuses single nodes left on the CPU.

Decisions:
- The model is read through ``converters.load.load_model`` (size limits, corrupt files,
  external data kept inside the model's folder); ORT gets the checked path when the model has
  external data, and the serialised bytes otherwise.
- A Python list has no dtype, so it is cast to the input's dtype; an array whose dtype
  differs from the input's is refused, never cast silently.
- Framework arrays on the session's GPU are bound with IO binding by their device pointer
  (``xdevice.serving.iobinding``: no host copy); outputs are bound on the session's device,
  and ``to="torch"|"jax"|"tensorflow"`` hands them over through DLPack, on that device.
  Memory no framework owns (a CUDA shared-memory region) comes as a ``DevicePointer`` and is
  bound the same way; ``run_checked(on_device=...)`` leaves chosen outputs on the device.
  String outputs are always numpy object arrays of ``str``.
- Providers and session options come from ``xdevice._onnxruntime``, under the process-wide
  settings of ``xdevice.configure``: on a GPU, ``use_tf32`` from ``matmul_precision``,
  ``gpu_mem_limit`` from ``memory_limit``, ``cudnn_conv_algo_search="DEFAULT"`` when
  deterministic, and ``onnxruntime.preload_dlls()`` before the first CUDA session.
  ``strict=True`` also sets ``session.disable_cpu_ep_fallback``, so ORT itself refuses to
  place a node on the CPU; without it ORT's CUDA provider keeps shape arithmetic on the CPU by
  design, and ``assignment`` says where nodes went.
- ORT's Python-level retry on the CPU after a failed creation (``enable_fallback``) is off:
  it prints to stdout and hides the failure that the checks here report.
- ``bfloat16`` inputs and outputs are not supported (ORT's numpy bridge refuses them).

Does not import onnxruntime or any framework until a Session is created.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import warnings
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from xdevice import _onnxruntime, _registry
from xdevice._device import Device
from xdevice._device import device as parse_device
from xdevice._discovery import devices
from xdevice._errors import ConfigurationError, DeviceNotFound, InferenceError, message
from xdevice._tensors import backend_of, to_host
from xdevice.serving.iobinding import DevicePointer, bind_in_place, binds_in_place, ort_device

__all__ = ["TensorSpec", "Session", "numpy_dtype_of", "serving_device"]

_OPTIMIZATION = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}
_ONNX_TO_NUMPY = {
    "float": "float32",
    "double": "float64",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "bool": "bool",
    "string": "string",
    **{f"{s}int{b}": f"{s}int{b}" for s in ("", "u") for b in (8, 16, 32, 64)},
}
_GPU_FIX = (
    "install the GPU build (pip uninstall onnxruntime && pip install onnxruntime-gpu), "
    "and run `xdevice doctor` to check the CUDA and cuDNN libraries"
)
_NO_GPU_FIX = "no GPU here; use cpu:0"
_TENSORRT = "TensorrtExecutionProvider"


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """A model input or output: name, numpy dtype name (or ``"string"``), shape (None = any)."""

    name: str
    dtype: str
    shape: tuple


class Session:
    """An ONNX model in ONNX Runtime on one device.

    Args:
        model: a path to a ``.onnx`` file, its bytes, or an ``onnx.ModelProto``.
        device: ``"cpu"`` or ``"gpu:N"`` in any spelling ``xdevice.device`` reads.
        threads: intra-op threads (None: ORT's default, one per physical core).
        optimization: graph optimisation, one of ``disable``, ``basic``, ``extended``, ``all``.
        tensorrt: put ORT's TensorRT provider before CUDA (GPU only).
        strict: on a GPU, refuse a model with any node assigned to the CPU provider.
        warmup: run once on zeros before ``ready`` turns True.
        warmup_batches: the batch sizes (a dynamic first axis) the warm-up runs: on a GPU, the
            CUDA provider searches cuDNN's algorithms for each new shape, so a size first met
            while serving pays that search in its latency.
        name: the model's name in messages (default: the file's stem, or the graph's name).

    Raises:
        DeviceNotFound: a GPU was asked for but ORT's CUDA provider did not register.
        ConfigurationError: a bad setting, or (strict) nodes that fell back to the CPU.
        ConversionError: the model cannot be read.
        InferenceError: ORT cannot load the model, or the warm-up run failed.

    >>> session = Session("model.onnx", "cpu")          # doctest: +SKIP
    >>> session.run({"x": [[1.0, 2.0]]})["y"]           # doctest: +SKIP
    """

    def __init__(
        self,
        model: Any,
        device: Any = "cpu",
        *,
        threads: int | None = None,
        optimization: str = "all",
        tensorrt: bool = False,
        strict: bool = False,
        warmup: bool = True,
        warmup_batches: Sequence[int] = (1,),
        name: str | None = None,
    ) -> None:
        import onnxruntime as ort

        from xdevice.converters.load import load_model

        self.device: Device = serving_device(device)
        available = list(ort.get_available_providers())
        refuse_cpu = _onnxruntime.DISABLE_CPU_FALLBACK in _onnxruntime.session_config(
            available, self.device, cpu_fallback=not strict
        )
        options = _session_options(ort, threads, optimization)
        _onnxruntime.session_options(
            self.device, available=available, cpu_fallback=not strict, options=options, ort=ort
        )
        _quiet_ort(ort, options)
        proto = load_model(model, check=True)
        self.model_path = Path(os.fspath(model)) if isinstance(model, (str, os.PathLike)) else None
        self.name = name or (self.model_path.stem if self.model_path else (proto.graph.name or "model"))
        external = self.model_path is not None and _has_external_data(proto)
        source = str(self.model_path) if external else proto.SerializeToString()
        del proto
        requested = provider_list(self.device, available=available, tensorrt=tensorrt, cpu_fallback=not strict)
        _onnxruntime.preload_dlls(self.device, ort=ort)
        try:
            with warnings.catch_warnings():  # ORT warns "not in available provider names"; we raise below
                warnings.filterwarnings("ignore", "Specified provider", UserWarning)
                self._session = ort.InferenceSession(
                    source, sess_options=options, providers=requested, enable_fallback=0
                )
        except Exception as error:  # ORT raises its own pybind Fail/InvalidGraph types
            if refuse_cpu and "fallback to CPU EP" in str(error):
                raise ConfigurationError(
                    message(
                        f"strict=True, and ONNX Runtime would run nodes of model {self.name!r} on the CPU on "
                        f"{self.device} (nodes its CUDA provider does not take, or CUDA did not load)",
                        received=str(error).strip()[:500],
                        fix="run `xdevice doctor` to check the CUDA libraries, replace those ops in the model, "
                        "or pass strict=False to allow the fallback",
                    )
                ) from error
            raise InferenceError(
                message(
                    f"ONNX Runtime cannot load model {self.name!r}",
                    received=str(error).strip()[:500],
                    fix=f"ONNX Runtime {ort.__version__} reads IR version <= 13 and ai.onnx opset <= 26; "
                    "re-export with those, or check the model with onnx.checker",
                )
            ) from error
        self.providers: list[str] = list(self._session.get_providers())
        nodes = _assigned_nodes(self._session)
        self.assignment: dict[str, int] = dict(collections.Counter(ep for ep, _ in nodes or ()))
        asked = ([_TENSORRT] if tensorrt else []) + ([_onnxruntime.CUDA] if self.device.kind == "gpu" else [])
        _check_providers(
            self.device,
            [*asked, _onnxruntime.CPU],
            self.providers,
            nodes,
            strict,
            gpus=len(devices(kind="gpu")) if self.device.kind == "gpu" else None,
            cpu_fallback_refused=refuse_cpu,
        )
        self.inputs = [_spec(a) for a in self._session.get_inputs()]
        self.outputs = [_spec(a) for a in self._session.get_outputs()]
        self._input_specs = {s.name: s for s in self.inputs}  # looked up on every request
        self._output_names = [s.name for s in self.outputs]
        self.ready = False
        for batch in warmup_batches if warmup else ():
            zeros = {s.name: _zeros(s, batch) for s in self.inputs}
            try:
                self.run(zeros)
            except Exception as error:
                raise InferenceError(
                    message(
                        f"Warm-up of model {self.name!r} on zeros failed (batch {batch})",
                        received=str(error)[:500],
                        fix="pass warmup=False if the model needs real inputs (related dims, valid ids)",
                    )
                ) from error
        self.ready = True

    def __repr__(self) -> str:
        return f"Session({self.name!r}, device='{self.device}', providers={self.providers})"

    def run(self, inputs: dict[str, Any], outputs: list[str] | None = None, *, to: str | None = None) -> dict[str, Any]:
        """Run the model once; thread safe.

        Args:
            inputs: input name -> numpy array, Python list, or torch/JAX/TensorFlow array.
            outputs: the output names to compute (default: all).
            to: ``None``/``"numpy"`` for numpy arrays, or ``"torch"``, ``"jax"``,
                ``"tensorflow"`` for that framework's arrays on the session's device.

        Raises:
            InferenceError: unknown or missing names, a wrong dtype or rank, or a failed run.
        """
        names = self._output_names
        wanted = names if outputs is None else list(outputs)
        for name in wanted:
            if name not in names:
                raise InferenceError(message("Unknown output name", received=name, choices=names))
        if to is not None and to not in _registry.backends():
            raise InferenceError(message("Unknown output framework", received=to, choices=_registry.backends()))
        return self.run_checked(self.check_inputs(inputs), wanted, to)

    def run_checked(
        self,
        feeds: dict[str, Any],
        outputs: list[str] | None = None,
        to: str | None = None,
        *,
        on_device: Collection[str] = (),
    ):
        """:meth:`run` on ``feeds`` that :meth:`check_inputs` returned and ``outputs`` (names
        of the model's outputs; default: all) and ``to`` already checked: what the server
        calls, having checked each request once before it queued. Thread safe.

        Args:
            on_device: outputs (of a GPU session, not strings) to return as ONNX Runtime's own
                values (``OrtValue``) on the session's device, for the caller to copy where it
                needs them (a CUDA shared-memory region) before it lets them go; the others
                come back as ``to`` says.

        Raises:
            InferenceError: the run failed.
        """
        wanted = self._output_names if outputs is None else outputs
        try:
            if on_device:
                self._check_kept(set(on_device))
            elif to in (None, "numpy") and not any(_is_device_array(v) for v in feeds.values()):
                return dict(zip(wanted, self._session.run(wanted, feeds)))  # numpy already: as they are
            return self._run_bound(feeds, wanted, to, set(on_device))
        except InferenceError:
            raise
        except Exception as error:
            raise InferenceError(
                message(f"Model {self.name!r} failed to run", received=str(error).strip()[:500])
            ) from error

    def _run_bound(self, feeds: dict[str, Any], wanted: list[str], to: str | None, kept: set[str]):
        """The run by IO binding: inputs bound by pointer where they are device arrays, outputs
        on the session's device (strings on the host), handed over as ``to`` says; those
        ``kept`` stay ONNX Runtime's ``OrtValue`` on the device."""
        binding = self._session.io_binding()  # one per call: a binding is not shared between threads
        held = self._bind_inputs(binding, feeds)  # bound by pointer: alive until the run returns
        specs = {s.name: s for s in self.outputs}
        place = ort_device(self.device)
        for name in wanted:  # beside outputs kept on the device, the others go to the host at once
            on_host = specs[name].dtype == "string" or (kept and name not in kept)
            binding.bind_output(name, *(("cpu", 0) if on_host else place))
        self._session.run_with_iobinding(binding)
        if self.device.kind == "gpu":
            binding.synchronize_outputs()
        del held
        if kept:
            return {name: v if name in kept else v.numpy() for name, v in zip(wanted, binding.get_outputs())}
        if to in (None, "numpy"):
            return dict(zip(wanted, binding.copy_outputs_to_cpu()))
        target = _registry.backend(to)
        result = {}
        for name, value in zip(wanted, binding.get_outputs()):
            if specs[name].dtype in ("string", "bool"):  # no DLPack for strings; bool arrives as uint8
                array = value.numpy()
                if specs[name].dtype == "bool":
                    array = target.to_device(target.from_dlpack(array), self.device)
                result[name] = array
            else:
                result[name] = target.from_dlpack(value)
        return result

    def _check_kept(self, kept: set[str]) -> None:
        """Refuse outputs that cannot stay in GPU memory (:meth:`run_checked`'s ``on_device``)."""
        specs = {s.name: s for s in self.outputs}
        refused = sorted(n for n in kept if self.device.kind != "gpu" or specs[n].dtype == "string")
        if refused:
            raise InferenceError(
                message(
                    f"Model {self.name!r} cannot leave outputs {refused} in GPU memory",
                    expected="numeric outputs of a model running on a GPU",
                    received=f"{self.device}, dtypes {[specs[n].dtype for n in refused]}",
                )
            )

    def _bind_inputs(self, binding: Any, feeds: dict[str, Any]) -> list[Any]:
        """Bind ``feeds``: device arrays by pointer, the others from the host; returns what was
        bound by pointer, for the caller to hold until the run returns."""
        specs = self._input_specs
        held = []
        for name, value in feeds.items():
            if _is_device_array(value):
                held.append(bind_in_place(binding, name, value, self.device, specs[name].dtype))
            else:
                binding.bind_cpu_input(name, to_host(value))
        if held:  # the producing framework may still be writing them on its own CUDA stream
            binding.synchronize_inputs()
        return held

    def check_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """``inputs`` checked against the model's (names, dtypes, shapes) and ready for ORT.

        Raises:
            InferenceError: what is wrong, with the valid names or the expected dtype/shape.
        """
        specs = self._input_specs
        unknown = [k for k in inputs if k not in specs]
        missing = [k for k in specs if k not in inputs]
        if unknown or missing:
            raise InferenceError(
                message(
                    f"Model {self.name!r} got wrong input names",
                    expected="exactly the model's inputs",
                    received=f"unknown {unknown}, missing {missing}",
                    choices=list(specs),
                )
            )
        return {name: _checked(specs[name], value, self.device) for name, value in inputs.items()}


def provider_list(
    device: Device, *, available: list[str] | None = None, tensorrt: bool = False, cpu_fallback: bool = True
) -> list[tuple[str, dict[str, str]]]:
    """The providers to request for ``device``, most preferred first, with their options under
    the process-wide settings (``xdevice._onnxruntime.configured_provider_options``); TensorRT
    before CUDA when asked for and this build has it, the CPU last unless ``cpu_fallback`` is False.

    Args:
        available: ``onnxruntime.get_available_providers()`` (default: every provider, as on
            an onnxruntime-gpu build with TensorRT).

    >>> provider_list(Device("gpu", 1))[0]
    ('CUDAExecutionProvider', {'device_id': '1', 'use_tf32': '0'})
    """
    if available is None:
        available = [_TENSORRT, _onnxruntime.CUDA, _onnxruntime.CPU]
    if device.kind == "cpu" and tensorrt:
        raise ConfigurationError(
            message(
                "TensorRT needs a GPU device",
                received=str(device),
                fix="pass device='gpu:0', or drop tensorrt=True",
            )
        )
    providers = _onnxruntime.configured_provider_options(available, device, cpu_fallback=cpu_fallback)
    if tensorrt and _TENSORRT in available:
        providers.insert(0, (_TENSORRT, {"device_id": str(device.index)}))
    return providers


def _check_providers(
    device: Device,
    requested: list[str],
    registered: list[str],
    nodes: list[tuple[str, str]] | None,
    strict: bool,
    *,
    gpus: int | None = None,
    cpu_fallback_refused: bool = False,
) -> None:
    """Raise when the session is not on the device asked for. Pure: tested with made-up inputs.

    Args:
        requested / registered: provider names asked for, and those the session reports.
        nodes: ``(provider, op_type)`` per node, or None when ORT cannot say.
        gpus: the GPUs this machine shows (``xdevice.devices(kind="gpu")``), None when not
            known: the fix for a CUDA provider that did not register fits the machine (with
            no GPU, installing onnxruntime-gpu changes nothing).
        cpu_fallback_refused: the session was created with ``session.disable_cpu_ep_fallback``,
            so ORT itself guarantees that no node is on the CPU (strict holds without ``nodes``).
    """
    if device.kind != "gpu":
        return
    if "CUDAExecutionProvider" not in registered:
        if gpus == 0:
            raise DeviceNotFound(
                message(
                    f"ONNX Runtime cannot run on {device}: this machine has no GPU",
                    received=str(device),
                    choices=["cpu:0"],
                    fix=_NO_GPU_FIX + _hidden_gpus(),
                )
            )
        raise DeviceNotFound(
            message(
                f"ONNX Runtime did not register its CUDA provider for {device}; it would run on the CPU",
                expected="CUDAExecutionProvider among the session's providers",
                received=registered,
                fix=_GPU_FIX,
            )
        )
    if "TensorrtExecutionProvider" in requested and "TensorrtExecutionProvider" not in registered:
        raise ConfigurationError(
            message(
                "ONNX Runtime did not register its TensorRT provider",
                received=registered,
                fix="install TensorRT's libraries where onnxruntime-gpu finds them, or pass tensorrt=False",
            )
        )
    if not strict or (nodes is None and cpu_fallback_refused):
        return
    if nodes is None:
        raise ConfigurationError(
            message(
                "strict=True needs ONNX Runtime to report where each node runs, and it cannot",
                expected="onnxruntime >= 1.24",
                fix="upgrade onnxruntime-gpu, or pass strict=False",
            )
        )
    on_cpu = collections.Counter(op for ep, op in nodes if ep == "CPUExecutionProvider")
    if on_cpu:
        ops = ", ".join(f"{op} x{n}" for op, n in sorted(on_cpu.items()))
        raise ConfigurationError(
            message(
                f"strict=True, but {sum(on_cpu.values())} node(s) fell back to the CPU on {device}",
                received=ops,
                fix="replace those ops in the model, or pass strict=False to allow the fallback",
            )
        )


# -- helpers --------------------------------------------------------------------------------


def _hidden_gpus() -> str:
    """What to add to "no GPU here" when ``CUDA_VISIBLE_DEVICES`` may be what hides them."""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    return "" if hidden is None else f" (or unset CUDA_VISIBLE_DEVICES={hidden!r}, if it hides a GPU)"


def _session_options(ort, threads: int | None, optimization: str):
    if optimization not in _OPTIMIZATION:
        raise ConfigurationError(
            message("Unknown optimization level", received=optimization, choices=list(_OPTIMIZATION))
        )
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ConfigurationError(
            message(
                "threads is the number of intra-op threads", expected="an int of 1 or more, or None", received=threads
            )
        )
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _OPTIMIZATION[optimization])
    options.intra_op_num_threads = threads or 0
    options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    return options


def _quiet_ort(ort, options) -> None:
    """Keep ONNX Runtime's warnings off the terminal unless they are asked for (``--verbose`` /
    ``XDEVICE_VERBOSE``, or DEBUG on the ``xdevice.serving`` logger, as ``xdevice serve
    --log-level debug`` sets): ORT writes them to stderr in colour (a provider it could not
    create, nodes left on the CPU), and a Session says what matters itself (the providers in
    use, where nodes run, a GPU that is not there). Errors still print. The default logger's
    level is process-wide: it also quiets ORT sessions made elsewhere in the process."""
    import logging

    from xdevice import _quiet

    if _quiet.verbose() or logging.getLogger("xdevice.serving").isEnabledFor(logging.DEBUG):
        return
    ort.set_default_logger_severity(3)  # 3: errors and worse
    options.log_severity_level = 3


def _assigned_nodes(session) -> list[tuple[str, str]] | None:
    """``(provider, op_type)`` for each node, or None on an ORT that cannot say (< 1.24)."""
    try:
        info = session.get_provider_graph_assignment_info()
    except Exception:  # noqa: BLE001 - absent before 1.24; raises if the config entry did not reach the session
        return None
    return [(sub.ep_name, node.op_type) for sub in info for node in sub.get_nodes()]


def _has_external_data(proto) -> bool:
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    return any(uses_external_data(t) for t in _get_all_tensors(proto))


def _spec(arg) -> TensorSpec:
    shape = tuple(d if isinstance(d, int) else None for d in (arg.shape or ()))
    return TensorSpec(arg.name, _ort_numpy_name(arg.type), shape)


def _ort_numpy_name(ort_type: str) -> str:
    """ONNX Runtime's type name (``"tensor(float)"``) as a numpy dtype name (``"float32"``;
    ``"string"`` for strings)."""
    kind = ort_type[len("tensor(") : -1] if ort_type.startswith("tensor(") else ort_type
    return _ONNX_TO_NUMPY.get(kind, kind)


def numpy_dtype_of(ort_type: str) -> Any:
    """The numpy dtype of ONNX Runtime's tensor type ``ort_type`` (an ``OrtValue``'s
    ``data_type()``), or None where numpy has none for raw bytes (strings, bfloat16).

    >>> numpy_dtype_of("tensor(float16)"), numpy_dtype_of("tensor(string)")
    (dtype('float16'), None)
    """
    import numpy as np

    name = _ort_numpy_name(ort_type)
    if name in ("string", "bfloat16"):
        return None
    try:
        return np.dtype(name)
    except TypeError:
        return None


def serving_device(spec: Any) -> Device:
    """``spec`` (any spelling ``xdevice.device`` reads) as a device ONNX Runtime serves on.

    Raises:
        ConfigurationError: not the CPU or a GPU.

    >>> str(serving_device("cuda:1"))
    'gpu:1'
    """
    where = parse_device(spec)
    if where.kind not in ("cpu", "gpu"):
        raise ConfigurationError(
            message(
                "ONNX Runtime serves on a CPU or a GPU",
                received=str(where),
                choices=["cpu", "gpu:0"],
                fix="pass device='cpu' or 'gpu:N' (xdevice serve --device)",
            )
        )
    return where


def _zeros(spec: TensorSpec, batch: int = 1):
    """Zeros of ``spec``'s shape: ``batch`` rows on a dynamic first axis, 1 on any other."""
    import numpy as np

    shape = tuple((batch if i == 0 else 1) if d is None else d for i, d in enumerate(spec.shape))
    return np.full(shape, "", dtype=object) if spec.dtype == "string" else np.zeros(shape, spec.dtype)


def _is_device_array(value: Any) -> bool:
    """A framework array left on the session's GPU by ``_checked``, to bind by its pointer."""
    import numpy as np

    return not isinstance(value, np.ndarray)


def _checked(spec: TensorSpec, value: Any, device: Device):
    """``value`` ready for ORT: numpy, or a framework array on ``device``; dtype and rank checked."""
    import numpy as np

    if spec.dtype == "string":
        array = np.asarray(value if isinstance(value, (list, tuple, np.ndarray)) else to_host(value))
        text = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in array.ravel()]
        value = np.array(text, dtype=object).reshape(array.shape)  # ORT would str() bytes: "b'ab'"
    elif isinstance(value, (list, tuple, int, float, bool)):
        value = np.asarray(value, dtype=spec.dtype)  # a list has no dtype of its own
    elif isinstance(value, DevicePointer):
        if value.device != device:  # ORT binds a pointer only on the session's own device
            raise InferenceError(
                message(
                    f"Input {spec.name!r} lies in GPU memory of another device than the model's",
                    expected=f"memory on {device}",
                    received=str(value.device),
                    fix=f"put it on {device}, or send it through the host",
                )
            )
    elif not isinstance(value, np.ndarray):
        name = backend_of(value)
        engine = _registry.backend(name)
        if name != "numpy" and not binds_in_place(
            engine.device_of(value) if device.kind == "gpu" else None, device, spec.dtype
        ):
            value = engine.to_numpy(value)
    if spec.dtype == "string":
        dtype = "string"
    else:
        dtype = _numpy_name(value.dtype) if isinstance(value, np.ndarray) else np.dtype(_dtype_name(value)).name
    if dtype != spec.dtype:
        raise InferenceError(
            message(
                f"Input {spec.name!r} has the wrong datatype",
                expected=spec.dtype,
                received=dtype,
                fix=f"cast it to {spec.dtype}",
            )
        )
    shape = tuple(value.shape)
    if len(shape) != len(spec.shape) or any(w is not None and w != d for w, d in zip(spec.shape, shape)):
        raise InferenceError(
            message(
                f"Input {spec.name!r} has the wrong shape",
                expected=f"rank {len(spec.shape)}, shape {_show(spec.shape)}",
                received=_show(shape),
            )
        )
    return value


_NAMES: dict[Any, str] = {}


def _numpy_name(dtype: Any) -> str:
    """``dtype.name``, remembered: numpy works it out in Python each time it is asked, and
    the server asks on every request."""
    name = _NAMES.get(dtype)
    if name is None:
        name = _NAMES[dtype] = dtype.name
    return name


def _dtype_name(value: Any) -> str:
    dtype = value.dtype
    return getattr(dtype, "as_numpy_dtype", None) or str(dtype).removeprefix("torch.")


def _show(shape: tuple) -> str:
    dims = ["?" if d is None else str(d) for d in shape]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"
