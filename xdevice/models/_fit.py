"""A zoo model's input checked against its spec, and the build call that fits the data.

A zoo model declares its input through its spec (``inputs=784``, ``image=[3, 32, 32]``),
so when data does not fit, the useful fix is rarely "reshape x to (rows, 784)" (64 values
cannot become 784) but the build call that fits the data: ``models.build("mlp",
inputs=64)``. Each definition answers with a ``fitting(spec, row)`` hook, ``row`` being the
shape of one input row (the batch left out): ``None`` when the model takes such rows, or a
:class:`Fitting` (how to reshape ``x``, and the spec changes that fit it). The image rules
are shared by ``cnn`` and ``resnet`` and live here.

:func:`check_input` is the one check of a zoo model's input, the same on every backend,
for a ``Model`` call, the modules and pairs ``to_native`` makes, and the trainer: the rows'
shape, then the dtype. float64 data (scikit-learn's default) for a float32 model is refused
with ``x.astype('float32')``, as an imported ONNX model refuses it, instead of torch's raw
``mat1 and mat2 must have the same dtype`` on one backend and a silent cast on another.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from xdevice._errors import ConfigurationError, message

__all__ = [
    "Fitting",
    "check_input",
    "input_dtype",
    "lossless",
    "takes_tokens",
    "image_fitting",
    "pooled_image_fitting",
    "token_fitting",
    "check_heads",
    "check_image",
    "build_call",
    "literal",
]


@dataclasses.dataclass(frozen=True)
class Fitting:
    """What makes a model take rows of another shape: ``reshape`` (Python applied to ``x``,
    or None) and ``spec`` (hyper-parameters to build with; empty when the model fits once
    ``x`` is reshaped). Neither set: nothing simple fits, the fix says the expected form."""

    reshape: str | None = None
    spec: dict[str, Any] = dataclasses.field(default_factory=dict)


def check_image(name: str, spec: dict[str, Any]) -> None:
    """``image`` is ``[channels, height, width]`` of positive integers (NCHW without the batch).

    Raises:
        ConfigurationError: another rank (``[8, 8]`` would read as 8 channels), or not integers.
    """
    value = spec["image"]
    if (
        not isinstance(value, (list, tuple))
        or len(value) != 3
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        raise ConfigurationError(
            message(
                f"{name!r} takes image=[channels, height, width]",
                expected="three positive integers (NCHW without the batch: image=[1, 8, 8] for 8x8 grey images)",
                received=value,
                fix=f'models.build("{name}", image={_image_meant(value)})',
            )
        )


def _image_meant(value: Any) -> str:
    """The ``image`` a wrong one most likely meant: ``8`` or ``[8, 8]`` are 8x8 grey images."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"[1, {int(value)}, {int(value)}]"
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value) and len(value) in (2, 3):
        sizes = [int(v) for v in value]
        return literal([1, *sizes] if len(sizes) == 2 else sizes)
    return "[channels, height, width]"


def image_fitting(spec: dict[str, Any], row: tuple[int, ...]) -> Fitting | None:
    """How an image model (``cnn``, ``resnet``) takes rows of shape ``row``."""
    image = list(spec["image"])
    if len(row) == 3:
        if list(row) == image:
            return None
        channels_last = row[2] in (1, 3, 4) and row[0] not in (1, 3, 4)
        if channels_last:  # NHWC, TensorFlow's and PIL's layout: the zoo reads NCHW
            nchw = [row[2], row[0], row[1]]
            return Fitting("x.transpose(0, 3, 1, 2)", {} if nchw == image else {"image": nchw})
        return Fitting(None, {"image": list(row)})
    if len(row) == 2:  # grey images without their channel axis
        grey = [1, *row]
        return Fitting("x[:, None]", {} if grey == image else {"image": grey})
    if len(row) == 1:  # flattened images: the side is known when the size is a square
        size = row[0]
        if size == math.prod(image):
            return Fitting(f"x.reshape(-1, {image[0]}, {image[1]}, {image[2]})")
        for channels in (1, 3):
            side = math.isqrt(size // channels)
            if size % channels == 0 and side * side * channels == size:
                return Fitting(f"x.reshape(-1, {channels}, {side}, {side})", {"image": [channels, side, side]})
    return Fitting()


def pooled_image_fitting(spec: dict[str, Any], row: tuple[int, ...]) -> Fitting | None:
    """Global average pooling takes any height and width (``resnet``, ``resnet50``): only the
    channels must agree."""
    if len(row) == 3 and row[0] == spec["image"][0]:
        return None
    return image_fitting(spec, row)


def token_fitting(spec: dict[str, Any], row: tuple[int, ...]) -> Fitting | None:
    """Rows of at most ``length`` token ids, for a model whose position embedding has that many
    rows (``transformer``, ``bert``, ``gpt2``)."""
    if len(row) != 1:
        return Fitting()
    return None if row[0] <= spec["length"] else Fitting(None, {"length": row[0]})


def check_heads(title: str, spec: dict[str, Any]) -> None:
    """The attention heads split the width evenly.

    Raises:
        ConfigurationError: ``width % heads``, with the nearest width that fits.
    """
    width, heads = spec["width"], spec["heads"]
    if width % heads:
        raise ConfigurationError(
            message(
                f"The attention heads must split {title}'s width evenly",
                expected=f"a width that heads={heads} divides",
                received=f"width={width}, heads={heads}",
                fix=f"width={width - width % heads or heads}, or another heads",
            )
        )


def build_call(name: str, spec: dict[str, Any], changes: dict[str, Any], backend: str) -> str:
    """``models.build("mlp", inputs=64, ...)``: the changes first, then the rest of the spec
    that differs from the defaults, then the backend when it is not numpy's."""
    defaults = _definition(name).DEFAULTS
    kept = {k: v for k, v in spec.items() if k not in changes and defaults.get(k) != v}
    arguments = [f'"{name}"', *(f"{k}={literal(v)}" for k, v in {**changes, **kept}.items())]
    if backend != "numpy":
        arguments.append(f'backend="{backend}"')
    return f"models.build({', '.join(arguments)})"


def check_input(x: Any, name: str, spec: dict[str, Any], backend: str, ops: Any, weights: str) -> None:
    """Raise unless zoo model ``name`` built with ``spec`` takes ``x``: rows of a shape its
    ``fitting`` hook accepts, token ids of an integer dtype, floats of ``weights``' dtype (a
    ``Model`` call casts the casts that lose nothing first: see :func:`lossless`). ``x`` is
    numpy or ``backend``'s array, read through ``ops`` without being converted. Sizes that
    are not numbers yet (a traced function's) pass.

    Raises:
        ConfigurationError: with what was expected and received and the fix that fits the data.
    """
    shape, kind = _shape_and_dtype(x, ops)
    if not shape:
        raise ConfigurationError(
            message(
                "x has no rows", expected=f"{_expected(name, spec, weights)} (a batch of rows)", received=f"{kind}[]"
            )
        )
    if not all(isinstance(d, int) for d in shape[1:]):
        return  # sizes known only at run time (a traced function): the framework checks them
    received = f"{kind}{list(shape)}"
    if takes_tokens(name):
        wrong, fix = not kind.startswith(("int", "uint")), "x.astype('int32'): token ids are integers"
    else:
        wrong = kind != weights
        fix = f"x.astype({weights!r})" if weights != "bfloat16" else "cast x to bfloat16 with the framework"
        if kind == "float64":
            fix += " (float64 would be cut down silently)"
    found = _definition(name).fitting(spec, tuple(shape[1:]))
    if found is not None:
        raise ConfigurationError(
            message(
                "x does not have the shape of the model's input",
                expected=_expected(name, spec, weights),
                received=received,
                fix=_fix(found, name, spec, backend) + (f"; and {fix}" if wrong else ""),
            )
        )
    if wrong:
        raise ConfigurationError(
            message(
                "x does not have the dtype of the model's input",
                expected=_expected(name, spec, weights),
                received=received,
                fix=fix,
            )
        )
    if takes_tokens(name) and isinstance(x, np.ndarray):  # host data: read without a device sync
        check_token_ids(x, int(spec["vocab"]), name)


def check_token_ids(ids: Any, vocab: int, build: str | None = None) -> None:
    """Raise unless every id in the integer array ``ids`` is a row of a ``vocab``-row
    embedding (JAX's gather clamps an id past the end silently, torch raises a raw
    IndexError); ``build`` is the ``models.build(...)`` call, for the fix."""
    ids = np.asarray(ids)
    if ids.dtype.kind not in "iu":
        raise ConfigurationError(
            message(
                "x holds token ids, which are integers",
                received=f"{ids.dtype.name}{list(ids.shape)}",
                fix="x.astype('int64')",
            )
        )
    bad = (ids < 0) | (ids >= vocab)
    if not bad.any():
        return
    rows = int(bad.reshape(len(bad), -1).any(axis=1).sum()) if bad.ndim > 1 else int(bad.sum())
    distinct = np.unique(ids[bad]).tolist()
    shown = ", ".join(str(v) for v in distinct[:8]) + (f", ... ({len(distinct)} distinct)" if len(distinct) > 8 else "")
    wider = f"models.build({build!r}, vocab={int(ids.max()) + 1})" if build else "a larger vocabulary"
    raise ConfigurationError(
        message(
            f"x holds token ids outside 0 <= id < {vocab} (the model's vocabulary) in {rows} of {len(ids)} rows: "
            f"[{shown}]",
            fix=(
                f"token ids count from 0: map padding and unknown tokens to ids in 0..{vocab - 1}"
                if (ids < 0).any()
                else f"{wider}, or map the ids past {vocab - 1} to an unknown-token id below {vocab}"
            ),
        )
    )


def input_dtype(x: Any, ops: Any) -> str:
    """``x``'s dtype name, read without converting ``x`` (JAX would make float64 float32)."""
    return _shape_and_dtype(x, ops)[1]


def lossless(kind: str, weights: str) -> bool:
    """Whether a float input of dtype ``kind`` is taken by a model with ``weights`` by a cast:
    to a wider float (exact), or float32 to half precision (a half model's data comes as
    float32: numpy has no bfloat16). float64 into a float32 model is not: it would drop digits
    the user may believe they have."""
    rank = {"float16": 1, "bfloat16": 1, "float32": 2, "float64": 3}
    if kind not in rank or weights not in rank or kind == weights:
        return False
    return rank[kind] < rank[weights] or (kind == "float32" and rank[weights] == 1)


def takes_tokens(name: str) -> bool:
    """Whether zoo model ``name`` reads token ids (integers) rather than floats."""
    found = _TOKENS.get(name)
    if found is None:
        import numpy as np

        module = _definition(name)
        example = module.example_input(module.DEFAULTS, 1, np.random.default_rng(0))
        found = _TOKENS[name] = bool(example.dtype.kind in "iu")
    return found


_TOKENS: dict[str, bool] = {}  # not functools.lru_cache: torch.compile warns when it traces one


def _definition(name: str) -> Any:
    found = _MODULES.get(name)  # a dict, not importlib, on the path torch.compile traces
    if found is None:
        found = _MODULES[name] = importlib.import_module(f"xdevice.models.{name}")  # build checked the name
    return found


_MODULES: dict[str, Any] = {}


def _row(name: str, spec: dict[str, Any]) -> tuple[int, ...]:
    import numpy as np

    return tuple(_definition(name).example_input(spec, 1, np.random.default_rng(0)).shape[1:])


def _expected(name: str, spec: dict[str, Any], weights: str) -> str:
    if takes_tokens(name):  # any length (lstm), or up to one (transformer): the definition says
        return str(_definition(name).INPUT)
    return f"{weights}[rows, {', '.join(map(str, _row(name, spec)))}]"


def _fix(found: Fitting, name: str, spec: dict[str, Any], backend: str) -> str:
    call = build_call(name, spec, found.spec, backend) if found.spec else None
    if found.reshape and call:
        return f"{found.reshape}, then {call}"
    if call:
        return f"{call} takes rows like these"
    if found.reshape:
        return f"{found.reshape} gives rows of the model's shape"
    row = "tokens" if takes_tokens(name) else ", ".join(map(str, _row(name, spec)))
    shown = f"model.example_input(n) shows one, models.describe({name!r}) the hyper-parameters"
    return f"reshape x to (rows, {row}); {shown}"


def _shape_and_dtype(x: Any, ops: Any) -> tuple[tuple[Any, ...], str]:
    """``x``'s shape and dtype name without converting it: numpy's and JAX's dtypes are
    numpy's; torch's and TensorFlow's are named by the backend's ops."""
    import numpy as np

    if not hasattr(x, "shape"):  # a list
        x = np.asarray(x)
    # no try/except: torch.compile traces this, and an exception inside breaks its graph
    kind = x.dtype.name if isinstance(x, (np.ndarray, np.generic)) else ops.dtype(x)
    return tuple(int(d) if isinstance(d, (int, np.integer)) else d for d in x.shape), kind


def literal(value: Any) -> str:
    """``value`` as Python source, strings in double quotes (as the docs write them)."""
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, Sequence):
        return f"[{', '.join(literal(v) for v in value)}]"
    return repr(value)
