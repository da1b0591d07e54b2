"""ONNX export from PyTorch: ``torch.export`` traces the module, ``torch.onnx`` translates.

Two steps instead of ``torch.onnx.export(module, ...)`` alone: given a module, that call
retries a failed trace with a draft export that silently pins a dynamic batch to the
example's size. Tracing with ``torch.export`` first turns that into an error naming the
line that specialised the batch; ``torch.onnx.export`` (onnxscript, ``dynamo=True``) then
translates the traced program.

One translation is replaced: onnxscript turns ``aten::index`` with int32 indices (an
embedding looked up with ``x[ids]``) into a ``GatherND`` with int32 indices, which ONNX
forbids (onnxscript 0.7); the replacement casts the indices to int64 first.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from xdevice._device import Device
from xdevice._errors import ConversionError, message
from xdevice._quiet import quiet_stderr
from xdevice.backends._export import exporter_failed, record_output_names
from xdevice.backends._model_io import Inputs, call_with, flat_outputs, output_names

if TYPE_CHECKING:
    from xdevice.backends.torch.ops import TorchOps

__all__ = ["Export"]


class _Flat(torch.nn.Module):
    """``target``'s forward on flat inputs (rebuilt into the structure the examples came in:
    a dict as keyword arguments, as Hugging Face models take them), its outputs flattened to
    a tuple (the graph's output order), their names noted. Outputs that are not tensors (a
    Hugging Face model's key-value cache object, when ``use_cache`` is on) are left out."""

    def __init__(self, target: Any, inputs: Inputs):
        super().__init__()
        self.target = target  # a module registers as a child: its weights become initializers
        self.inputs = inputs
        self.names: list[str] = []

    def forward(self, *xs: Any) -> tuple[Any, ...]:
        y = call_with(self.target, self.inputs, xs, keywords=True)
        kept = [(name, leaf) for name, leaf in zip(output_names(y), flat_outputs(y)) if isinstance(leaf, torch.Tensor)]
        self.names[:] = [name for name, _ in kept]  # in place: torch.export restores reassigned attributes
        return tuple(leaf for _, leaf in kept)


class _Imported(torch.nn.Module):
    """An imported ONNX model as a module: its weights as buffers, ``apply`` as forward."""

    def __init__(self, imported: Any):
        super().__init__()
        self.imported, self.names = imported, list(imported.params)
        for i, name in enumerate(self.names):
            self.register_buffer(f"w{i}", imported.params[name])

    def forward(self, *inputs: Any) -> Any:
        params = {name: getattr(self, f"w{i}") for i, name in enumerate(self.names)}
        outputs = self.imported.apply(params, *inputs)
        return outputs[0] if len(outputs) == 1 else outputs


def _dims(specs: list[tuple[str, str, tuple]]) -> dict[str, Any]:
    """``torch.export`` dynamic shapes: ``Dim.DYNAMIC`` for every symbolic dimension, so that
    torch infers what the graph implies (two inputs' dims equal, a sequence at most the
    position table's length) and errors only where the graph fixes a size (``forward(*inputs)``
    has one parameter, ``inputs``: its spec is the tuple of per-input specs)."""
    return {
        "inputs": tuple(
            {axis: torch.export.Dim.DYNAMIC for axis, d in enumerate(shape) if isinstance(d, str)} or None
            for _, _, shape in specs
        )
    }


class Export:
    ops: ClassVar[TorchOps]  # the assembled backend's
    device_from_native: Callable[[torch.device], Device]  # devices.py's, in the assembled backend

    def export_onnx(self, target: Any, example_inputs: tuple[Any, ...], opset: int, axes: list[dict[int, str]]) -> Any:
        inputs = example_inputs if isinstance(example_inputs, Inputs) else Inputs.of(example_inputs)
        module = _Flat(target, inputs)
        args = tuple(torch.as_tensor(x, device=_device_of(target)) for x in example_inputs)
        shapes = None
        if any(axes):
            small = [
                f"{name}[{a}]={x.shape[a]}"
                for name, x, found in zip(inputs.names, args, axes)
                for a in found
                if x.shape[a] < 2
            ]
            if small:
                # torch.export takes a size of 0 or 1 for a constant and would pin that axis
                raise ConversionError(
                    message(
                        "torch.export needs example sizes of at least 2 on dynamic axes",
                        received=small,
                        fix="pass example inputs with 2 or more rows there, or dynamic_batch=False",
                    )
                )
            # Dim.DYNAMIC: torch infers what the model implies (equal sizes, a sequence at most a
            # position table's length); the names are put on the ONNX inputs afterwards
            shapes = (tuple({a: torch.export.Dim.DYNAMIC for a in found} for found in axes),)  # forward(*xs)
        with _inference(module), _quiet():
            try:
                proto = _dynamo(module, args, shapes, opset)
            except _Failed as first:
                # the TorchScript exporter traces differently (no decompositions to re-trace): a
                # model that trips torch.export (a view of a non-contiguous tensor, say) may pass
                try:
                    proto = _torchscript(module, args, axes, opset)
                except Exception as second:  # noqa: BLE001 - the first error is the one to act on
                    raise exporter_failed(
                        first.exporter,
                        first.error,
                        first.fix
                        + _culprit(first.error)
                        + f"; the TorchScript exporter failed too ({type(second).__name__}: "
                        f"{str(second).splitlines()[0][:300]})",
                    ) from first.error
        if not module.names:  # torch.export ran a copy of the module: name the outputs from one plain call
            with _inference(module), torch.no_grad():  # in training mode, batch norm would update its statistics
                module(*args)
        record_output_names(proto, module.names)
        return proto

    def save_converted(
        self, imported: Any, specs: list[tuple[str, str, tuple]], examples: list[Any], path: os.PathLike, dynamic: bool
    ) -> None:
        program = torch.export.export(
            _Imported(imported),
            tuple(torch.as_tensor(x) for x in examples),
            dynamic_shapes=_dims(specs) if dynamic else None,
        )
        torch.export.save(program, str(path))

    def native_outputs(self, target: Any, inputs: tuple[Any, ...]) -> list[Any]:
        module = _Flat(target, inputs if isinstance(inputs, Inputs) else Inputs.of(inputs))
        device = _device_of(target)  # the inputs go there: a module on CUDA computes on CUDA
        with _inference(module), torch.no_grad():
            outputs = module(*(torch.as_tensor(x, device=device) for x in inputs))
        return [self.ops.to_numpy(y) for y in outputs]

    def reference_device(self, target: Any) -> Device:
        """Where ``native_outputs`` computes: where ``target``'s weights live, the CPU when it
        has none."""
        return self.device_from_native(_device_of(target))


class _Failed(Exception):
    def __init__(self, exporter: str, error: BaseException, fix: str):
        super().__init__(str(error))
        self.exporter, self.error, self.fix = exporter, error, fix


def _dynamo(module: torch.nn.Module, args: tuple, shapes: Any, opset: int) -> Any:
    """``torch.export`` then ``torch.onnx`` (onnxscript): the exporter PyTorch recommends."""
    try:
        program = torch.export.export(module, args, dynamic_shapes=shapes, strict=False)
    except Exception as error:  # torch raises many types; each is reported the same way
        raise _Failed(
            "torch.export",
            error,
            "make the forward traceable: no Python branches on tensor values, and no int() of a batch-sized dimension",
        ) from error
    try:
        return torch.onnx.export(
            program, args, dynamo=True, opset_version=opset, custom_translation_table=_translations(), verbose=False
        ).model_proto
    except Exception as error:
        raise _Failed(
            "torch.onnx",
            error,
            "an aten op without an ONNX translation: try another opset, or export from another backend",
        ) from error


def _torchscript(module: torch.nn.Module, args: tuple, axes: list[dict[int, str]], opset: int) -> Any:
    """PyTorch's TorchScript-based exporter (``dynamo=False``), which writes opsets up to 20."""
    import io

    import onnx

    buffer = io.BytesIO()
    names = [f"xs_{i}" for i in range(len(args))]
    dynamic = {name: found for name, found in zip(names, axes) if found} or None
    logging_on = torch._C._jit_is_onnx_log_enabled()
    torch._C._jit_set_onnx_log_output_stream("stderr")  # where _quiet captures it (the default is stdout)
    try:
        with warnings.catch_warnings():  # its deprecation notice and tracer warnings
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module,
                args,
                buffer,
                dynamo=False,
                opset_version=min(opset, 20),
                input_names=names,
                dynamic_axes=dynamic,
            )
    finally:  # the exporter switches ONNX logging on and leaves it on (torch 2.13's setup_onnx_logging)
        torch._C._jit_set_onnx_log_enabled(logging_on)
    return onnx.load_from_string(buffer.getvalue())


def _culprit(error: BaseException) -> str:
    """Where in the model's own code the error arose (the innermost frame outside torch and
    xdevice), for the fix: "; the failing code: modeling_t5.py:402 in forward"."""
    import traceback

    frames: list[traceback.FrameSummary] = []
    seen: BaseException | None = error
    while seen is not None:
        frames += traceback.extract_tb(seen.__traceback__)
        seen = seen.__cause__ or seen.__context__
    found = re.findall(r'File "([^"]+)", line (\d+), in (\w+)', str(error))
    frames += [traceback.FrameSummary(f, int(n), fn) for f, n, fn in found]
    own = [
        f
        for f in frames
        if not any(part in f.filename for part in ("/torch/", "/xdevice/", "/backends/", "/converters/", "<"))
    ]
    if not own:
        return ""
    last = own[-1]
    return f"; the failing code: {os.path.basename(last.filename)}:{last.lineno} in {last.name}"


def _device_of(target: Any) -> torch.device:
    """Where ``target``'s weights live (inputs must be there too); the CPU when it has none."""
    if isinstance(target, torch.nn.Module):
        first = next(itertools.chain(target.parameters(), target.buffers()), None)
        if first is not None:
            return first.device
    return torch.device("cpu")


@contextlib.contextmanager
def _inference(module: torch.nn.Module) -> Iterator[None]:
    """``module`` in eval mode (dropout off, batch norm on running statistics), and every
    submodule's own mode restored afterwards."""
    modes = {m: m.training for m in module.modules()}
    module.eval()
    try:
        yield
    finally:
        for m, training in modes.items():
            m.training = training


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence torch's own deprecation notices and log lines while exporting (torchvision not
    installed, fake-tensor tracebacks, onnx_ir's serializer notes): they are about torch
    internals, not the user's model. What torch writes to stderr itself (``torch.export``
    prints the partial graph of a failed trace, the TorchScript exporter its IR graph from
    C++) is captured (``xdevice._quiet``: logged at DEBUG on ``xdevice.backends.torch.onnx``,
    shown as it comes with ``XDEVICE_VERBOSE``); an error raised here passes through
    unchanged, without replaying those lines: the user gets it once, in xdevice's words."""
    failure: BaseException | None = None
    with quiet_stderr("torch.onnx"), _quiet_loggers():
        try:
            yield
        except BaseException as error:  # noqa: BLE001 - raised again below, once stderr is back
            failure = error
    if failure is not None:
        raise failure


@contextlib.contextmanager
def _quiet_loggers() -> Iterator[None]:
    # torch's exporter logs, and fake tensors log every failed meta kernel with its traceback
    # (the error itself reaches the user once, as a ConversionError with its one-line cause)
    loggers = [
        logging.getLogger(name)
        for name in (
            "torch.onnx._internal.exporter._registration",
            "torch._subclasses.fake_tensor",
            "onnx_ir.serde",
            "torch.fx.experimental.symbolic_shapes",
        )
    ]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _translations() -> dict[Any, Any]:
    from onnxscript import ir
    from onnxscript import opset18 as op
    from onnxscript.function_libs.torch_lib.ops import core

    def int64(index: Any) -> Any:
        if index is None or index.dtype in (ir.DataType.BOOL, ir.DataType.INT64):
            return index
        cast = op.Cast(index, to=ir.DataType.INT64)
        cast.shape, cast.dtype = index.shape, ir.DataType.INT64  # the tracer does not infer them
        return cast

    def aten_index(self: Any, indices: Any) -> Any:
        return core.aten_index(self, [int64(index) for index in indices])

    return {torch.ops.aten.index.Tensor: aten_index}
