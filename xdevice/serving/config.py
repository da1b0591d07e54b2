"""Triton's model configuration (``config.pbtxt`` or ``config.json``), read exactly.

The file is parsed with protobuf (``text_format``, ``json_format``) against Triton's own
``ModelConfig`` message, as ``tritonclient[grpc]`` ships it (``model_config_pb2``): every
field Triton knows parses, and an unknown one is an error naming the file, the line and the
nearest field. What the server uses is read into :class:`ModelConfig`; what xdevice does not
do (ensembles, sequence batching, priority queues, other platforms, ...) is refused by name
when the model loads, never ignored.

Decisions, where Triton leaves a choice:
- ``instance_group``: every group on the same device; their counts add up. ``KIND_AUTO`` (and
  no ``instance_group``) runs on the server's device, ``xdevice serve --device`` (the CPU
  unless given), as Triton puts it on a GPU where it has one.
- ``version_policy``: ``latest`` (the newest ``num_versions``, default 1), ``all``, or
  ``specific``; every version selected is loaded and addressable by number.
- ``model_warmup``: ``zero_data``, ``random_data`` (seeded, so a warm-up is repeatable) or
  ``input_data_file`` (raw little-endian bytes in ``<model>/warmup/``), run ``count`` times
  before the model reports ready.
- ``dynamic_batching.default_queue_policy``: a request that waited longer than
  ``default_timeout_microseconds`` is rejected (``REJECT``) or runs anyway (``DELAY``); a
  request may shorten its own timeout (``timeout`` parameter) when ``allow_timeout_override``;
  beyond ``max_queue_size`` waiting requests a new one is refused.
- ``parameters``: one key, ``vocab_size`` (``parameters { key: "vocab_size" value {
  string_value: "100" } }``): the token ids a request may send are ``0 <= id < vocab_size``,
  overriding the vocabulary read from the graph (see ``serving/vocabulary.py``). Triton's
  ``ModelInput`` has no parameters, so the key is the model's; any other key is refused.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from xdevice._errors import ConfigurationError, message

__all__ = ["ModelConfig", "TensorConfig", "Warmup", "parse_config", "read_config", "TRITON_TYPES"]

#: Triton's TYPE_* -> numpy dtype name ("string" for TYPE_STRING)
TRITON_TYPES = {
    "TYPE_BOOL": "bool",
    "TYPE_UINT8": "uint8",
    "TYPE_UINT16": "uint16",
    "TYPE_UINT32": "uint32",
    "TYPE_UINT64": "uint64",
    "TYPE_INT8": "int8",
    "TYPE_INT16": "int16",
    "TYPE_INT32": "int32",
    "TYPE_INT64": "int64",
    "TYPE_FP16": "float16",
    "TYPE_FP32": "float32",
    "TYPE_FP64": "float64",
    "TYPE_STRING": "string",
    "TYPE_BF16": "bfloat16",
}
_OURS = {"platform": "onnxruntime_onnx", "backend": "onnxruntime", "default_model_filename": "model.onnx"}
#: fields whose presence asks for something xdevice does not do: field -> what it is
_REFUSED = {
    "sequence_batching": "stateful sequence models",
    "ensemble_scheduling": "ensembles",
    "batch_input": "batch inputs",
    "batch_output": "batch outputs",
    "runtime": "a custom runtime",
    "cc_model_filenames": "per-GPU model files",
    "metric_tags": "custom metric labels",
    "optimization": "ONNX Runtime tuning (it runs with its defaults)",
    "model_operations": "model operations",
    "model_transaction_policy": "decoupled models",
    "model_repository_agents": "repository agents",
    "response_cache": "the response cache",
    "model_metrics": "custom metrics",
}


@dataclasses.dataclass(frozen=True)
class TensorConfig:
    """A declared input or output: name, numpy dtype name, dims (-1: any; the batch axis
    left out when ``max_batch_size`` > 0), and whether an input may be left out."""

    name: str
    dtype: str
    dims: tuple[int, ...]
    optional: bool = False
    labels: tuple[str, ...] = ()  # an output's class labels, from its label_filename


@dataclasses.dataclass(frozen=True)
class Warmup:
    """One ``model_warmup`` sample: each input as ``(dtype, dims, how, file)``, ``how`` one of
    ``"zero"``, ``"random"``, ``"file"``; run ``count`` times at ``batch_size``."""

    name: str
    batch_size: int
    count: int
    inputs: dict[str, tuple[str, tuple[int, ...], str, Path | None]]


@dataclasses.dataclass
class ModelConfig:
    """What the server needs from a model's configuration; the defaults are Triton's."""

    name: str
    max_batch_size: int = 0  # 0: no batching, inputs keep their full declared shapes
    dynamic_batching: bool = False  # True when the config has a dynamic_batching block
    max_queue_delay_us: int = 0
    preferred_batch_size: tuple[int, ...] = ()
    queue_timeout_us: int = 0  # default_queue_policy.default_timeout_microseconds; 0: none
    timeout_action: str = "REJECT"  # or "DELAY"
    allow_timeout_override: bool = False
    max_queue_size: int = 0  # 0: unbounded
    instance_count: int = 1
    device: str | None = None  # "cpu" or "gpu:N"; None (KIND_AUTO, no instance_group): the server's
    version_policy: tuple = ("latest", 1)  # ("latest", n), ("all",) or ("specific", (1, 3))
    inputs: tuple[TensorConfig, ...] = ()
    outputs: tuple[TensorConfig, ...] = ()
    warmup: tuple[Warmup, ...] = ()
    source: str = ""  # the file it was read from ("" for Triton's defaults)
    vocab_size: int | None = None  # parameters { key: "vocab_size" }: token ids are 0 <= id < vocab_size

    def selects(self, versions: list[int]) -> list[int]:
        """The versions (of those on disk, oldest first) this policy serves."""
        kind = self.version_policy[0]
        if kind == "all":
            return list(versions)
        if kind == "specific":
            return [v for v in versions if v in self.version_policy[1]]
        return list(versions)[-self.version_policy[1] :]


def read_config(model_dir: Path | str) -> ModelConfig:
    """The model's ``config.pbtxt`` (or ``config.json``); Triton's defaults when there is none.

    Raises:
        ConfigurationError: the file does not parse as Triton's ``ModelConfig``, or asks
            for something xdevice does not do; the message names the file and the line.

    >>> read_config(Path("repo/resnet")).device  # doctest: +SKIP
    'gpu:1'
    """

    model_dir = Path(model_dir)
    for source, fmt in ((model_dir / "config.pbtxt", "text"), (model_dir / "config.json", "json")):
        if source.is_file():
            return parse_config(source.read_text(encoding="utf-8"), model_dir, str(source), fmt)
    return ModelConfig(name=model_dir.name)


def parse_config(text: str, model_dir: Path | str, source: str, fmt: str = "json") -> ModelConfig:
    """Triton's ``ModelConfig`` from ``text``, protobuf's text format (``"text"``) or its JSON
    form (``"json"``: a load request's ``config`` override), for the model in ``model_dir``;
    ``source`` is what errors name.

    >>> parse_config('{"max_batch_size": 8}', "repo/mlp", "the load request's config").max_batch_size
    8
    """
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    reader: Any = text_format if fmt == "text" else json_format
    proto = model_config_pb2.ModelConfig()
    try:
        reader.Parse(text, proto)
    except reader.ParseError as error:
        raise _parse_error(Path(source), str(error)) from None
    return _read(proto, Path(model_dir), source, text)


def _parse_error(source: Path, text: str) -> ConfigurationError:
    """protobuf's error, said our way: the file and line, and for an unknown field the
    fields that message has and the nearest one."""
    where = re.match(r"(\d+):(\d+) : (.*)", text, re.S)
    line, what = (f", line {where[1]}", where[3]) if where else ("", text.splitlines()[0])
    unknown = re.search(r'Message type "([\w.]+)" has no field named "(\w+)"', what)
    if unknown:
        from google.protobuf import descriptor_pool

        fields = [f.name for f in descriptor_pool.Default().FindMessageTypeByName(unknown[1]).fields]
        block = unknown[1].split(".")[-1]
        return ConfigurationError(
            message(f"{source}{line}: unknown field {unknown[2]!r} in {block}", received=unknown[2], choices=fields)
        )
    return ConfigurationError(
        message(f"{source}{line}: {what.rstrip('.')}", expected="Triton's model configuration (protobuf text format)")
    )


def _read(proto: Any, model_dir: Path, source: str, text: str) -> ModelConfig:
    def refuse(field: str, what: str, **parts: Any) -> ConfigurationError:
        return ConfigurationError(message(f"{source}{_line(text, field)}: {what}", **parts))

    present = {f.name for f, _ in proto.ListFields()}
    for field, what in _REFUSED.items():
        if field in present:
            raise refuse(field, f"{field!r} ({what}) is not supported by xdevice serve", fix=f"remove {field!r}")
    name = proto.name or model_dir.name
    if name != model_dir.name:
        raise refuse("name", "the model name must match its folder name", expected=repr(model_dir.name), received=name)
    for field, ours in _OURS.items():
        value = getattr(proto, field)
        if value not in ("", ours):
            raise refuse(field, f"unsupported {field}", expected=repr(ours), received=value)
    if proto.max_batch_size < 0:
        raise refuse("max_batch_size", "max_batch_size must be >= 0", received=proto.max_batch_size)
    config = ModelConfig(name=name, max_batch_size=proto.max_batch_size, source=source)
    if proto.HasField("dynamic_batching"):
        _batching(config, proto.dynamic_batching, refuse)
    _instances(config, proto.instance_group, refuse)
    _versions(config, proto.version_policy, refuse)
    config.inputs = tuple(_tensor(t, "input", refuse) for t in proto.input)
    config.outputs = tuple(_tensor(t, "output", refuse, model_dir) for t in proto.output)
    config.warmup = tuple(_warmup(w, model_dir, refuse) for w in proto.model_warmup)
    config.vocab_size = _parameters(proto.parameters, refuse)
    return config


def _parameters(parameters: Any, refuse) -> int | None:
    """The one parameter xdevice reads, ``vocab_size``; any other is refused by name."""
    for key in parameters:
        if key != "vocab_size":
            raise refuse(
                "parameters",
                f"parameter {key!r} is not supported by xdevice serve",
                received=key,
                choices=["vocab_size"],
            )
    if "vocab_size" not in parameters:
        return None
    value = parameters["vocab_size"].string_value
    if not value.isdigit() or int(value) < 1:
        raise refuse(
            "vocab_size", "vocab_size is the number of token ids", expected="a whole number >= 1", received=value
        )
    return int(value)


def _batching(config: ModelConfig, batching: Any, refuse) -> None:
    if config.max_batch_size == 0:
        raise refuse(
            "dynamic_batching",
            "dynamic_batching needs max_batch_size > 0",
            received=0,
            fix="set max_batch_size, or remove dynamic_batching",
        )
    priorities = [f.name for f, _ in batching.ListFields() if "priority" in f.name]
    if priorities:
        raise refuse(
            priorities[0],
            "priority levels are not supported by xdevice serve",
            fix="remove priority_levels, default_priority_level and priority_queue_policy",
        )
    if batching.preserve_ordering:
        raise refuse(
            "preserve_ordering",
            "preserve_ordering is not supported: responses go back as their batches finish",
            fix="remove preserve_ordering",
        )
    config.dynamic_batching = True
    config.max_queue_delay_us = batching.max_queue_delay_microseconds
    config.preferred_batch_size = tuple(batching.preferred_batch_size)
    too_big = [b for b in config.preferred_batch_size if not 0 < b <= config.max_batch_size]
    if too_big:
        raise refuse(
            "preferred_batch_size",
            "preferred_batch_size out of range",
            expected=f"sizes from 1 to max_batch_size={config.max_batch_size}",
            received=too_big,
        )
    if batching.HasField("default_queue_policy"):
        policy = batching.default_queue_policy
        config.queue_timeout_us = policy.default_timeout_microseconds
        config.timeout_action = "DELAY" if policy.timeout_action == policy.DELAY else "REJECT"
        config.allow_timeout_override = policy.allow_timeout_override
        config.max_queue_size = policy.max_queue_size


def _instances(config: ModelConfig, groups: Any, refuse) -> None:
    devices, count = set(), 0
    for group in groups:
        for field in ("rate_limiter", "secondary_devices", "profile", "passive", "host_policy"):
            if group.HasField(field) if field == "rate_limiter" else getattr(group, field):
                raise refuse(field, f"instance_group {field} is not supported by xdevice serve", fix=f"remove {field}")
        kind = group.Kind.Name(group.kind)
        if kind not in ("KIND_AUTO", "KIND_CPU", "KIND_GPU"):
            raise refuse(
                "kind", "unsupported instance_group kind", received=kind, choices=["KIND_AUTO", "KIND_CPU", "KIND_GPU"]
            )
        gpus = list(group.gpus) or [0]
        if kind == "KIND_GPU" and len(gpus) > 1:
            raise refuse(
                "gpus",
                "one GPU per model: instance_group lists several",
                received=gpus,
                fix="list one GPU, or serve the model once per GPU from separate servers",
            )
        devices.add(f"gpu:{gpus[0]}" if kind == "KIND_GPU" else "cpu" if kind == "KIND_CPU" else None)
        count += group.count or 1
    if len(devices) > 1:
        raise refuse(
            "instance_group", "every instance_group must use the same device", received=sorted(map(str, devices))
        )
    if devices:
        config.device, config.instance_count = devices.pop(), count


def _versions(config: ModelConfig, policy: Any, refuse) -> None:
    kind = policy.WhichOneof("policy_choice")
    if kind == "all":
        config.version_policy = ("all",)
    elif kind == "specific":
        if not policy.specific.versions:
            raise refuse("specific", "version_policy specific lists no version")
        config.version_policy = ("specific", tuple(sorted(policy.specific.versions)))
    elif kind == "latest":
        config.version_policy = ("latest", policy.latest.num_versions or 1)


def _tensor(tensor: Any, role: str, refuse, model_dir: Path | None = None) -> TensorConfig:
    from tritonclient.grpc import model_config_pb2

    labels: tuple[str, ...] = ()
    if model_dir is not None and tensor.label_filename:  # an output's labels (classification)
        from xdevice.serving.classification import read_labels

        path = model_dir / tensor.label_filename
        if not path.resolve().is_relative_to(model_dir.resolve()):  # a load override may not read elsewhere
            raise refuse(
                "label_filename",
                f"{role} {tensor.name!r}: label_filename must name a file in the model's folder",
                received=tensor.label_filename,
            )
        try:
            labels = read_labels(path)
        except OSError as error:
            raise refuse(
                "label_filename",
                f"{role} {tensor.name!r}: cannot read its label_filename",
                received=f"{model_dir / tensor.label_filename}: {error.strerror}",
                fix="put the labels file (one label per line) in the model's folder",
            ) from None
    for field in ("reshape", "is_shape_tensor", "allow_ragged_batch", "is_non_linear_format_io"):
        if field in {f.name for f, _ in tensor.ListFields()}:
            raise refuse(
                field, f"{role} {tensor.name!r}: {field} is not supported by xdevice serve", fix=f"remove {field}"
            )
    type_name = model_config_pb2.DataType.Name(tensor.data_type)
    if type_name not in TRITON_TYPES:
        raise refuse(
            tensor.name,
            f"{role} {tensor.name!r} has an unsupported data_type",
            received=type_name,
            choices=list(TRITON_TYPES),
        )
    return TensorConfig(
        tensor.name, TRITON_TYPES[type_name], tuple(tensor.dims), bool(getattr(tensor, "optional", False)), labels
    )


def _warmup(sample: Any, model_dir: Path, refuse) -> Warmup:
    from tritonclient.grpc import model_config_pb2

    inputs = {}
    for name, spec in sample.inputs.items():
        how = spec.WhichOneof("input_data_type")
        if how is None:
            raise refuse(
                "model_warmup",
                f"warm-up {sample.name!r}: input {name!r} says no data",
                expected="zero_data, random_data or input_data_file",
            )
        file = None
        if how == "input_data_file":
            folder = (model_dir / "warmup").resolve()
            file = (folder / spec.input_data_file).resolve()
            if folder not in file.parents or not file.is_file():
                raise refuse(
                    "input_data_file",
                    f"warm-up {sample.name!r}: no file {spec.input_data_file!r} inside {folder}",
                    fix="put the raw input bytes in <model>/warmup/",
                )
        dtype = TRITON_TYPES.get(model_config_pb2.DataType.Name(spec.data_type))
        if dtype is None:
            raise refuse("model_warmup", f"warm-up {sample.name!r}: input {name!r} has an unsupported data_type")
        inputs[name] = (dtype, tuple(spec.dims), {"zero_data": "zero", "random_data": "random"}.get(how, "file"), file)
    return Warmup(sample.name, sample.batch_size, sample.count or 1, inputs)


def _line(text: str, field: str) -> str:
    """``", line N"`` of the first line that names ``field`` (for errors found after parsing)."""
    for number, line in enumerate(text.splitlines(), 1):
        if re.search(rf"\b{re.escape(field)}\b", line.split("#", 1)[0]):
            return f", line {number}"
    return ""
