"""The model table: the models a server holds (:class:`Models`), under the data plane
(``dataplane.py``): loading and unloading, readiness, the repository index, metadata,
statistics, and running one request (checks, batching).

A model is loaded as every version its ``version_policy`` selects, each an ONNX Runtime
session checked against the inputs and outputs its configuration declares and warmed up
with the configuration's ``model_warmup`` samples before it counts as ready. A model that
fails to load keeps its reason, on one line, which the repository index shows and the log
says. Token ids are checked against the model's vocabulary (``vocabulary.py``) before ONNX
Runtime runs. A server with no model loaded is not ready, strict or not: it serves nothing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import logging
import math
import queue
import re
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from xdevice._errors import ConfigurationError, XDeviceError, message
from xdevice.serving.batcher import Batcher
from xdevice.serving.config import ModelConfig, Warmup
from xdevice.serving.metrics import Registry, Stats
from xdevice.serving.protocol import BadRequest, InferRequest
from xdevice.serving.repository import V2_DATATYPES, ModelNotFound, Repository
from xdevice.serving.session import Session
from xdevice.serving.vocabulary import Vocabulary, check_tokens, vocabularies

__all__ = ["Loaded", "Models", "check_request", "warmup_batches"]

logger = logging.getLogger("xdevice.serving")

#: seconds: a model whose recent runs took less runs on the event loop when its request is
#: the only one in flight (:meth:`Models.infer`); the longest a health probe then waits
INLINE_BELOW = 1e-3


@dataclasses.dataclass
class Loaded:
    """One version of a model, ready to serve."""

    name: str
    version: str
    session: Session
    config: ModelConfig
    stats: Stats
    batcher: Batcher | None
    instances: concurrent.futures.ThreadPoolExecutor  # one thread per instance: one run at a time each
    vocabulary: dict[str, Vocabulary] = dataclasses.field(default_factory=dict)  # token-id inputs
    sessions: Instances | None = None  # one session per instance thread (GPU), else ``session`` for all
    #: seconds the recent runs took (smoothed; inf until the first): what decides :data:`INLINE_BELOW`
    recent: float = math.inf

    def run(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Run checked ``inputs`` on this instance thread's session (called on an
        ``instances`` thread, or on the event loop where :meth:`Models.infer` says)."""
        return (self.sessions or self.session).run_checked(inputs)


class Instances:
    """One session per instance thread: on a GPU each session has its own CUDA stream, so
    ``instance_group { count: 2 }`` runs two executions at once instead of queueing them on
    one stream. Each thread of the instances' pool takes a session of its own as it starts
    (``bind``, the pool's initializer); there are as many sessions as threads."""

    def __init__(self, sessions: list[Session]):
        self._free: queue.SimpleQueue[Session] = queue.SimpleQueue()
        for session in sessions:
            self._free.put(session)
        self._local = threading.local()

    def bind(self) -> None:
        self._local.session = self._free.get_nowait()

    def run(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return self._local.session.run(inputs)

    def run_checked(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return self._local.session.run_checked(inputs)


class Models:
    """The repository's models as loaded sessions, by name and version."""

    def __init__(self, repository: Repository, registry: Registry, **session_options: Any):
        self.repository, self.registry = repository, registry
        self.session_options = session_options
        self.loaded: dict[str, dict[str, Loaded]] = {}
        self.failed: dict[str, str] = {}  # model -> why it is not served
        self.lock = threading.Lock()
        # loads run here, one at a time, off the event loop
        self.loader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="xdevice-load")

    # -- loading ----------------------------------------------------------------------------

    def load(
        self,
        name: str,
        *,
        log_failure: bool = True,
        config: ModelConfig | None = None,
        source: Repository | None = None,
    ) -> list[Loaded]:
        """Load every version of ``name`` its policy selects (replacing what was loaded).

        Args:
            log_failure: log a failure (False where the caller reports it itself).
            config: the configuration to load with, in place of the model's ``config.pbtxt``
                (a load request's ``config`` override).
            source: where the model's files are (a load request's ``file:`` overrides);
                default: the repository.

        Raises:
            XDeviceError: the model cannot be served; the reason is also kept for the index.
        """
        source = source or self.repository
        try:
            if config is None:
                config = source.config(name)
            elif config.device is None:
                config.device = self.repository.device
            versions = config.selects(source.versions(name))
            if not versions:
                raise ModelNotFound(source.unserved(name) or f"Model {name!r}: the configuration selects no version")
            ready = [self._version(name, str(v), config, source.file_of(name, v)) for v in versions]
        except XDeviceError as error:
            with self.lock:
                self.failed[name] = one_line(str(error))
            if log_failure:
                logger.error("model %r failed to load: %s", name, self.failed[name])
            raise
        with self.lock:
            self.loaded[name] = {m.version: m for m in ready}
            self.failed.pop(name, None)
        checked = "".join(f"; token ids of {k!r}: 0 <= id < {v.size}" for k, v in ready[-1].vocabulary.items())
        logger.info(
            "model %r ready: version%s %s on %s%s",
            name,
            "s" * (len(ready) > 1),
            ", ".join(m.version for m in ready),
            config.device,
            checked,
        )
        return ready

    def _version(self, name: str, version: str, config: ModelConfig, path: Path) -> Loaded:
        session = Session(
            path,
            device=config.device,
            name=name,
            warmup=not config.warmup,
            warmup_batches=warmup_batches(config),
            **self.session_options,
        )
        _declared(name, config, session)
        vocabulary = vocabularies(path, config)
        for sample in config.warmup:
            _warm(name, config, session, sample)
        stats = self.registry.of(name, version)
        sessions = None
        if config.instance_count > 1 and (config.device or "").startswith("gpu"):
            more = [
                Session(
                    path,
                    device=config.device,
                    name=name,
                    warmup=not config.warmup,
                    warmup_batches=warmup_batches(config),
                    **self.session_options,
                )
                for _ in range(config.instance_count - 1)
            ]
            sessions = Instances([session, *more])
        instances = concurrent.futures.ThreadPoolExecutor(
            config.instance_count,
            thread_name_prefix=f"xdevice-{name}-{version}",
            initializer=sessions.bind if sessions else None,
        )
        batcher = None
        if config.dynamic_batching:
            batcher = Batcher(
                (sessions or session).run_checked,  # as Loaded.run: each request was checked
                max_batch_size=config.max_batch_size,
                max_queue_delay=config.max_queue_delay_us / 1e6,
                executor=instances,
                stats=stats,
                instances=config.instance_count,
                preferred=config.preferred_batch_size,
                timeout=config.queue_timeout_us / 1e6,
                reject_late=config.timeout_action == "REJECT",
                max_queue_size=config.max_queue_size,
                name=f"{name} version {version}",
                # a fast model's merged runs on the event loop, as its lone requests (infer);
                # not where each instance thread has a session of its own (a GPU's streams)
                inline_below=INLINE_BELOW if sessions is None else 0.0,
            )
        return Loaded(name, version, session, config, stats, batcher, instances, vocabulary, sessions)

    async def reload(self, name: str, **overrides: Any) -> None:
        """(Re)load ``name`` off the event loop (``overrides`` as :meth:`load` takes them),
        then stop the versions it replaced."""
        old = list(self.loaded.get(name, {}).values())
        await asyncio.get_running_loop().run_in_executor(self.loader, functools.partial(self.load, name, **overrides))
        await self.retire(old)

    def unload(self, name: str) -> list[Loaded]:
        self.repository.config(name)  # an unknown name fails here, with the valid ones
        with self.lock:
            self.failed.pop(name, None)
            return list(self.loaded.pop(name, {}).values())

    @staticmethod
    async def retire(old: list[Loaded]) -> None:
        """Stop replaced or unloaded versions; the runs they already started still finish."""
        for loaded in old:
            if loaded.batcher is not None:
                await loaded.batcher.close()
            loaded.instances.shutdown(wait=False)

    async def close(self) -> None:
        """Stop every model, letting the runs already started finish, and the loader."""
        for loaded in self.all():
            await self.retire([loaded])
            loaded.instances.shutdown(wait=True)
        self.loader.shutdown(wait=True)

    # -- looking up -------------------------------------------------------------------------

    def get(self, name: str, version: str | None = None) -> Loaded:
        versions = self.loaded.get(name)
        if not versions:
            known = self.repository.models()
            if name in known:
                reason = self.failed.get(name)
                raise BadRequest(
                    message(
                        f"Model {name!r} is not loaded" + (f": {reason}" if reason else ""),
                        received=name,
                        fix=f"POST /v2/repository/models/{name}/load",
                    ),
                    status=400 if reason is None else 503,
                )
            raise BadRequest(message("Unknown model", received=name, choices=known), status=404)
        if version in (None, ""):
            return versions[max(versions, key=int)]  # the newest loaded version, as Triton does
        if version not in versions:
            raise BadRequest(
                message(
                    f"Model {name!r} has no such version loaded", received=version, choices=sorted(versions, key=int)
                ),
                status=404,
            )
        return versions[version]

    def ready(self, strict: bool) -> bool:
        """Strict: every model of the repository is loaded and ready (Triton's
        ``--strict-readiness``); otherwise: at least one model is loaded."""
        return not self.unready(strict)

    def unready(self, strict: bool) -> str:
        """Why the server is not ready, in one line ("" when it is)."""
        if not self.loaded:
            return self.nothing_served()
        if not strict:
            return ""
        failed = sorted(self.failed)
        missing = sorted(set(self.repository.models()) - set(self.loaded) - set(failed))
        cold = sorted(m.name for versions in self.loaded.values() for m in versions.values() if not m.session.ready)
        parts = [
            f"{what}: {', '.join(names)}"
            for what, names in (("failed to load", failed), ("not loaded", missing), ("warming up", cold))
            if names
        ]
        if not parts:
            return ""
        return message(
            f"Not ready: not every model of the repository is ({'; '.join(parts)})",
            fix="POST /v2/repository/index gives each reason; --no-strict-readiness: ready once one model is",
        )

    def nothing_served(self) -> str:
        """Why no model is loaded, in one line, with the fix."""
        root, names = self.repository.root, self.repository.models()
        if names:
            return message(
                f"Not ready: none of the repository's models is loaded ({', '.join(names)})",
                fix="POST /v2/repository/index gives each reason",
            )
        strays = self.repository.strays()
        if strays:
            return f"Not ready: the repository {root} holds no model: {strays[0]}"
        return message(
            f"Not ready: the repository {root} holds no model",
            expected=f"{root}/<model>/<version>/model.onnx",
            fix=f"put a model at {root}/<model>/1/model.onnx, then POST /v2/repository/models/<model>/load",
        )

    def index(self) -> list[dict]:
        """One entry per model and version folder (and per model with none), with its state
        and, when it is not served, why."""
        entries = []
        for entry in self.repository.index():
            name, version = entry["name"], entry["version"]
            loaded = self.loaded.get(name, {})
            if version in loaded:
                entries.append({"name": name, "version": version, "state": "READY", "reason": ""})
                continue
            reason = self.failed.get(name) or entry["reason"]
            if not reason and name in self.loaded:
                reason = "not selected by the model's version_policy"
            elif not reason:
                reason = "unloaded"
            entries.append({"name": name, "version": version, "state": "UNAVAILABLE", "reason": reason})
        return entries

    def all(self) -> list[Loaded]:
        return [m for versions in list(self.loaded.values()) for m in versions.values()]

    def metadata(self, name: str, version: str | None) -> dict:
        """The protocol's model metadata: name, versions loaded, platform, inputs, outputs."""
        loaded = self.get(name, version)
        return {
            "name": loaded.name,
            "versions": sorted(self.loaded.get(name, {}), key=int),
            "platform": "onnxruntime_onnx",
            "inputs": [_spec(s) for s in loaded.session.inputs],
            "outputs": [_spec(s) for s in loaded.session.outputs],
        }

    def statistics(self, name: str | None, version: str | None) -> list[dict]:
        """Triton's statistics of one model (one version, or every loaded one), or of every model."""
        if name is None:
            chosen = self.all()
        elif version:
            chosen = [self.get(name, version)]
        else:
            self.get(name)  # an unknown or unloaded model fails here
            chosen = list(self.loaded.get(name, {}).values())
        return [m.stats.snapshot(m.name, m.version) for m in chosen]

    # -- serving one request -----------------------------------------------------------------

    async def infer(self, loaded: Loaded, request: InferRequest, alone: bool = False) -> dict[str, np.ndarray]:
        """The outputs for one request (its inputs checked first, so a bad request never
        fails the batch it would have joined); failures are counted here, successes by the
        caller once the response is encoded (:meth:`finished`).

        The model runs on an instance thread, off the event loop; but a request that is
        ``alone`` (no other in flight) on a model whose recent runs took under
        :data:`INLINE_BELOW` runs on the event loop itself, where the model has no batcher or
        its batcher stepped aside (batching did not pay): handing a 0.1 ms run to a thread and
        back costs more than the run (two wake-ups and the GIL passed back and forth), and with
        nothing else in flight there is no one for the loop to serve meanwhile. A batcher's
        merged runs under :data:`INLINE_BELOW` run on the event loop too (``Batcher``).
        """
        start = time.perf_counter()
        try:
            inputs = check_request(loaded, request)
            timeout = _timeout(loaded.config, request)
            loaded.stats.phase("compute_input", time.perf_counter() - start)
            batcher = loaded.batcher
            if batcher is not None:
                inline = alone and batcher.recent < INLINE_BELOW and loaded.sessions is None
                return await batcher.submit(inputs, timeout=timeout, inline=inline)
            if alone and loaded.recent < INLINE_BELOW and loaded.sessions is None:
                return _run(loaded, inputs)
            return await asyncio.get_running_loop().run_in_executor(loaded.instances, _run, loaded, inputs)
        except Exception:
            loaded.stats.request(False, time.perf_counter() - start)
            raise

    @staticmethod
    def finished(loaded: Loaded, start: float, encoded: float) -> None:
        """A request answered: ``start`` when it arrived, ``encoded`` when its outputs were."""
        now = time.perf_counter()
        loaded.stats.phase("compute_output", now - encoded)
        loaded.stats.request(True, now - start)


def _run(loaded: Loaded, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    start = time.perf_counter()
    outputs = loaded.run(inputs)
    seconds = time.perf_counter() - start
    rows = next(iter(inputs.values())).shape[0] if loaded.config.max_batch_size > 0 else 1
    loaded.stats.executed(rows, seconds)
    loaded.recent = seconds if loaded.recent == math.inf else 0.8 * loaded.recent + 0.2 * seconds
    return outputs


def _timeout(config: ModelConfig, request: InferRequest) -> float | None:
    """Seconds this request may wait in the queue: the queue policy's, or the request's own
    ``timeout`` (microseconds) where the policy allows it."""
    asked = request.parameters.get("timeout")
    if asked is not None:
        if not config.allow_timeout_override:
            raise BadRequest(
                message(
                    f"Model {config.name!r} does not let a request set its own timeout",
                    received=f"timeout={asked}",
                    fix="drop the timeout parameter, or set allow_timeout_override",
                )
            )
        if not isinstance(asked, int) or isinstance(asked, bool) or asked < 0:
            raise BadRequest(message("timeout is in microseconds", expected="a whole number >= 0", received=asked))
        return asked / 1e6 if asked else None
    return config.queue_timeout_us / 1e6 if config.queue_timeout_us else None


def check_request(loaded: Loaded, request: InferRequest) -> dict[str, np.ndarray]:
    """The request's inputs checked by the session (names, datatypes, shapes), plus what only
    the server knows: the outputs asked for and the batch limits."""
    try:
        inputs = loaded.session.check_inputs(request.inputs)
    except XDeviceError as error:
        raise BadRequest(str(error)) from None
    check_tokens(loaded.name, loaded.vocabulary, inputs)
    outputs = [s.name for s in loaded.session.outputs]
    for name, _ in request.outputs or []:
        if name not in outputs:
            raise BadRequest(message(f"Model {loaded.name!r} has no such output", received=name, choices=outputs))
    rows = {value.shape[0] for value in inputs.values() if value.ndim}
    limit = loaded.config.max_batch_size
    if limit > 0 and rows and max(rows) > limit:
        raise BadRequest(
            message(
                f"The batch is larger than model {loaded.name!r} allows",
                expected=f"at most {limit} rows (max_batch_size)",
                received=max(rows),
            )
        )
    if loaded.batcher is not None and len(rows) > 1:
        raise BadRequest(message("Inputs disagree on the batch size", received=sorted(rows)))
    return inputs


def _declared(name: str, config: ModelConfig, session: Session) -> None:
    """The inputs and outputs the configuration declares, checked against the model."""
    batched = config.max_batch_size > 0
    for role, declared, actual in (
        ("input", config.inputs, session.inputs),
        ("output", config.outputs, session.outputs),
    ):
        specs = {s.name: s for s in actual}
        for tensor in declared:
            where = f"{config.source}: {role} {tensor.name!r}"
            if tensor.name not in specs:
                raise ConfigurationError(
                    message(f"{where} is not one of the model's {role}s", received=tensor.name, choices=list(specs))
                )
            spec = specs[tensor.name]
            if tensor.dtype != spec.dtype:
                raise ConfigurationError(
                    message(f"{where} has the model's type wrong", expected=spec.dtype, received=tensor.dtype)
                )
            shape = spec.shape[1:] if batched else spec.shape
            if batched and spec.shape and spec.shape[0] not in (None,):
                raise ConfigurationError(
                    message(
                        f"{config.source}: max_batch_size > 0 but {role} {tensor.name!r} has a fixed first "
                        f"dimension ({spec.shape[0]})",
                        fix="set max_batch_size: 0, or export with a dynamic batch",
                    )
                )
            if len(tensor.dims) != len(shape) or any(
                d != -1 and m is not None and d != m for d, m in zip(tensor.dims, shape)
            ):
                raise ConfigurationError(
                    message(
                        f"{where} has dims that do not fit the model",
                        expected=str(_dims(shape)),
                        received=str(list(tensor.dims)),
                        fix="the batch axis is left out of dims when max_batch_size > 0" if batched else None,
                    )
                )


def one_line(text: str) -> str:
    """``text`` on one line: each line break and the indentation after it become one space."""
    return re.sub(r"\s*\n\s*", " ", text.strip())


def _dims(shape: tuple) -> list[int]:
    return [-1 if d is None else d for d in shape]


def _warm(name: str, config: ModelConfig, session: Session, sample: Warmup) -> None:
    """Run one ``model_warmup`` sample ``count`` times; a failure is a failure to load."""
    rng = np.random.default_rng(0)
    feeds = {}
    for input_name, (dtype, dims, how, file) in sample.inputs.items():
        shape = ((max(sample.batch_size, 1),) if config.max_batch_size > 0 else ()) + tuple(dims)
        feeds[input_name] = _sample(dtype, shape, how, file, rng)
    try:
        for _ in range(sample.count):
            session.run(feeds)
    except XDeviceError as error:
        raise ConfigurationError(
            message(f"{config.source}: warm-up {sample.name!r} of model {name!r} failed", received=str(error)[:500])
        ) from error


def _sample(dtype: str, shape: tuple, how: str, file: Any, rng: np.random.Generator) -> np.ndarray:
    count = int(np.prod(shape))
    if dtype == "string":
        if how == "file":
            from xdevice.serving.protocol import decode_bytes

            return decode_bytes(file.read_bytes()).reshape(shape)
        return np.array(
            [b"" if how == "zero" else str(v).encode() for v in rng.integers(0, 100, count)], dtype=object
        ).reshape(shape)
    if dtype == "bfloat16":
        import ml_dtypes

        numpy_dtype = np.dtype(ml_dtypes.bfloat16)
    else:
        numpy_dtype = np.dtype(dtype)
    if how == "file":
        return np.frombuffer(file.read_bytes(), dtype=numpy_dtype.newbyteorder("<")).astype(numpy_dtype).reshape(shape)
    if how == "zero":
        return np.zeros(shape, numpy_dtype)
    if numpy_dtype.kind == "f" or dtype == "bfloat16":
        return rng.normal(size=shape).astype(numpy_dtype)
    if numpy_dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    return rng.integers(0, 8, size=shape).astype(numpy_dtype)


def _spec(spec) -> dict:
    shape = [-1 if d is None else d for d in spec.shape]
    return {"name": spec.name, "datatype": V2_DATATYPES[spec.dtype], "shape": shape}


def warmup_batches(config: ModelConfig) -> tuple[int, ...]:
    """The batch sizes a model is warmed up at before it is ready: on a GPU with dynamic
    batching, every size the batcher can form (the CUDA provider searches cuDNN's algorithms
    once per new shape, and a search met while serving is a latency spike); else 1.

    >>> warmup_batches(ModelConfig("m", max_batch_size=4, dynamic_batching=True, device="gpu:0"))
    (1, 2, 3, 4)
    >>> warmup_batches(ModelConfig("m", max_batch_size=4, dynamic_batching=True, device="cpu"))
    (1,)
    """
    if config.dynamic_batching and config.max_batch_size > 0 and (config.device or "").startswith("gpu"):
        return tuple(range(1, config.max_batch_size + 1))
    return (1,)
