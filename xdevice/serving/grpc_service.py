"""The Open Inference Protocol over gRPC: Triton's / KServe's ``GRPCInferenceService``.

The messages and the service are the ones ``tritonclient[grpc]`` ships (``service_pb2``,
``service_pb2_grpc``), so an unmodified ``tritonclient.grpc`` client, or KServe's, talks to
it. It runs on the HTTP server's event loop over the same :class:`~.models.Models`: the same
models, batcher, checks, statistics and errors. A ``BadRequest``'s HTTP status becomes the
gRPC code (400 ``INVALID_ARGUMENT``, 404 ``NOT_FOUND``, 408 ``DEADLINE_EXCEEDED``, 413
``RESOURCE_EXHAUSTED``, 503 ``UNAVAILABLE``); streaming, shared memory, tracing and log
settings answer ``UNIMPLEMENTED``.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

import numpy as np

from xdevice._errors import XDeviceError, message
from xdevice.serving.models import Models, load_model, model_info, retire, server_info, statistics
from xdevice.serving.protocol import BadRequest, InferRequest, decode_bytes, encode_bytes
from xdevice.serving.repository import FROM_V2, V2_DATATYPES, ModelNotFound, triton_config

__all__ = ["start_grpc"]

#: V2 datatype -> the InferTensorContents field that carries it (FP16 and BF16 travel raw only)
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


async def start_grpc(
    models: Models, loader: concurrent.futures.Executor, host: str, port: int, strict: bool, max_message: int
) -> tuple[Any, int]:
    """Start the service on ``host:port`` (0: a free port); returns the server and its port."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", max_message), ("grpc.max_send_message_length", max_message)]
    )
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(_service(models, loader, strict), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    return server, bound


def _service(models: Models, loader: concurrent.futures.Executor, strict: bool) -> Any:
    import grpc
    from google.protobuf import json_format
    from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

    codes = {
        400: grpc.StatusCode.INVALID_ARGUMENT,
        404: grpc.StatusCode.NOT_FOUND,
        408: grpc.StatusCode.DEADLINE_EXCEEDED,
        413: grpc.StatusCode.RESOURCE_EXHAUSTED,
        503: grpc.StatusCode.UNAVAILABLE,
    }

    def handled(method):
        async def call(self, request, context):
            try:
                return await method(self, request, context)
            except BadRequest as bad:
                await context.abort(codes.get(bad.status, grpc.StatusCode.INVALID_ARGUMENT), str(bad))
            except ModelNotFound as missing:
                await context.abort(grpc.StatusCode.NOT_FOUND, str(missing))
            except XDeviceError as failure:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(failure))

        return call

    class Service(service_pb2_grpc.GRPCInferenceServiceServicer):
        @handled
        async def ServerLive(self, request, context):
            return service_pb2.ServerLiveResponse(live=True)

        @handled
        async def ServerReady(self, request, context):
            return service_pb2.ServerReadyResponse(ready=models.ready(strict))

        @handled
        async def ModelReady(self, request, context):
            try:
                loaded = models.get(request.name, request.version)
            except BadRequest:
                return service_pb2.ModelReadyResponse(ready=False)
            return service_pb2.ModelReadyResponse(ready=loaded.session.ready)

        @handled
        async def ServerMetadata(self, request, context):
            return service_pb2.ServerMetadataResponse(**server_info())

        @handled
        async def ModelMetadata(self, request, context):
            info = model_info(models, request.name, request.version)
            tensor = service_pb2.ModelMetadataResponse.TensorMetadata
            return service_pb2.ModelMetadataResponse(
                name=info["name"],
                versions=info["versions"],
                platform=info["platform"],
                inputs=[tensor(**t) for t in info["inputs"]],
                outputs=[tensor(**t) for t in info["outputs"]],
            )

        @handled
        async def ModelConfig(self, request, context):
            loaded = models.get(request.name, request.version)
            config = triton_config(loaded.config, loaded.session.inputs, loaded.session.outputs)
            return service_pb2.ModelConfigResponse(config=json_format.ParseDict(config, model_config_pb2.ModelConfig()))

        @handled
        async def ModelStatistics(self, request, context):
            found = statistics(models, request.name or None, request.version or None)
            return json_format.ParseDict({"model_stats": found}, service_pb2.ModelStatisticsResponse())

        @handled
        async def RepositoryIndex(self, request, context):
            index = service_pb2.RepositoryIndexResponse.ModelIndex
            return service_pb2.RepositoryIndexResponse(
                models=[index(**entry) for entry in models.index() if not request.ready or entry["state"] == "READY"]
            )

        @handled
        async def RepositoryModelLoad(self, request, context):
            await load_model(models, loader, request.model_name)
            return service_pb2.RepositoryModelLoadResponse()

        @handled
        async def RepositoryModelUnload(self, request, context):
            await retire(models.unload(request.model_name))
            return service_pb2.RepositoryModelUnloadResponse()

        @handled
        async def ModelInfer(self, request, context):
            start = time.perf_counter()
            loaded = models.get(request.model_name, request.model_version)
            try:
                parsed = _request(request)
            except BadRequest:
                loaded.stats.request(False, time.perf_counter() - start)
                raise
            outputs = await models.infer(loaded, parsed)
            encoding = time.perf_counter()
            response = _response(service_pb2, loaded.name, loaded.version, request.id, parsed, outputs)
            models.finished(loaded, start, encoding)
            return response

    return Service()


def _request(request: Any) -> InferRequest:
    """A ``ModelInferRequest`` as the protocol-neutral request (raw or typed contents)."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise BadRequest(
            message(
                "raw_input_contents must hold one entry per input",
                expected=f"{len(request.inputs)} entries",
                received=len(raw),
            )
        )
    inputs, datatypes = {}, {}
    for i, tensor in enumerate(request.inputs):
        name, datatype, shape = tensor.name, tensor.datatype, tuple(tensor.shape)
        if datatype not in FROM_V2:
            raise BadRequest(
                message(f"Input {name!r} has an unknown datatype", received=datatype, choices=sorted(FROM_V2))
            )
        if any(d < 0 for d in shape):
            raise BadRequest(
                message(f"Input {name!r} has a bad shape", expected="non-negative dims", received=list(shape))
            )
        inputs[name] = _raw(name, raw[i], datatype, shape) if raw else _typed(name, tensor.contents, datatype, shape)
        datatypes[name] = datatype
    parameters = {
        key: getattr(value, value.WhichOneof("parameter_choice"))
        for key, value in request.parameters.items()
        if value.WhichOneof("parameter_choice")
    }
    outputs = [(o.name, True) for o in request.outputs] or None
    return InferRequest(request.id or None, inputs, datatypes, outputs, True, parameters)


def _raw(name: str, data: bytes, datatype: str, shape: tuple) -> np.ndarray:
    count = int(np.prod(shape))
    if datatype == "BYTES":
        items = decode_bytes(data, name)
        if len(items) != count:
            raise BadRequest(
                message(
                    f"Input {name!r}: the BYTES elements do not match the shape",
                    expected=f"{count} elements",
                    received=len(items),
                )
            )
        return items.reshape(shape)
    dtype = _dtype(datatype)
    if len(data) != count * dtype.itemsize:
        raise BadRequest(
            message(
                f"Input {name!r}: the raw contents do not match the shape",
                expected=f"{count * dtype.itemsize} bytes ({list(shape)} x {datatype})",
                received=f"{len(data)} bytes",
            )
        )
    return np.frombuffer(data, dtype=dtype.newbyteorder("<")).astype(dtype, copy=False).reshape(shape)


def _typed(name: str, contents: Any, datatype: str, shape: tuple) -> np.ndarray:
    field = _CONTENTS.get(datatype)
    if field is None:
        raise BadRequest(message(f"Input {name!r}: {datatype} travels in raw_input_contents only"))
    values = list(getattr(contents, field))
    if len(values) != int(np.prod(shape)):
        raise BadRequest(
            message(
                f"Input {name!r}: the contents do not match the shape",
                expected=f"{int(np.prod(shape))} values for shape {list(shape)}",
                received=f"{len(values)} values",
            )
        )
    if datatype == "BYTES":
        return np.array(values, dtype=object).reshape(shape)
    dtype = _dtype(datatype)
    try:
        wide = np.asarray(values)
        if dtype.kind in "iu" and wide.size and (wide.min() < np.iinfo(dtype).min or wide.max() > np.iinfo(dtype).max):
            raise OverflowError(f"values beyond {datatype}'s range")
        return wide.astype(dtype).reshape(shape)
    except OverflowError as error:
        raise BadRequest(message(f"Input {name!r}: the contents do not fit {datatype}", received=str(error))) from None


def _dtype(datatype: str) -> np.dtype:
    if datatype == "BF16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(FROM_V2[datatype])


def _response(
    service_pb2: Any, model: str, version: str, request_id: str, request: InferRequest, outputs: dict[str, np.ndarray]
) -> Any:
    wanted = [name for name, _ in request.outputs] if request.outputs is not None else list(outputs)
    tensors, raw = [], []
    for name in wanted:
        value = outputs[name]
        datatype = "BYTES" if value.dtype.kind in "OSU" else V2_DATATYPES[value.dtype.name]
        tensors.append(
            service_pb2.ModelInferResponse.InferOutputTensor(name=name, datatype=datatype, shape=list(value.shape))
        )
        raw.append(encode_bytes(value) if datatype == "BYTES" else np.ascontiguousarray(value).tobytes())
    return service_pb2.ModelInferResponse(
        model_name=model, model_version=version, id=request_id, outputs=tensors, raw_output_contents=raw
    )
