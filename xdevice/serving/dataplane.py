"""The data plane: every behaviour of the server, written once for HTTP and gRPC.

:class:`DataPlane` owns what a request can ask of the server (KServe's
``protocol/dataplane.py``): liveness and readiness (of the server and of each model),
metadata, configuration, statistics, the repository index, model control (load with
Triton's ``config`` and ``file:`` overrides, unload), inference (check, batch, run, count)
Triton's extensions a client reaches for (classification, system and CUDA shared memory, the
log and trace settings), and the error table that turns an exception into an HTTP status and a
gRPC code. The HTTP
endpoints (``server.py``) and the gRPC servicer (``grpc_service.py``) only translate their
transport to and from these calls; the models themselves are the model table
(:class:`~xdevice.serving.models.Models`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import tempfile
import time
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from xdevice._device import Device
from xdevice._errors import ConfigurationError, XDeviceError, message
from xdevice.serving.classification import classify
from xdevice.serving.config import parse_config
from xdevice.serving.cuda_memory import CudaSharedMemory, refuse_cuda
from xdevice.serving.metrics import Registry
from xdevice.serving.models import Loaded, Models, check_request  # the same checks as Models.infer
from xdevice.serving.protocol import BadRequest, InferRequest, Region, encode_bytes
from xdevice.serving.repository import ModelNotFound, Repository, triton_config
from xdevice.serving.settings import LogSettings, TraceSettings
from xdevice.serving.shared_memory import SystemSharedMemory

__all__ = ["DataPlane", "GRPC_CODES", "error_status", "MAX_BODY"]

MAX_BODY = 64 * 2**20
logger = logging.getLogger("xdevice.serving")
Answer = TypeVar("Answer")

#: HTTP status -> the gRPC status code (a ``grpc.StatusCode`` name) that says the same
GRPC_CODES = {
    400: "INVALID_ARGUMENT",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    413: "RESOURCE_EXHAUSTED",
    415: "INVALID_ARGUMENT",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}

#: a load request's file override: the model bytes of one version (Triton's ``file:<path>``)
_FILE = re.compile(r"file:(\d+)/model\.onnx")


def error_status(error: BaseException) -> tuple[int, str, str]:
    """What a failed call answers, on either transport: ``(HTTP status, gRPC code, text)``.

    A ``BadRequest`` carries its own status; an unknown model is 404; any other xdevice
    error is the client's (400); anything else is the server's (500, logged by the caller).

    >>> error_status(ModelNotFound("Unknown model"))
    (404, 'NOT_FOUND', 'Unknown model')
    """
    if isinstance(error, BadRequest):
        status = error.status
    elif isinstance(error, ModelNotFound):
        status = 404
    elif isinstance(error, XDeviceError):
        status = 400
    else:
        return 500, GRPC_CODES[500], f"{type(error).__name__}: {error}"
    return status, GRPC_CODES.get(status, "INVALID_ARGUMENT"), str(error)


class DataPlane:
    """The server's behaviour over one model repository; loads every model when created.

    Args:
        repository: Triton's layout, or one ``.onnx`` file.
        device: where a model runs whose configuration does not say (``"cpu"``, ``"gpu:N"``).
        threads: ONNX Runtime intra-op threads per session (None: its default).
        exit_on_error: raise ``ConfigurationError`` naming every model that failed to load
            (Triton's ``--exit-on-error``); False: serve the others, the index says why.
        strict_readiness: ready only when every model is (Triton's ``--strict-readiness``);
            either way, never with no model loaded.
        max_body: the largest request, in bytes, on either transport.

    >>> plane = DataPlane("models/")  # doctest: +SKIP
    >>> plane.live()  # doctest: +SKIP
    {'live': True}
    """

    def __init__(
        self,
        repository: str | Path,
        *,
        device: str = "cpu",
        threads: int | None = None,
        exit_on_error: bool = True,
        strict_readiness: bool = True,
        max_body: int = MAX_BODY,
    ):
        self.registry = Registry()
        self.models = Models(
            Repository(repository, device=device), self.registry, **({"threads": threads} if threads else {})
        )
        self.strict_readiness, self.max_body = strict_readiness, max_body
        self.in_flight = 0  # infer calls started and not yet answered, both transports
        self.cancelled = 0  # infer calls cut off before their answer (a stop that timed out)
        self.shared_memory = SystemSharedMemory()
        self.cuda_memory = CudaSharedMemory()
        self.log_settings = LogSettings(logger)
        self.trace_settings = TraceSettings()
        repo = self.models.repository
        for name in repo.models():
            with contextlib.suppress(XDeviceError):  # kept in models.failed, logged, and shown in the index
                self.models.load(name, log_failure=not exit_on_error)  # exiting, the error below names it
        strays = repo.strays()
        if exit_on_error and (self.models.failed or strays):
            raise ConfigurationError(_failures(self.models.failed, strays))
        for stray in strays:
            logger.error("%s", stray)
        if not self.models.loaded:
            logger.warning("%s", self.models.nothing_served())

    # -- health and metadata ----------------------------------------------------------------

    def live(self) -> dict:
        """The protocol's liveness body: the process answers, so it is live."""
        return {"live": True}

    def ready(self) -> tuple[bool, dict]:
        """Whether the server is ready, and the protocol's body (with why, when it is not)."""
        why = self.models.unready(self.strict_readiness)
        return (False, {"ready": False, "error": why}) if why else (True, {"ready": True})

    def model_ready(self, name: str, version: str | None = None) -> dict:
        """``{"name", "ready"}`` of a loaded model; a model not loaded raises (404, 400 or 503)."""
        return {"name": name, "ready": self.models.get(name, version).session.ready}

    def server_metadata(self) -> dict:
        from xdevice import __version__

        return {
            "name": "xdevice",
            "version": __version__,
            "extensions": [
                "classification",
                "binary_tensor_data",
                "model_repository",
                "model_configuration",
                "system_shared_memory",
                *(["cuda_shared_memory"] if self._gpus() else []),
                "statistics",
                "trace",
                "logging",
            ],
        }

    def model_metadata(self, name: str, version: str | None = None) -> dict:
        return self.models.metadata(name, version)

    def model_config(self, name: str, version: str | None = None) -> dict:
        """The model's configuration as Triton's ``ModelConfig`` JSON, completed from the model."""
        loaded = self.models.get(name, version)
        return triton_config(loaded.config, loaded.session.inputs, loaded.session.outputs)

    def statistics(self, name: str | None = None, version: str | None = None) -> dict:
        return {"model_stats": self.models.statistics(name or None, version or None)}

    def index(self, ready_only: bool = False) -> list[dict]:
        return [entry for entry in self.models.index() if not ready_only or entry["state"] == "READY"]

    def metrics(self) -> bytes:
        return self.registry.render()

    # -- inference --------------------------------------------------------------------------

    async def infer(
        self,
        name: str,
        version: str | None,
        decode: Callable[[], Awaitable[InferRequest]],
        encode: Callable[[Loaded, InferRequest, dict], Answer],
    ) -> Answer:
        """One inference: ``decode`` the transport's request, check it, run it (batched where
        the model batches), ``encode`` the outputs; every step counted in the statistics."""
        start = time.perf_counter()
        self.in_flight += 1
        try:
            loaded = self.models.get(name, version)
            try:
                request = await decode()
                # tensors in CUDA regions, decided once: a region unregistered meanwhile stays open for the run
                in_cuda = {n: r for n, (r, _) in request.input_regions.items() if r.name in self.cuda_memory}
                out_cuda = {
                    n: o.region
                    for n, o in request.output_options.items()
                    if o.region is not None and o.region.name in self.cuda_memory
                }
                for input_name, (region, shape) in request.input_regions.items():
                    if input_name not in in_cuda:
                        datatype = request.datatypes[input_name]
                        request.inputs[input_name] = self.shared_memory.read(input_name, region, datatype, shape)
            except BadRequest:
                loaded.stats.request(False, time.perf_counter() - start)
                raise
            if in_cuda or out_cuda:
                outputs = await self._infer_on_device(loaded, request, start, in_cuda, out_cuda)
            else:
                outputs = await self.models.infer(loaded, request, alone=self.in_flight == 1)
            encoding = time.perf_counter()
            try:
                outputs = self._deliver(loaded, request, outputs, written=out_cuda)
            except BadRequest:
                loaded.stats.request(False, time.perf_counter() - start)
                raise
            answer = encode(loaded, request, outputs)
            self.models.finished(loaded, start, encoding)
            return answer
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1

    async def _infer_on_device(
        self,
        loaded: Loaded,
        request: InferRequest,
        start: float,
        inputs_there: dict[str, Region],
        outputs_there: dict[str, Region],
    ) -> dict:
        """A request with tensors in CUDA shared memory: its inputs there bound to ONNX
        Runtime by their device pointers, its outputs there copied into their regions on the
        GPU (``shared_memory.py``); on the model's GPU only. It runs on its own, never merged
        by the dynamic batcher (its tensors stay on the device), on an instance thread.
        Returns the outputs, those written to a region as stand-ins with their shape and
        dtype (the encoders name the region)."""
        try:
            with self.cuda_memory.using(r.name for r in [*inputs_there.values(), *outputs_there.values()]):
                device = loaded.session.device
                for role, name, region in [("Input", n, r) for n, r in inputs_there.items()] + [
                    ("Output", n, r) for n, r in outputs_there.items()
                ]:
                    where = self.cuda_memory.device(f"{role} {name!r}", region)
                    if where != device:
                        raise refuse_cuda(
                            region.name,
                            f"it lies on {where}, and model {loaded.name!r} runs on {device} "
                            "(ONNX Runtime binds device memory only on the session's own GPU)",
                        )
                for name, region in inputs_there.items():
                    if name in loaded.vocabulary:
                        raise BadRequest(
                            message(
                                f"Input {name!r} of model {loaded.name!r} holds token ids, checked against the "
                                "model's vocabulary on the host before every run: it cannot lie in CUDA shared memory",
                                fix="send it inline or through system shared memory",
                            )
                        )
                    _, shape = request.input_regions[name]
                    pointer = self.cuda_memory.input(name, region, request.datatypes[name], shape)
                    request.inputs[name] = pointer  # type: ignore[assignment]  # the session binds it by pointer
                inputs = check_request(loaded, request)
                loaded.stats.phase("compute_input", time.perf_counter() - start)

                def run() -> dict:
                    began = time.perf_counter()
                    outputs = loaded.session.run_checked(inputs, on_device=list(outputs_there))
                    for name, region in outputs_there.items():
                        outputs[name] = self.cuda_memory.write(name, region, outputs[name])
                    rows = next(iter(inputs.values())).shape[0] if loaded.config.max_batch_size > 0 else 1
                    loaded.stats.executed(rows, time.perf_counter() - began)
                    return outputs

                return await asyncio.get_running_loop().run_in_executor(loaded.instances, run)
        except Exception:
            loaded.stats.request(False, time.perf_counter() - start)
            raise

    def _deliver(self, loaded: Loaded, request: InferRequest, outputs: dict, written: Collection[str] = ()) -> dict:
        """The outputs as the request asked for them: classified (``class_count``), or
        written to their system shared-memory region (the encoders then name the region);
        those ``written`` are in their CUDA region already (the run wrote them)."""
        labels = {tensor.name: tensor.labels for tensor in loaded.config.outputs}
        delivered = dict(outputs)
        for name, options in request.output_options.items():
            if options.class_count:
                batched = loaded.config.max_batch_size > 0
                delivered[name] = classify(name, outputs[name], options.class_count, labels.get(name, ()), batched)
            elif options.region is not None and name not in written:
                value = outputs[name]
                data = encode_bytes(value) if value.dtype.kind in "OSU" else np.ascontiguousarray(value).tobytes()
                self.shared_memory.write(name, options.region, data)
        return delivered

    # -- Triton's extensions: shared memory, log and trace settings --------------------------

    def register_system_memory(self, name: str, key: str, offset: int = 0, byte_size: int = 0) -> None:
        _name_free(name, self.cuda_memory, "CUDA")
        self.shared_memory.register(name, key, offset, byte_size)

    def system_memory_status(self, name: str | None = None) -> list[dict]:
        return self.shared_memory.status(name or None)

    def unregister_system_memory(self, name: str | None = None) -> None:
        self.shared_memory.unregister(name or None)

    def register_cuda_memory(self, name: str, handle: Any, device_id: Any, byte_size: Any) -> None:
        """Open a client's CUDA IPC ``handle`` (``byte_size`` bytes on GPU ``device_id``) as
        region ``name``; refused by name on a server whose models all run on the CPU. The
        fields come as the transport decoded them and are checked here first."""
        CudaSharedMemory.check(name, handle, device_id, byte_size)
        _name_free(name, self.shared_memory, "system")
        if not self._gpus():
            raise refuse_cuda(
                name,
                "it needs a GPU session (a model served on a GPU by onnxruntime-gpu's CUDA provider), "
                "and this server runs every model on the CPU",
            )
        self.cuda_memory.register(name, handle, device_id, byte_size)

    def cuda_memory_status(self, name: str | None = None) -> list[dict]:
        return self.cuda_memory.status(name or None)

    def unregister_cuda_memory(self, name: str | None = None) -> None:
        self.cuda_memory.unregister(name or None)

    def _gpus(self) -> set[Device]:
        """The GPUs the loaded models run on."""
        return {
            m.session.device
            for versions in self.models.loaded.values()
            for m in versions.values()
            if m.session.device.kind == "gpu"
        }

    def log(self, changes: dict | None = None) -> dict:
        """The log settings, after applying ``changes`` (Triton's logging extension)."""
        return self.log_settings.update(changes) if changes else self.log_settings.get()

    def trace(self, changes: dict | None = None, model: str | None = None) -> dict:
        """The trace settings (server-wide, or as ``model`` sees them), after ``changes``."""
        if model:
            known = self.models.repository.models()
            if model not in known:
                raise ModelNotFound(message("Unknown model", received=model, choices=known))
        return self.trace_settings.update(changes, model) if changes else self.trace_settings.get(model)

    # -- model control ----------------------------------------------------------------------

    async def load(self, name: str, parameters: dict[str, str | bytes] | None = None) -> None:
        """(Re)load ``name``, with Triton's overrides: ``config`` (the model configuration as
        JSON, in place of ``config.pbtxt``) and ``file:<version>/model.onnx`` (that version's
        model bytes; the model's files then come from the overrides alone, and ``config`` is
        required, as Triton requires it). Any other parameter is refused by name.
        """
        parameters = dict(parameters or {})
        text = parameters.pop("config", None)
        files = {key: value for key, value in parameters.items() if key.startswith("file:")}
        for key in parameters:
            if key not in files:
                raise BadRequest(
                    message(
                        f"Unsupported load parameter {key!r}",
                        expected="config (the model configuration as JSON) or file:<version>/model.onnx",
                        received=key,
                    )
                )
        for key, value in files.items():
            if not _FILE.fullmatch(key):
                raise BadRequest(
                    message(
                        f"Unsupported load parameter {key!r}: xdevice serves one ONNX file per version",
                        expected="file:<version>/model.onnx (a whole-number version)",
                        received=key,
                    )
                )
            if not isinstance(value, bytes):
                raise BadRequest(message(f"Load parameter {key!r} must carry the file's bytes", received=type(value)))
        if text is not None and not isinstance(text, str):
            raise BadRequest(message("Load parameter 'config' must be JSON text", received=type(text)))
        if files and text is None:
            raise BadRequest(
                message(
                    f"Load parameter {next(iter(files))!r} needs a 'config' parameter too (Triton's rule)",
                    fix='add "config": the model configuration as JSON, e.g. "{}" for the defaults',
                )
            )
        known = self.models.repository.models()
        if name not in known:
            raise ModelNotFound(message("Unknown model", received=name, choices=known))
        if text is None:
            await self.models.reload(name)
            return
        if not files:
            config = parse_config(text, self.models.repository.root / name, "the load request's 'config'")
            await self.models.reload(name, config=config)
            return
        with tempfile.TemporaryDirectory(prefix="xdevice-load-") as scratch:
            folder = Path(scratch) / name
            for key, value in files.items():
                path = folder / key.removeprefix("file:")
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(value)  # type: ignore[arg-type]  # checked to be bytes above
            config = parse_config(text, folder, "the load request's 'config'")
            source = Repository(scratch, device=self.models.repository.device)
            await self.models.reload(name, config=config, source=source)

    async def unload(self, name: str) -> None:
        await self.models.retire(self.models.unload(name))

    async def close(self) -> None:
        """Stop every model; the runs already started finish first. Unmaps shared memory."""
        await self.models.close()
        self.shared_memory.close()
        self.cuda_memory.close()
        self.log_settings.close()


def _name_free(name: str, other: SystemSharedMemory | CudaSharedMemory, kind: str) -> None:
    """Refuse a region name the other kind of shared memory holds: a request names a region
    by name alone, as in Triton, where both kinds share one table."""
    if name in other:
        raise BadRequest(
            message(
                f"Shared-memory region {name!r} is already registered as {kind} shared memory",
                fix="unregister it first, or register under another name",
            )
        )


def _failures(failed: dict[str, str], strays: list[str]) -> str:
    """The start-up error: one line per model that failed and per stray file, then the fix."""
    counts = []
    if failed:
        counts.append(f"{len(failed)} model{'s' * (len(failed) > 1)} failed to load")
    if strays:
        counts.append(f"{len(strays)} .onnx file{'s' * (len(strays) > 1)} outside a model folder")
    lines = [f"{' and '.join(counts)}:"]
    lines += [f"  {name}: {reason}" for name, reason in sorted(failed.items())]
    lines += [f"  {stray}" for stray in strays]
    lines.append(
        "Fix: correct each as its line says, or pass --no-exit-on-error (exit_on_error=False) to serve the others."
    )
    return "\n".join(lines)
