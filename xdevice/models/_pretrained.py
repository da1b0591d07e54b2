"""Checkpoints people already have: a transformers ``save_pretrained`` folder, read and written.

A folder holds ``config.json`` and the weights as safetensors: ``model.safetensors``, or
shards listed by ``model.safetensors.index.json``. Nothing is downloaded: ``PATH`` is a
folder on disk. Each real-scale zoo definition (``bert``, ``gpt2``, ...) supplies what
differs: the transformers class it mirrors (``TRANSFORMERS_CLASS``), its spec from the
config (``spec_from_config``, refusing by name a field that changes the math the zoo does
not implement), its parameters from the checkpoint's tensors (``params_from_transformers``)
and the reverse (``to_transformers``: config and tensors). Reading and writing the folder,
and the checks every model shares, live here once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from xdevice._errors import ConfigurationError, ConversionError, message

__all__ = ["read", "write", "refuse", "take", "classes"]

_SINGLE, _INDEX = "model.safetensors", "model.safetensors.index.json"


def read(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """``(config, tensors)`` from a transformers folder: ``config.json`` and every tensor of
    ``model.safetensors`` or of the shards its index lists, as numpy arrays.

    Raises:
        ConversionError: not a folder, no ``config.json``, or no safetensors weights (a
            ``pytorch_model.bin`` is named: it is a pickle, which xdevice never loads).
    """
    from safetensors.numpy import load_file

    folder = Path(path)
    if not folder.is_dir():
        raise ConversionError(
            message(
                "weights= takes a transformers save_pretrained folder",
                expected="a folder with config.json and model.safetensors",
                received=str(path),
                fix="model.save_pretrained(folder) in transformers, then weights=folder",
            )
        )
    files = sorted(p.name for p in folder.iterdir())
    if "config.json" not in files:
        raise ConversionError(
            message("The folder has no config.json", expected="config.json beside the weights", received=files[:8])
        )
    config = json.loads((folder / "config.json").read_text())
    if _INDEX in files:
        shards = sorted(set(json.loads((folder / _INDEX).read_text())["weight_map"].values()))
    elif _SINGLE in files:
        shards = [_SINGLE]
    else:
        pickled = [name for name in files if name.endswith((".bin", ".pt", ".pth"))]
        raise ConversionError(
            message(
                "The folder has no safetensors weights",
                expected=f"{_SINGLE} or {_INDEX}",
                received=files[:8],
                fix=(
                    f"{pickled[0]} is a pickle, which xdevice does not load: save it again with "
                    "model.save_pretrained(folder) (safetensors is transformers' default)"
                    if pickled
                    else "model.save_pretrained(folder) in transformers"
                ),
            )
        )
    tensors: dict[str, np.ndarray] = {}
    for shard in shards:
        tensors.update(load_file(str(folder / shard)))
    return config, tensors


def write(path: str | os.PathLike, config: dict[str, Any], tensors: dict[str, np.ndarray]) -> None:
    """Write ``config.json`` and ``model.safetensors`` (one file, float32 as held) into ``path``."""
    from safetensors.numpy import save_file

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    arrays = {key: np.ascontiguousarray(value).reshape(np.shape(value)) for key, value in tensors.items()}
    save_file(arrays, str(folder / _SINGLE), metadata={"format": "pt"})


def refuse(name: str, config: dict[str, Any], field: str, supported: Any) -> None:
    """Refuse ``config[field]`` by name when it is present and not one of ``supported``
    (a value, or a tuple of values): it changes the math, and the zoo does not compute it.

    Raises:
        ConfigurationError: names the field, what the zoo computes and what the config says.
    """
    if field not in config:
        return
    allowed = supported if isinstance(supported, tuple) else (supported,)
    if config[field] not in allowed:
        raise ConfigurationError(
            message(
                f"The zoo's {name!r} does not compute this configuration",
                expected=f"{field} in {list(allowed)}",
                received=f"{field}={config[field]!r}",
                fix="use the model in transformers, or remove the field if it was set by mistake",
            )
        )


def take(tensors: dict[str, np.ndarray], key: str, *, prefixes: tuple[str, ...] = ("",)) -> np.ndarray:
    """``tensors[prefix + key]`` as float32 for the first prefix the checkpoint uses (a
    ``BertModel`` saves ``embeddings...``, a ``BertForMaskedLM`` ``bert.embeddings...``).

    Raises:
        ConversionError: the checkpoint has no such tensor under any prefix.
    """
    for prefix in prefixes:
        if prefix + key in tensors:
            return np.asarray(tensors[prefix + key], dtype=np.float32)
    raise ConversionError(
        message(
            "The checkpoint lacks a tensor this model needs",
            expected=" or ".join(repr(prefix + key) for prefix in prefixes),
            received=f"{len(tensors)} tensors, such as {sorted(tensors)[:3]}",
            fix="check that the folder holds the architecture the zoo model mirrors",
        )
    )


def classes(config: dict[str, Any]) -> int:
    """transformers' ``num_labels``: the length of ``id2label`` when the config has one."""
    return len(config["id2label"]) if config.get("id2label") else int(config.get("num_labels", 2))
