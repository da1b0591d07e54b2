"""A Triton-style model repository: its layout, and the config JSON the server returns.

Layout: ``<root>/<model>/<version>/model.onnx``, with whole-number version folders. Folders
with other names, and version folders without ``model.onnx``, are not versions. A model's
``config.pbtxt`` (or ``config.json``) is read by ``config.read_config`` against Triton's own
``ModelConfig`` message; its ``version_policy`` says which versions are served.
This module imports numpy and the standard library only (protobuf when a config is read).

>>> Repository("models").served("resnet")  # doctest: +SKIP
[2]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from xdevice._errors import ConfigurationError, InferenceError, message
from xdevice.serving.config import ModelConfig, read_config

__all__ = ["ModelConfig", "ModelNotFound", "Repository", "read_config", "triton_config", "V2_DATATYPES", "FROM_V2"]

#: numpy dtype name -> KServe V2 datatype; "string" stands for numpy object arrays of bytes.
V2_DATATYPES: dict[str, str] = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
    "bfloat16": "BF16",
    "string": "BYTES",
}
FROM_V2: dict[str, str] = {v2: name for name, v2 in V2_DATATYPES.items()}
_TRITON_TYPES = {n: "TYPE_STRING" if v == "BYTES" else f"TYPE_{v}" for n, v in V2_DATATYPES.items()}
_STRING_ALIASES = {"object", "bytes", "str", "bytes_", "str_"}


class ModelNotFound(InferenceError, LookupError):
    """A model or version that the repository does not hold (a server answers 404)."""


# --------------------------------------------------------------------------- repository


class Repository:
    """A Triton-layout folder of ONNX models; reads the disk on every call, loads nothing.

    ``root`` may also be one ``.onnx`` file: it is served as a one-model repository, the
    model named after the file's stem, as version 1, with Triton's default configuration.
    A folder that is one model's folder (numbered version folders holding ``.onnx`` files,
    or a ``config.pbtxt``) is refused with the folder to serve instead; a layout that holds
    no servable version is explained by :meth:`unserved`, and ``.onnx`` files lying at the
    root by :meth:`strays`, each naming what was found and the fix.

    >>> repo = Repository("models")  # doctest: +SKIP
    >>> repo.path("resnet")  # doctest: +SKIP
    PosixPath('models/resnet/2/model.onnx')
    """

    def __init__(self, root: Path | str, device: str = "cpu") -> None:
        self.device = device  # where a model runs whose configuration leaves it to the server
        path = Path(root)
        self.file: Path | None = None  # the one model file, when root is a file
        if path.is_file() and path.suffix == ".onnx":
            self.file, self.root = path, path.parent
            return
        self.root = path
        if not path.is_dir():
            raise ConfigurationError(
                message(
                    "Model repository not found",
                    expected="a folder <repo>/<model>/<version>/model.onnx, or one .onnx file",
                    received=str(path),
                    fix="export the model to ONNX first" if path.is_file() else "create <repo>/<model>/1/model.onnx",
                )
            )
        _refuse_a_model_folder(path)

    def models(self) -> list[str]:
        """Every model folder, sorted, whether or not it holds a usable version."""
        if self.file is not None:
            return [self.file.stem]
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def _folder(self, name: str) -> Path:
        models = self.models()
        if name not in models:
            raise ModelNotFound(message("Unknown model", received=name, choices=models))
        return self.root / name

    def versions(self, name: str) -> list[int]:
        """The numeric version folders of ``name`` that hold ``model.onnx``, oldest first."""
        folder = self._folder(name)
        if self.file is not None:
            return [1]
        return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit() and (p / "model.onnx").is_file())

    def served(self, name: str) -> list[int]:
        """The versions the model's ``version_policy`` serves, oldest first."""
        return self.config(name).selects(self.versions(name))

    def latest(self, name: str) -> int:
        """The newest version that the model's version policy serves."""
        served = self.served(name)
        if not served:
            raise ModelNotFound(self.unserved(name))
        return served[-1]

    def path(self, name: str, version: int | str | None = None) -> Path:
        """The ``model.onnx`` file of ``name`` at ``version`` (default: :meth:`latest`)."""
        if version is None or version == "":
            version = self.latest(name)
        served = self.served(name)
        if not str(version).isdigit() or int(version) not in served:
            raise ModelNotFound(
                message(f"Unknown version of model {name!r}", received=str(version), choices=[str(v) for v in served])
            )
        if self.file is not None:
            return self.file
        return self.root / name / str(int(version)) / "model.onnx"

    def file_of(self, name: str, version: int | str) -> Path:
        """The ``model.onnx`` of ``name`` at ``version``, whatever the version policy says
        (a load request may bring a configuration of its own)."""
        if self.file is not None:
            return self.file
        return self.root / name / str(int(version)) / "model.onnx"

    def config(self, name: str) -> ModelConfig:
        """The model's :class:`ModelConfig`, read from its folder (Triton's defaults for a file)."""
        folder = self._folder(name)
        config = ModelConfig(name=name) if self.file is not None else read_config(folder)
        if config.device is None:  # KIND_AUTO or no instance_group: the server's device
            config.device = self.device
        return config

    def unserved(self, name: str) -> str:
        """Why ``name`` has no version to serve, in one line: what was found and the fix
        ("" when it has one).

        >>> Repository("models").unserved("digits")  # doctest: +SKIP
        "Model 'digits' has no version to serve: found models/digits/1/digits.onnx, but ..."
        """
        folder = self._folder(name)
        on_disk = self.versions(name)  # without any, the configuration is not read: it may not parse
        if on_disk and self.served(name):
            return ""
        head = f"Model {name!r} has no version to serve"
        layout = f"{folder}/<version>/model.onnx (Triton's layout; the version a whole number)"
        if on_disk:  # only a specific version_policy selects none of them
            config = self.config(name)
            wanted = [str(v) for v in config.version_policy[1]]
            return message(
                f"{head}: version_policy in {config.source} selects none of the versions on disk",
                expected=f"version {', '.join(wanted)}",
                received=on_disk,
                fix=f"add {folder}/{wanted[-1]}/model.onnx, or change version_policy",
            )
        numbered = sorted((p for p in folder.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
        misnamed = [f for p in numbered for f in sorted(p.glob("*.onnx"))]
        loose = sorted(p for p in folder.glob("*.onnx") if p.is_file())
        elsewhere = sorted(f for f in folder.glob("*/*.onnx") if not f.parent.name.isdigit())
        if misnamed:
            return message(
                f"{head}: found {_first(misnamed)}, but a version's file must be named model.onnx",
                fix=f"rename it to {misnamed[0].parent / 'model.onnx'}",
            )
        if loose:
            return message(
                f"{head}: found {_first(loose)} outside a version folder",
                expected=layout,
                fix=f"move it to {folder / '1' / 'model.onnx'}, or serve the file itself: xdevice serve {loose[0]}",
            )
        if elsewhere:
            where = elsewhere[0].parent
            return message(
                f"{head}: found {_first(elsewhere)}, but version folders are whole numbers",
                expected=layout,
                fix=f"rename {where} to {folder / '1'}"
                if elsewhere[0].name == "model.onnx"
                else f"move it to {folder / '1' / 'model.onnx'}",
            )
        if numbered:
            return message(
                f"{head}: found {_first(numbered)} with no model.onnx in it",
                fix=f"put the model at {numbered[-1] / 'model.onnx'}",
            )
        return message(
            f"{head}: {folder} holds no version folder",
            expected=layout,
            fix=f"export the model to {folder / '1' / 'model.onnx'}, or serve one .onnx file by itself "
            "(xdevice serve <file>.onnx: a one-model repository)",
        )

    def strays(self) -> list[str]:
        """One line per ``.onnx`` file lying at the root, outside any model folder, with the fix."""
        if self.file is not None:
            return []
        lines = []
        full = self.root.resolve()
        for file in sorted(p for p in self.root.glob("*.onnx") if p.is_file()):
            if full.name.isdigit() and file.name == "model.onnx":  # pointed at a version folder
                lines.append(
                    message(
                        f"found {file}: {self.root} is version {full.name} of model {full.parent.name!r}, "
                        "not a repository of models",
                        fix=f"serve the repository that holds it: xdevice serve {_up(self.root, 2)}, "
                        f"or the file itself: xdevice serve {file}",
                    )
                )
                continue
            name = "<name>" if file.stem == "model" else file.stem
            lines.append(
                message(
                    f"found {file} outside a model folder",
                    expected=f"{self.root}/<model>/<version>/model.onnx",
                    fix=f"move it to {self.root / name / '1' / 'model.onnx'}, "
                    f"or serve the file itself: xdevice serve {file}",
                )
            )
        return lines

    def index(self) -> list[dict]:
        """One entry per model and numeric version folder, as POST /v2/repository/index lists them.

        ``state`` is "UNAVAILABLE" here; the server fills in what it loaded. A model with no
        usable version gets one entry with ``version`` "" and the reason.
        """
        if self.file is not None:
            return [{"name": self.file.stem, "version": "1", "state": "UNAVAILABLE", "reason": ""}]
        entries = []
        for name in self.models():
            folders = sorted(
                (p for p in (self.root / name).iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)
            )
            for p in folders:
                reason = "" if (p / "model.onnx").is_file() else f"no model.onnx in {p}"
                entries.append({"name": name, "version": p.name, "state": "UNAVAILABLE", "reason": reason})
            if not folders:
                entries.append({"name": name, "version": "", "state": "UNAVAILABLE", "reason": self.unserved(name)})
        return entries


def _first(paths: list[Path]) -> str:
    return str(paths[0]) + (f" (and {len(paths) - 1} more)" if len(paths) > 1 else "")


def _up(path: Path, levels: int) -> Path:
    """The folder ``levels`` above ``path``, spelled relative as the user gave it where it can be."""
    parts = path.parts
    if len(parts) >= levels and all(part not in ("", ".", "..") for part in parts[-levels:]):
        return path.parents[levels - 1]
    return path.resolve().parents[levels - 1]


def _refuse_a_model_folder(root: Path) -> None:
    """Raise when ``root`` is one model's folder (``xdevice serve repo/mlp`` for ``repo``):
    numbered folders holding ``.onnx`` files, or a model configuration, at the top."""
    found = sorted(f for p in root.iterdir() if p.is_dir() and p.name.isdigit() for f in p.glob("*.onnx"))
    found += [p for p in (root / "config.pbtxt", root / "config.json") if p.is_file()]
    if not found:
        return
    full = root.resolve()
    above = _up(root, 1)
    raise ConfigurationError(
        message(
            f"{root} is one model's folder, not a repository of models: found {_first(found)}",
            expected=f"a folder holding model folders, {root}/<model>/<version>/model.onnx",
            fix=f"serve the folder above it: xdevice serve {above} (it serves {full.name!r} as one of its models)",
        )
    )


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
            raise ConfigurationError(
                message(f"Tensor {t.name!r} has an unsupported type", received=dtype, choices=list(_TRITON_TYPES))
            )
        shape = list(t.shape)[1:] if config.max_batch_size > 0 else list(t.shape)
        dims = [d if isinstance(d, int) and d >= 0 else -1 for d in shape]
        return {"name": t.name, "data_type": _TRITON_TYPES[dtype], "dims": dims, "is_shape_tensor": False}

    gpu = (config.device or "cpu").startswith("gpu")
    kind = config.version_policy[0]
    if kind == "all":
        policy: dict = {"all": {}}
    elif kind == "specific":
        policy = {"specific": {"versions": list(config.version_policy[1])}}
    else:
        policy = {"latest": {"num_versions": config.version_policy[1]}}
    out = {
        "name": config.name,
        "platform": platform,
        "backend": "onnxruntime",
        "runtime": "",
        "version_policy": policy,
        "max_batch_size": config.max_batch_size,
        "input": [
            {**tensor(t), "format": "FORMAT_NONE", "allow_ragged_batch": False, "optional": False} for t in inputs
        ],
        "output": [{**tensor(t), "label_filename": ""} for t in outputs],
        "instance_group": [
            {
                "name": config.name,
                "kind": "KIND_GPU" if gpu else "KIND_CPU",
                "count": config.instance_count,
                "gpus": [int((config.device or "").partition(":")[2] or 0)] if gpu else [],
            }
        ],
        "default_model_filename": "model.onnx",
        "parameters": {} if config.vocab_size is None else {"vocab_size": {"string_value": str(config.vocab_size)}},
    }
    if config.dynamic_batching:
        out["dynamic_batching"] = {
            "preferred_batch_size": list(config.preferred_batch_size),
            "max_queue_delay_microseconds": config.max_queue_delay_us,
            "preserve_ordering": False,
            "default_queue_policy": {
                "timeout_action": config.timeout_action,
                "default_timeout_microseconds": config.queue_timeout_us,
                "allow_timeout_override": config.allow_timeout_override,
                "max_queue_size": config.max_queue_size,
            },
        }
    if config.warmup:
        out["model_warmup"] = [
            {
                "name": w.name,
                "batch_size": w.batch_size,
                "count": w.count,
                "inputs": {
                    name: {
                        "data_type": _TRITON_TYPES[dtype],
                        "dims": list(dims),
                        {"zero": "zero_data", "random": "random_data"}.get(how, "input_data_file"): True
                        if file is None
                        else file.name,
                    }
                    for name, (dtype, dims, how, file) in w.inputs.items()
                },
            }
            for w in config.warmup
        ]
    return out
