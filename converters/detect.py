"""Which backend exports a model, found by what the model is, and the example inputs it runs on.

The backend that owns the model exports it (``_registry.owner``; only frameworks already
imported are asked, so nothing is imported to find out); an ``ImportedModel`` exports its own
graph (``OwnGraph``). The example inputs come as numpy, flat and named (``Inputs``), checked
by calling the model on them once before any exporter traces it.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from xdevice import _registry
from xdevice._errors import ConversionError, message
from xdevice._tensors import to_host
from xdevice.backends._model_io import Inputs
from xdevice.converters.axes import resampled, second_batch

__all__ = ["source_of", "is_imported", "OwnGraph", "framework_of", "as_inputs", "runs_on"]


def source_of(
    model: Any, backend: str | None, example_inputs: Any, dynamic_batch: bool
) -> tuple[str, Any, Inputs, Inputs]:
    """``(backend name, native target, example inputs, inputs at a second batch size)``."""
    from xdevice import models

    if isinstance(model, models.Model):
        name = backend or model.backend
        _registry.backend(name)  # an unknown name fails here, with the choices
        if example_inputs is None:
            inputs = Inputs.of(model.example_input())
            second = inputs.replaced([model.example_input(second_batch(len(inputs[0])), seed=1)])
            return name, models.to_native(model, name), inputs, second
        inputs = _zoo_inputs(model, as_inputs(example_inputs, stacklevel=3))
        target = models.to_native(model, name)  # its forward takes the definition's other inputs
        _check_example(inputs, dynamic_batch)
        return name, target, inputs, resampled(inputs)
    else:
        if example_inputs is None:
            raise ConversionError(
                message(
                    "A native model needs example_inputs to be exported",
                    expected="an array, a tuple of arrays, or a dict of them (named inputs), batch first",
                    received=f"{type(model).__qualname__} with example_inputs=None",
                    fix="export(model, example_inputs=np.zeros((2, 784), 'float32')) with your input's shape",
                )
            )
        name = model.backend.name if is_imported(model) else backend or framework_of(model)
        target = model
    inputs = as_inputs(example_inputs, stacklevel=3)  # the note points at the user's export() call
    _check_example(inputs, dynamic_batch)
    return name, target, inputs, resampled(inputs)


def _zoo_inputs(model: Any, inputs: Inputs) -> Inputs:
    """A zoo model's example inputs, checked: one array (``x``), or a dict of arrays whose key
    ``"input"`` (else the first key the definition does not name) is ``x`` and whose other keys
    are inputs the definition names (``INPUTS``: ``attention_mask``, ``token_type_ids``).

    The graph inputs are named by the keys, in the dict's order. Rebuilt, a dict calls the
    model with ``x`` under the key ``"x"`` and the others under their own names: keyword
    arguments in PyTorch, one dict in TensorFlow and JAX (``models.to_native``); a dict
    with ``x`` alone calls it positionally, as an array does."""
    from xdevice import models

    if not inputs.named:
        return inputs
    known = tuple(getattr(models.definition(model.name), "INPUTS", ()))
    nested = [key for key, position in inputs.structure.items() if not isinstance(position, int)]
    if nested:
        raise ConversionError(
            message(
                f"Zoo model {model.name!r} takes arrays, not nested inputs",
                expected="a dict of arrays: the ids, then " + (", ".join(known) or "nothing else"),
                received=nested,
            )
        )
    keys = list(inputs.structure)
    x_key = "input" if "input" in keys else next((key for key in keys if key not in known), None)
    unknown = [key for key in keys if key != x_key and key not in known]
    if x_key is None or unknown:
        choices = ["input", *known]
        raise ConversionError(
            message(
                f"Zoo model {model.name!r} takes no input {unknown[0]!r}"
                if unknown
                else f"Zoo model {model.name!r} needs its input x among example_inputs",
                expected="x under 'input' (or the first key of another name), "
                + (f"then any of {', '.join(known)}" if known else "and nothing else"),
                received=unknown if unknown else keys,
                choices=choices if unknown else None,
                fix=f"export(model, example_inputs={{{', '.join(repr(c) + ': ...' for c in choices)}}})",
            )
        )
    made = Inputs(inputs)
    made.names = inputs.names
    made.structure = {("x" if key == x_key else key): position for key, position in inputs.structure.items()}
    if len(keys) == 1:
        made.structure = (made.structure["x"],)
    return made


def is_imported(model: Any) -> bool:
    """An ``ImportedModel`` (only possible once the importer module was loaded)."""
    module = sys.modules.get("xdevice.converters.importer.model")
    return module is not None and isinstance(model, module.ImportedModel)


class OwnGraph:
    """The exporter of an imported ONNX model: its own graph with its current weights
    (``ImportedModel.to_onnx``), on whichever backend it runs. No framework tracer is
    involved, so a model fine-tuned on any backend exports the same way, and none can bring
    the interpreter down (PyTorch's TorchScript fallback did, on its interpreter's Python)."""

    def __init__(self, model: Any):
        self.model = model
        self.name = model.backend.name

    def export_onnx(self, target: Any, inputs: Inputs, opset: int, axes: list[dict[int, str]]) -> Any:
        return target.to_onnx()

    def native_outputs(self, target: Any, inputs: Inputs) -> list[Any]:
        outputs = target(*inputs)
        return [to_host(y) for y in (outputs if isinstance(outputs, tuple) else (outputs,))]

    def reference_device(self, target: Any) -> Any:
        """Where ``native_outputs`` computes: the device the imported model is bound to."""
        return target.device

    def one_example(self, target: Any, inputs: Inputs) -> None:
        """None: an imported graph keeps the batch axis its ONNX inputs declare."""
        return None


def framework_of(model: Any) -> str:
    """The backend that exports a native ``model``: the one that owns it (``_registry.owner``)."""
    found = _registry.owner(model)
    if found is None or found[1] != "model":
        raise ConversionError(
            message(
                "Cannot tell which framework this model belongs to",
                expected="a zoo Model, or a model of a loaded framework",
                received=type(model).__qualname__,
                choices=_registry.accepted("model"),
                fix="pass backend=... to say which framework runs it",
            )
        )
    return found[0].name


def as_inputs(inputs: Any, stacklevel: int = 2) -> Inputs:
    """Example inputs as numpy arrays (framework arrays are copied to the host), flat, with
    their names and structure (positional, or a dict: named).

    A list of rows written as Python lists (``x.tolist()``, ``[[0.0, 1.0], [2.0, 3.0]]``) is
    the data of one array, as ``np.asarray``, ``torch.tensor`` and ``tf.constant`` read it:
    it becomes one input, batch first (floats as float32, the frameworks' default), with a
    note (a ``UserWarning`` at ``stacklevel``), rather than one 0-d input per number. A list
    of arrays stays what the docs say it is, one input per array."""
    rows = _python_rows(inputs)
    if rows is not None:
        import warnings

        warnings.warn(
            f"example_inputs is a list of {len(inputs)} rows of Python numbers: read as one input "
            f"{rows.dtype}{list(rows.shape)}, batch first (pass an array to choose the dtype)",
            UserWarning,
            stacklevel=stacklevel + 1,
        )
        inputs = rows
    return Inputs.of(inputs, convert=to_host)


def _python_rows(given: Any) -> Any:
    """``given`` as one numpy array when it is a list of rows of Python numbers (nested lists
    of int, float or bool, at least two levels deep, rectangular); None otherwise."""
    import numbers

    import numpy as np

    def numbers_only(value: Any) -> bool:
        if isinstance(value, (list, tuple)):
            return all(numbers_only(v) for v in value)
        return isinstance(value, numbers.Real) and not isinstance(value, np.generic)

    if not (isinstance(given, list) and given and all(isinstance(row, (list, tuple)) for row in given)):
        return None
    if not numbers_only(given):
        return None
    try:
        array = np.asarray(given)
    except ValueError:  # ragged rows: left to the shape checks, which name them
        return None
    if array.ndim < 2 or array.dtype.kind not in "biuf":
        return None
    return array.astype(np.float32) if array.dtype.kind == "f" else array


def _check_example(inputs: Inputs, dynamic_batch: bool) -> None:
    if not inputs:
        raise ConversionError(message("No example inputs", expected="at least one array"))
    if dynamic_batch and (any(x.ndim == 0 for x in inputs) or len({x.shape[0] for x in inputs}) > 1):
        shapes = [x.shape for x in inputs]
        shown: Any = shapes if len(shapes) <= 6 else f"{', '.join(map(str, shapes[:4]))}, ... ({len(shapes)} inputs)"
        if len(inputs) > 1 and not inputs.named and all(x.ndim == 0 for x in inputs):
            raise ConversionError(
                message(
                    f"example_inputs is a list of {len(inputs)} numbers, read as {len(inputs)} separate 0-d "
                    "inputs, none with a batch axis",
                    expected="arrays batch first: one per input the model takes",
                    received=shown,
                    fix="pass one array, batch first: np.asarray(row, 'float32')[None] for one row, "
                    "np.stack(rows) for several",
                )
            )
        raise ConversionError(
            message(
                "A dynamic batch needs every input to have the same batch size on axis 0",
                received=shown,
                fix="pass dynamic_batch=False for other inputs",
            )
        )


def runs_on(exporter: Any, target: Any, inputs: Inputs) -> None:
    """The model, called once on its example inputs before any exporter traces it: a wrong
    shape or dtype is reported as that, with the framework's one-line cause, rather than from
    deep inside a tracer (and without the warnings the failing call gave on the way)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            exporter.native_outputs(target, inputs)
        except Exception as error:
            raise _fails_on(exporter, inputs, error) from error
    for warning in caught:  # it ran: its warnings are the user's to see
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)


def _fails_on(exporter: Any, inputs: Inputs, error: Exception) -> ConversionError:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))  # Keras colours its messages
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    cause = next(
        (line for line in lines if "shape" in line.lower() or "dtype" in line.lower()), lines[0] if lines else ""
    )
    return ConversionError(
        message(
            f"The model fails on its example inputs, so there is nothing to export ({exporter.name} "
            f"raised {type(error).__name__}: {cause[:300]})",
            expected="example inputs of the shapes and dtypes the model takes, batch first",
            received=_shown(inputs),
            fix=_rows_hint(inputs)
            + "call the model on those inputs yourself to see what it wants, then pass such arrays",
        )
    )


def _shown(inputs: Inputs) -> str:
    """The inputs as ``name: dtype[shape]``, the first few of many."""
    shown = [f"{name}: {x.dtype}{list(x.shape)}" for name, x in zip(inputs.names, inputs)]
    return ", ".join(shown if len(shown) <= 6 else [*shown[:4], f"... ({len(shown)} inputs)"])


def _rows_hint(inputs: Inputs) -> str:
    """The fix for arrays that look like the rows of one input, given as a list of inputs."""
    if inputs.named or len(inputs) < 3 or len({(x.shape, x.dtype) for x in inputs}) > 1:
        return ""
    return (
        f"these are {len(inputs)} separate inputs of one shape; if they are rows of one input, pass "
        f"np.stack(rows) (one array, {len(inputs)} rows); otherwise "
    )
