"""Read a Triton-style model repository: its layout, its ``config.pbtxt`` files, and the config JSON.

Layout: ``<root>/<model>/<version>/model.onnx``, with whole-number version folders. Folders
with other names, and version folders without ``model.onnx``, are not versions. A model's
optional ``config.pbtxt`` (or ``config.json``) is read with a small protobuf text-format
parser, so neither protobuf nor tritonclient is needed. Fields Triton has and we do not
use are accepted and ignored; a field Triton does not have, a value of the wrong type, and
features that would change what a request means (sequence batching, ensembles) raise
``ConfigurationError`` naming the file, the field and, for ``.pbtxt``, the line.

Decisions: only the first ``instance_group`` is used (its ``count``, and ``gpus[0]`` for
KIND_GPU); KIND_AUTO and a missing group mean ``"cpu"``; ``version_policy`` ``latest`` and
``all`` both serve the newest version, ``specific`` serves the versions listed.
This module imports numpy and the standard library only.

>>> read_config(Path("repo/resnet")).max_batch_size  # doctest: +SKIP
8
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from xdevice._errors import ConfigurationError, InferenceError, message

__all__ = ["ModelConfig", "ModelNotFound", "Repository", "parse_pbtxt", "read_config",
           "triton_config", "V2_DATATYPES", "FROM_V2"]

#: numpy dtype name -> KServe V2 datatype; "string" stands for numpy object arrays of bytes.
V2_DATATYPES: dict[str, str] = {
    "bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
    "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64", "float16": "FP16",
    "float32": "FP32", "float64": "FP64", "bfloat16": "BF16", "string": "BYTES",
}
FROM_V2: dict[str, str] = {v2: name for name, v2 in V2_DATATYPES.items()}
_TRITON_TYPES = {n: "TYPE_STRING" if v == "BYTES" else f"TYPE_{v}" for n, v in V2_DATATYPES.items()}
_STRING_ALIASES = {"object", "bytes", "str", "bytes_", "str_"}

# Every top-level field of Triton's ModelConfig message: the ones not read below are ignored.
_TRITON_FIELDS = {
    "name", "platform", "backend", "runtime", "version_policy", "max_batch_size", "input", "output",
    "batch_input", "batch_output", "optimization", "dynamic_batching", "sequence_batching",
    "ensemble_scheduling", "instance_group", "default_model_filename", "cc_model_filenames",
    "metric_tags", "parameters", "model_warmup", "model_operations", "model_transaction_policy",
    "model_repository_agents", "response_cache",
}
_BLOCK_FIELDS = {
    "dynamic_batching": {"preferred_batch_size", "max_queue_delay_microseconds", "preserve_ordering",
                         "priority_levels", "default_priority_level", "default_queue_policy",
                         "priority_queue_policy"},
    "instance_group": {"name", "kind", "count", "rate_limiter", "gpus", "secondary_devices", "profile",
                       "passive", "host_policy"},
    "version_policy": {"latest", "all", "specific"},
}
_UNSUPPORTED = {"sequence_batching": "stateful sequence models", "ensemble_scheduling": "ensembles"}


class ModelNotFound(InferenceError, LookupError):
    """A model or version that the repository does not hold (a server answers 404)."""


@dataclasses.dataclass
class ModelConfig:
    """What the server needs from a model's ``config.pbtxt``; the defaults are Triton's."""

    name: str
    max_batch_size: int = 0  # 0: no batching, inputs keep their full declared shapes
    max_queue_delay_us: int = 0  # dynamic_batching.max_queue_delay_microseconds
    preferred_batch_size: tuple[int, ...] = ()
    dynamic_batching: bool = False  # True when the config has a dynamic_batching block
    instance_count: int = 1
    device: str = "cpu"  # "cpu" or "gpu:N"
    versions: tuple[int, ...] | None = None  # None: the newest version; else version_policy.specific


# --------------------------------------------------------------------------- text format


class _Message(dict):
    """A parsed message; ``lines`` keeps the line where each field first appears."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: dict[str, int] = {}


_TOKEN = re.compile(r"""\s+|\#[^\n]*|(?P<str>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')"""
                    r"""|(?P<punct>[{}\[\]:,;<>])|(?P<word>[A-Za-z0-9_.+\-]+)""")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"'}


def _tokens(text: str, source: str) -> list[tuple[str, str, int]]:
    out, pos, line = [], 0, 1
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise ConfigurationError(message(f"{source}, line {line}: cannot read {text[pos]!r}",
                                             expected="protobuf text format"))
        kind = match.lastgroup
        if kind is not None:
            out.append((kind, match.group(kind), line))
        line += match.group().count("\n")
        pos = match.end()
    return out


def _scalar(kind: str, text: str) -> Any:
    if kind == "str":
        return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m[1], m[1]), text[1:-1])
    if text in ("true", "True"):
        return True
    if text in ("false", "False"):
        return False
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text  # an enum value such as TYPE_FP32


def parse_pbtxt(text: str, *, source: str = "config.pbtxt") -> dict:
    """Parse protobuf text format into nested dicts; a repeated field becomes a list.

    ``key [ ... ]`` always gives a list; a key written once as ``key: v`` gives ``v``.

    >>> parse_pbtxt('max_batch_size: 8  dims: [3, 4]  g [ { kind: KIND_CPU } ]')
    {'max_batch_size': 8, 'dims': [3, 4], 'g': [{'kind': 'KIND_CPU'}]}
    """
    toks, pos = _tokens(text, source), 0

    def fail(what: str, expected: str) -> ConfigurationError:
        line = toks[min(pos, len(toks) - 1)][2] if toks else 1
        got = toks[pos][1] if pos < len(toks) else "end of file"
        return ConfigurationError(message(f"{source}, line {line}: {what}", expected=expected,
                                          received=got))

    def take(*values: str) -> str | None:
        nonlocal pos
        if pos < len(toks) and toks[pos][0] == "punct" and toks[pos][1] in values:
            pos += 1
            return toks[pos - 1][1]
        return None

    def value() -> Any:
        nonlocal pos
        opener = take("{", "<")
        if opener:
            return block("}" if opener == "{" else ">")
        if pos < len(toks) and toks[pos][0] != "punct":
            pos += 1
            return _scalar(toks[pos - 1][0], toks[pos - 1][1])
        raise fail("a value is missing", "a number, a string, a name or a { ... } block")

    def block(closer: str | None) -> _Message:
        nonlocal pos
        msg, listed = _Message(), set()
        while not (closer is None and pos >= len(toks)) and not take(closer or ""):
            if pos >= len(toks) or toks[pos][0] != "word" or not toks[pos][1][0].isalpha():
                raise fail("a field name is missing", f"a field name or {closer!r}" if closer
                           else "a field name")
            key, line = toks[pos][1], toks[pos][2]
            pos += 1
            colon = take(":")
            if take("["):
                items: list = []
                while not take("]"):
                    items.append(value())
                    if not take(","):
                        if not take("]"):
                            raise fail(f"the list of {key!r} is not closed", "',' or ']'")
                        break
                listed.add(key)
            elif colon or (pos < len(toks) and toks[pos][1] in ("{", "<")):
                items = [value()]
            else:
                raise fail(f"field {key!r} has no value", "':' and a value, '{' or '['")
            msg.lines.setdefault(key, line)
            msg.setdefault(key, []).extend(items)
            take(",", ";")
        for key, items in msg.items():
            if len(items) == 1 and key not in listed:
                msg[key] = items[0]
        return msg

    return block(None)


# --------------------------------------------------------------------------- config


def _checked(msg: dict, key: str, kind: type, where: str, default: Any = None, *, many: bool = False) -> Any:
    """``msg[key]`` checked to be ``kind`` (a list of them when ``many``), or ``default``."""
    if key not in msg:
        return default
    value = msg[key]
    values = value if isinstance(value, list) and many else [value]
    ok = all(isinstance(v, kind) and not (kind is int and isinstance(v, bool))
             and not (kind is int and v < 0) for v in values)
    if not ok:
        line = getattr(msg, "lines", {}).get(key)
        at = f"{where}, line {line}" if line else where
        expected = {int: "a whole number >= 0", str: "a quoted string", dict: "a { ... } block",
                    bool: "true or false"}[kind]
        raise ConfigurationError(message(f"{at}: wrong value for {key!r}",
                                         expected=expected + (" (or a list of them)" if many else ""),
                                         received=value))
    return tuple(values) if many else value


def _known(msg: dict, allowed: set[str], where: str, block: str = "") -> None:
    for key in msg:
        if key not in allowed:
            line = getattr(msg, "lines", {}).get(key)
            raise ConfigurationError(message(f"{where}{f', line {line}' if line else ''}: unknown field "
                                             f"{block + '.' if block else ''}{key}", received=key,
                                             choices=sorted(allowed)))


def _from_dict(raw: dict, folder: str, where: str) -> ModelConfig:
    def bad(what: str, **parts: Any) -> ConfigurationError:
        return ConfigurationError(message(f"{where}: {what}", **parts))

    _known(raw, _TRITON_FIELDS, where)
    for key in raw:
        if key in _UNSUPPORTED:
            raise bad(f"{key!r} ({_UNSUPPORTED[key]}) is not supported", fix=f"remove {key!r}")
    name = _checked(raw, "name", str, where, folder)
    if name != folder:
        raise bad("the model name must match its folder name", expected=repr(folder), received=name)
    for key, ours in (("platform", "onnxruntime_onnx"), ("backend", "onnxruntime"),
                      ("default_model_filename", "model.onnx")):
        if _checked(raw, key, str, where, ours) not in (ours, ""):
            raise bad(f"unsupported {key}", expected=repr(ours), received=raw[key])
    config = ModelConfig(name=name, max_batch_size=_checked(raw, "max_batch_size", int, where, 0))
    if "dynamic_batching" in raw:
        batching = _checked(raw, "dynamic_batching", dict, where)
        _known(batching, _BLOCK_FIELDS["dynamic_batching"], where, "dynamic_batching")
        config.dynamic_batching = True
        config.preferred_batch_size = _checked(batching, "preferred_batch_size", int, where, (), many=True)
        config.max_queue_delay_us = _checked(batching, "max_queue_delay_microseconds", int, where, 0)
        if config.max_batch_size == 0:
            raise bad("dynamic_batching needs max_batch_size > 0", received=0,
                      fix="set max_batch_size, or remove dynamic_batching")
        too_big = [b for b in config.preferred_batch_size if not 0 < b <= config.max_batch_size]
        if too_big:
            raise bad("preferred_batch_size out of range",
                      expected=f"sizes from 1 to max_batch_size={config.max_batch_size}", received=too_big)
    groups = _checked(raw, "instance_group", dict, where, (), many=True)
    for group in groups:
        _known(group, _BLOCK_FIELDS["instance_group"], where, "instance_group")
    if groups:
        config.instance_count = _checked(groups[0], "count", int, where, 1)
        kind = _checked(groups[0], "kind", str, where, "KIND_AUTO")
        gpus = _checked(groups[0], "gpus", int, where, (0,), many=True) or (0,)
        kinds = {"KIND_AUTO": "cpu", "KIND_CPU": "cpu", "KIND_GPU": f"gpu:{gpus[0]}"}
        if kind not in kinds:
            raise bad("unsupported instance_group kind", received=kind, choices=list(kinds))
        config.device = kinds[kind]
    policy = _checked(raw, "version_policy", dict, where, {})
    _known(policy, _BLOCK_FIELDS["version_policy"], where, "version_policy")
    if "specific" in policy:
        specific = _checked(policy, "specific", dict, where)
        config.versions = tuple(sorted(_checked(specific, "versions", int, where, (), many=True)))
    return config


def read_config(model_dir: Path | str) -> ModelConfig:
    """The model's ``config.pbtxt`` (or ``config.json``); Triton's defaults when there is none.

    >>> read_config(Path("repo/resnet")).device  # doctest: +SKIP
    'gpu:1'
    """
    model_dir = Path(model_dir)
    pbtxt, as_json = model_dir / "config.pbtxt", model_dir / "config.json"
    if pbtxt.is_file():
        raw: Any = parse_pbtxt(pbtxt.read_text(encoding="utf-8"), source=str(pbtxt))
        where = str(pbtxt)
    elif as_json.is_file():
        where = str(as_json)
        try:
            raw = json.loads(as_json.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ConfigurationError(message(f"{where}, line {exc.lineno}: not valid JSON",
                                             received=exc.msg)) from None
        if not isinstance(raw, dict):
            raise ConfigurationError(message(f"{where}: wrong top-level value",
                                             expected="a JSON object", received=type(raw).__name__))
    else:
        return ModelConfig(name=model_dir.name)
    return _from_dict(raw, model_dir.name, where)


# --------------------------------------------------------------------------- repository


class Repository:
    """A Triton-layout folder of ONNX models; reads the disk on every call, loads nothing.

    >>> repo = Repository("models")  # doctest: +SKIP
    >>> repo.path("resnet")  # doctest: +SKIP
    PosixPath('models/resnet/2/model.onnx')
    """

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise ConfigurationError(message("Model repository not found", expected="a folder",
                                             received=str(self.root),
                                             fix="create <root>/<model>/1/model.onnx"))

    def models(self) -> list[str]:
        """Every model folder, sorted, whether or not it holds a usable version."""
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def _folder(self, name: str) -> Path:
        models = self.models()
        if name not in models:
            raise ModelNotFound(message("Unknown model", received=name, choices=models))
        return self.root / name

    def versions(self, name: str) -> list[int]:
        """The numeric version folders of ``name`` that hold ``model.onnx``, oldest first."""
        folder = self._folder(name)
        return sorted(int(p.name) for p in folder.iterdir()
                      if p.name.isdigit() and (p / "model.onnx").is_file())

    def _served(self, name: str) -> list[int]:
        versions, wanted = self.versions(name), self.config(name).versions
        return versions if wanted is None else [v for v in versions if v in wanted]

    def latest(self, name: str) -> int:
        """The newest version that the model's version policy serves."""
        served = self._served(name)
        if not served:
            raise ModelNotFound(message(f"Model {name!r} has no version to serve",
                                        expected="a folder <model>/<number>/model.onnx"
                                        " allowed by version_policy", received=self.versions(name)))
        return served[-1]

    def path(self, name: str, version: int | str | None = None) -> Path:
        """The ``model.onnx`` file of ``name`` at ``version`` (default: :meth:`latest`)."""
        if version is None or version == "":
            version = self.latest(name)
        served = self._served(name)
        if not str(version).isdigit() or int(version) not in served:
            raise ModelNotFound(message(f"Unknown version of model {name!r}", received=str(version),
                                        choices=[str(v) for v in served]))
        return self.root / name / str(int(version)) / "model.onnx"

    def config(self, name: str) -> ModelConfig:
        """The model's :class:`ModelConfig`, read from its folder."""
        return read_config(self._folder(name))

    def index(self) -> list[dict]:
        """One entry per model and numeric version folder, as POST /v2/repository/index lists them.

        ``state`` is "UNAVAILABLE" here; the server fills in what it loaded. A model with no
        usable version gets one entry with ``version`` "" and the reason.
        """
        entries = []
        for name in self.models():
            folders = sorted((p for p in (self.root / name).iterdir() if p.is_dir() and p.name.isdigit()),
                             key=lambda p: int(p.name))
            for p in folders:
                reason = "" if (p / "model.onnx").is_file() else f"no model.onnx in {p}"
                entries.append({"name": name, "version": p.name, "state": "UNAVAILABLE", "reason": reason})
            if not folders:
                entries.append({"name": name, "version": "", "state": "UNAVAILABLE",
                                "reason": "no numeric version folder"})
        return entries


# --------------------------------------------------------------------------- config JSON


def _dtype_name(dtype: Any) -> str:
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    return "string" if name in _STRING_ALIASES else name


def triton_config(config: ModelConfig, inputs: Any, outputs: Any, platform: str = "onnxruntime_onnx") -> dict:
    """The JSON Triton returns at GET /v2/models/{m}/config (int64 fields as numbers).

    ``inputs``/``outputs`` have ``.name``, ``.dtype`` and ``.shape`` (None for a dynamic dim).

    >>> from types import SimpleNamespace as T
    >>> triton_config(ModelConfig("m", max_batch_size=4), [T(name="x", dtype="float32", shape=(None, 3))],
    ...               [])["input"][0]["dims"]
    [3]
    """
    def tensor(t: Any) -> dict:
        dtype = _dtype_name(t.dtype)
        if dtype not in _TRITON_TYPES:
            raise ConfigurationError(message(f"Tensor {t.name!r} has an unsupported type",
                                             received=dtype, choices=list(_TRITON_TYPES)))
        shape = list(t.shape)[1:] if config.max_batch_size > 0 else list(t.shape)
        dims = [d if isinstance(d, int) and d >= 0 else -1 for d in shape]
        return {"name": t.name, "data_type": _TRITON_TYPES[dtype], "dims": dims, "is_shape_tensor": False}

    gpu = config.device.startswith("gpu")
    policy = ({"specific": {"versions": list(config.versions)}} if config.versions is not None
              else {"latest": {"num_versions": 1}})
    out = {
        "name": config.name, "platform": platform, "backend": "onnxruntime", "runtime": "",
        "version_policy": policy, "max_batch_size": config.max_batch_size,
        "input": [{**tensor(t), "format": "FORMAT_NONE", "allow_ragged_batch": False, "optional": False}
                  for t in inputs],
        "output": [{**tensor(t), "label_filename": ""} for t in outputs],
        "instance_group": [{"name": config.name, "kind": "KIND_GPU" if gpu else "KIND_CPU",
                            "count": config.instance_count,
                            "gpus": [int(config.device.partition(":")[2] or 0)] if gpu else []}],
        "default_model_filename": "model.onnx", "parameters": {},
    }
    if config.dynamic_batching:
        out["dynamic_batching"] = {"preferred_batch_size": list(config.preferred_batch_size),
                                   "max_queue_delay_microseconds": config.max_queue_delay_us,
                                   "preserve_ordering": False}
    return out
