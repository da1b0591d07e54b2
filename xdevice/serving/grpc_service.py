"""The Open Inference Protocol over gRPC: Triton's / KServe's ``GRPCInferenceService``.

The messages and the service are the ones ``tritonclient[grpc]`` ships (``service_pb2``,
``service_pb2_grpc``), so an unmodified ``tritonclient.grpc`` client, or KServe's, talks to
it. It runs on the HTTP server's event loop, a thin translator over the same
:class:`~xdevice.serving.dataplane.DataPlane` as HTTP: the same models, batcher, checks,
statistics, model control, classification, system and CUDA shared memory, log and trace settings
and errors (the data plane's table gives each failure its gRPC code); streaming answers
``UNIMPLEMENTED``.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from xdevice._errors import message
from xdevice.serving.dataplane import DataPlane, error_status
from xdevice.serving.protocol import (
    BadRequest,
    InferRequest,
    encode_bytes,
    input_region,
    numpy_dtype,
    output_options,
    tensor_from_bytes,
    v2_datatype,
)
from xdevice.serving.repository import FROM_V2

logger = logging.getLogger("xdevice.serving")

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


async def start_grpc(plane: DataPlane, host: str, port: int) -> tuple[Any, int]:
    """Start the service over ``plane`` on ``host:port`` (0: a free port); returns the server
    and its port. The port is this server's alone (no ``SO_REUSEPORT``): a port another
    process holds fails here instead of splitting the requests between the two."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", plane.max_body),
            ("grpc.max_send_message_length", plane.max_body),
            ("grpc.so_reuseport", 0),
        ]
    )
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(_service(plane), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    return server, bound


def _service(plane: DataPlane) -> Any:
    import grpc
    from google.protobuf import json_format
    from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

    def handled(method):
        async def call(self, request, context):
            try:
                return await method(self, request, context)
            except Exception as failure:  # every failure is answered, as the data plane's table says
                status, code, text = error_status(failure)
                if status == 500:
                    logger.exception("unexpected failure in %s", method.__name__)
                await context.abort(grpc.StatusCode[code], text)

        return call

    class Service(service_pb2_grpc.GRPCInferenceServiceServicer):
        @handled
        async def ServerLive(self, request, context):
            return service_pb2.ServerLiveResponse(**plane.live())

        @handled
        async def ServerReady(self, request, context):
            return service_pb2.ServerReadyResponse(ready=plane.ready()[0])

        @handled
        async def ModelReady(self, request, context):
            try:
                ready = plane.model_ready(request.name, request.version)["ready"]
            except BadRequest:
                ready = False
            return service_pb2.ModelReadyResponse(ready=ready)

        @handled
        async def ServerMetadata(self, request, context):
            return service_pb2.ServerMetadataResponse(**plane.server_metadata())

        @handled
        async def ModelMetadata(self, request, context):
            info = plane.model_metadata(request.name, request.version)
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
            config = plane.model_config(request.name, request.version)
            return service_pb2.ModelConfigResponse(config=json_format.ParseDict(config, model_config_pb2.ModelConfig()))

        @handled
        async def ModelStatistics(self, request, context):
            found = plane.statistics(request.name, request.version)
            return json_format.ParseDict(found, service_pb2.ModelStatisticsResponse())

        @handled
        async def RepositoryIndex(self, request, context):
            index = service_pb2.RepositoryIndexResponse.ModelIndex
            return service_pb2.RepositoryIndexResponse(
                models=[index(**entry) for entry in plane.index(ready_only=request.ready)]
            )

        @handled
        async def RepositoryModelLoad(self, request, context):
            await plane.load(request.model_name, _parameters(request.parameters))
            return service_pb2.RepositoryModelLoadResponse()

        @handled
        async def RepositoryModelUnload(self, request, context):
            await plane.unload(request.model_name)
            return service_pb2.RepositoryModelUnloadResponse()

        @handled
        async def ModelInfer(self, request, context):
            async def decode():
                return _request(request)

            def encode(loaded, parsed, outputs):
                return _response(service_pb2, loaded.name, loaded.version, request.id, parsed, outputs)

            return await plane.infer(request.model_name, request.model_version, decode, encode)

        @handled
        async def LogSettings(self, request, context):
            changes = {key: _parameter(value) for key, value in request.settings.items()}
            settings = plane.log(changes)
            value = service_pb2.LogSettingsResponse.SettingValue
            return service_pb2.LogSettingsResponse(settings={key: _log_value(value, v) for key, v in settings.items()})

        @handled
        async def TraceSetting(self, request, context):
            changes = {key: list(value.value) or None for key, value in request.settings.items()}
            changes = {k: v[0] if v and k != "trace_level" else v for k, v in changes.items()}
            settings = plane.trace(changes, request.model_name or None)
            value = service_pb2.TraceSettingResponse.SettingValue
            return service_pb2.TraceSettingResponse(
                settings={key: value(value=v if isinstance(v, list) else [v]) for key, v in settings.items()}
            )

        @handled
        async def SystemSharedMemoryRegister(self, request, context):
            plane.register_system_memory(request.name, request.key, request.offset, request.byte_size)
            return service_pb2.SystemSharedMemoryRegisterResponse()

        @handled
        async def SystemSharedMemoryStatus(self, request, context):
            region = service_pb2.SystemSharedMemoryStatusResponse.RegionStatus
            found = plane.system_memory_status(request.name)
            return service_pb2.SystemSharedMemoryStatusResponse(regions={r["name"]: region(**r) for r in found})

        @handled
        async def SystemSharedMemoryUnregister(self, request, context):
            plane.unregister_system_memory(request.name)
            return service_pb2.SystemSharedMemoryUnregisterResponse()

        @handled
        async def CudaSharedMemoryRegister(self, request, context):
            plane.register_cuda_memory(request.name, request.raw_handle, request.device_id, request.byte_size)
            return service_pb2.CudaSharedMemoryRegisterResponse()

        @handled
        async def CudaSharedMemoryStatus(self, request, context):
            region = service_pb2.CudaSharedMemoryStatusResponse.RegionStatus
            found = plane.cuda_memory_status(request.name)
            return service_pb2.CudaSharedMemoryStatusResponse(regions={r["name"]: region(**r) for r in found})

        @handled
        async def CudaSharedMemoryUnregister(self, request, context):
            plane.unregister_cuda_memory(request.name)
            return service_pb2.CudaSharedMemoryUnregisterResponse()

    return Service()


def _parameter(value: Any) -> Any:
    """The value a protobuf ``oneof parameter_choice`` carries (None when it carries none)."""
    which = value.WhichOneof("parameter_choice")
    return getattr(value, which) if which else None


def _log_value(kind: Any, value: Any) -> Any:
    """A log setting as the response's ``SettingValue``: flags as bools, the level as a uint."""
    if isinstance(value, bool):
        return kind(bool_param=value)
    if isinstance(value, int):
        return kind(uint32_param=value)
    return kind(string_param=str(value))


def _parameters(parameters: Any) -> dict[str, Any]:
    """A protobuf parameter map (``ModelRepositoryParameter``, ``InferParameter``) as a dict
    of whichever value each one carries."""
    return {
        key: getattr(value, value.WhichOneof("parameter_choice"))
        for key, value in parameters.items()
        if value.WhichOneof("parameter_choice")
    }


def _request(request: Any) -> InferRequest:
    """A ``ModelInferRequest`` as the protocol-neutral request (raw or typed contents). Each
    field is read from the message once (every read of a protobuf field builds a Python
    object), and a parameter map that is empty is not looked into."""
    raw = list(request.raw_input_contents)
    tensors = []
    for tensor in request.inputs:
        name, parameters = tensor.name, tensor.parameters
        tensors.append((tensor, name, input_region(name, _parameters(parameters)) if parameters else None))
    inline = sum(region is None for _, _, region in tensors)
    if raw and len(raw) != inline:
        raise BadRequest(
            message(
                "raw_input_contents must hold one entry per input not in shared memory",
                expected=f"{inline} entries",
                received=len(raw),
            )
        )
    inputs, datatypes, in_regions = {}, {}, {}
    position = 0  # of the next input not in shared memory: its raw_input_contents entry
    for tensor, name, region in tensors:
        datatype, shape = tensor.datatype, tuple(tensor.shape)
        if datatype not in FROM_V2:
            raise BadRequest(
                message(f"Input {name!r} has an unknown datatype", received=datatype, choices=sorted(FROM_V2))
            )
        if any(d < 0 for d in shape):
            raise BadRequest(
                message(f"Input {name!r} has a bad shape", expected="non-negative dims", received=list(shape))
            )
        datatypes[name] = datatype
        if region is not None:
            in_regions[name] = (region, shape)
            continue
        inputs[name] = (
            tensor_from_bytes(name, raw[position], datatype, shape, "raw_input_contents")
            if raw
            else _typed(name, tensor.contents, datatype, shape)
        )
        position += 1
    parameters = request.parameters
    outputs, options = [], {}
    for output in request.outputs:
        name, asked = output.name, output.parameters
        outputs.append((name, True))
        if asked:  # an output without parameters has no options (classification, region)
            options[name] = output_options(name, _parameters(asked))
    return InferRequest(
        request.id or None,
        inputs,
        datatypes,
        outputs or None,
        True,
        _parameters(parameters) if parameters else {},
        in_regions,
        options,
    )


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
    dtype = numpy_dtype(datatype)
    try:
        wide = np.asarray(values)
        if dtype.kind in "iu" and wide.size and (wide.min() < np.iinfo(dtype).min or wide.max() > np.iinfo(dtype).max):
            raise OverflowError(f"values beyond {datatype}'s range")
        return wide.astype(dtype).reshape(shape)
    except OverflowError as error:
        raise BadRequest(message(f"Input {name!r}: the contents do not fit {datatype}", received=str(error))) from None


def _response(
    service_pb2: Any, model: str, version: str, request_id: str, request: InferRequest, outputs: dict[str, np.ndarray]
) -> Any:
    wanted = [name for name, _ in request.outputs] if request.outputs is not None else list(outputs)
    shared = [n for n in wanted if n in request.output_options and request.output_options[n].region is not None]
    response = service_pb2.ModelInferResponse(model_name=model, model_version=version, id=request_id)
    tensors, raw = response.outputs, response.raw_output_contents  # filled in place: no message copied
    # outputs in shared memory go last, with no raw entry: raw_output_contents[i] is still the
    # i-th output's, the way tritonclient's InferResult counts them
    for name in [n for n in wanted if n not in shared] + shared:
        value = outputs[name]
        datatype = v2_datatype(value)
        tensor = tensors.add(name=name, datatype=datatype, shape=value.shape)
        if name in shared:
            region = request.output_options[name].region
            assert region is not None  # shared lists only the outputs with a region
            tensor.parameters["shared_memory_region"].string_param = region.name
            tensor.parameters["shared_memory_byte_size"].int64_param = region.byte_size
            if region.offset:
                tensor.parameters["shared_memory_offset"].int64_param = region.offset
            continue
        raw.append(encode_bytes(value) if datatype == "BYTES" else np.ascontiguousarray(value).tobytes())
    return response
