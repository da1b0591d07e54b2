"""Real models from every framework, exported as their users hold them, verified in ONNX
Runtime, imported onto every backend and compared with the source relative to the outputs'
scale; gradients through the import compared with the source framework's own; converted to
every saved format. Cases: tests/realworld/cases.py (``make test`` runs SMOKE, ``make
test-models`` all)."""

from __future__ import annotations

import importlib.util
import warnings
from typing import Any

import numpy as np
import pytest

import xdevice
from xdevice import ConversionError, compare
from xdevice.backends._model_io import Inputs, call_with, flat_outputs

from .cases import CASES, SMOKE

pytest.importorskip("onnxruntime")


def _params(names):
    return [pytest.param(name, marks=() if name in SMOKE else pytest.mark.realworld, id=name) for name in names]


_built: dict[str, tuple] = {}


def built(name: str):
    """``(case, model, inputs, export result, source outputs)``, once per case."""
    if name not in _built:
        from xdevice.converters import export

        case = CASES[name]
        if importlib.util.find_spec(case.library) is None or importlib.util.find_spec(case.framework) is None:
            pytest.skip(f"{case.library} is not installed")
        model, example = case.build()
        inputs = Inputs.of(example, convert=np.asarray)
        result = export(model, example_inputs=example)
        expected = xdevice.backend(case.framework).native_outputs(model, inputs)
        _built[name] = (case, model, inputs, result, expected)
    return _built[name]


def scaled(actual, expected, cap: float | None = 1.0):
    """The export's own check: float32 tolerance, the absolute part scaled to the output's
    largest magnitude (capped at ``cap``: outputs; uncapped for gradients, which are sums over
    the batch and every position and grow with them)."""
    expected = np.asarray(expected)
    scale = 1.0
    if expected.dtype.kind == "f" and expected.size:
        scale = max(float(np.abs(expected).max()), 1e-30)
        scale = scale if cap is None else min(cap, scale)
    return compare(actual, expected, "float32", scale=scale)


def feeds(imported, inputs: Inputs) -> list:
    by_name = dict(zip(inputs.names, inputs))
    return [by_name[name] for name in imported.input_names]


@pytest.mark.parametrize("name", _params(CASES))
def test_exports_with_its_inputs_and_outputs_named_and_verifies(name):
    case, _, inputs, result, expected = built(name)
    assert [t.name for t in result.inputs] == list(inputs.names) and result.verification
    assert len(result.outputs) == len(expected)
    assert all(v.comparison.ok for v in result.verification)


@pytest.mark.parametrize("name", _params(CASES))
def test_the_import_on_every_backend_matches_the_source(name, backend):
    from xdevice.converters import from_onnx

    _, _, inputs, result, expected = built(name)
    imported = from_onnx(result.model, backend=backend.name)
    outputs = imported.apply(imported.params, *feeds(imported, inputs))
    for output, got, want in zip(imported.output_names, outputs, expected):
        check = scaled(backend.ops.to_numpy(got), want)
        assert check.ok, f"{name} output {output} on {backend.name}: {check.describe()}"


def source_gradients(case, model, inputs: Inputs, weights: list) -> tuple[Any, dict, dict]:
    """``(d loss / d input, params, d loss / d params)`` by the source framework's own autodiff,
    where ``loss = sum_i <output_i, weights_i>``; the input gradient is None without
    ``case.grad_input``; params and their gradients are numpy, keyed by the source's names."""
    position = inputs.names.index(case.grad_input) if case.grad_input else None
    leaves = list(inputs)
    if case.framework == "torch":
        import torch

        tensors = [torch.as_tensor(x) for x in leaves]
        if position is not None:
            tensors[position].requires_grad_(True)
        model.zero_grad()
        outputs = flat_outputs(call_with(model, inputs, tensors, keywords=True))
        loss(outputs, weights, lambda a, b: (a * torch.as_tensor(b)).sum()).backward()
        named = [(k, w) for k, w in model.named_parameters() if w.grad is not None]
        return (
            None if position is None else tensors[position].grad.numpy(),
            {k: w.detach().numpy() for k, w in named},
            {k: w.grad.numpy() for k, w in named},
        )
    if case.framework == "tensorflow":
        import tensorflow as tf

        tensors = [tf.convert_to_tensor(x) for x in leaves]
        variables = model.trainable_variables
        with tf.GradientTape() as tape:
            if position is not None:
                tape.watch(tensors[position])
            structure = inputs.rebuild(tensors)
            y = model(structure if inputs.named else structure[0], training=False)
            value = loss(flat_outputs(y), weights, lambda a, b: tf.reduce_sum(a * b))
        grads = tape.gradient(value, ([tensors[position]] if position is not None else []) + list(variables))
        names = [f"{i}:{v.path}" for i, v in enumerate(variables)]
        found = {
            k: (v.numpy(), g)
            for k, v, g in zip(names, variables, grads[len(grads) - len(variables) :])
            if g is not None
        }
        return (
            None if position is None else grads[0].numpy(),
            {k: v for k, (v, _) in found.items()},
            {k: tf.convert_to_tensor(g).numpy() for k, (_, g) in found.items()},
        )  # embeddings: IndexedSlices
    import jax

    apply, params = functional(model)
    flat, tree = jax.tree_util.tree_flatten(params)
    trained = [i for i, leaf in enumerate(flat) if np.issubdtype(np.asarray(leaf).dtype, np.floating)]

    def objective(train, x):
        full = list(flat)
        for i, leaf in zip(trained, train):
            full[i] = leaf
        arrays = leaves if position is None else [*leaves[:position], x, *leaves[position + 1 :]]
        outputs = flat_outputs(
            call_with(lambda *xs: apply(jax.tree_util.tree_unflatten(tree, full), *xs), inputs, arrays, keywords=False)
        )
        return loss(outputs, weights, lambda a, b: (a * b).sum())

    x = leaves[position] if position is not None else np.zeros(())
    grad_train, grad_x = jax.grad(objective, argnums=(0, 1))([flat[i] for i in trained], x)
    return (
        None if position is None else np.asarray(grad_x),
        {str(i): np.asarray(flat[i]) for i in trained},
        {str(i): np.asarray(g) for i, g in zip(trained, grad_train)},
    )


def functional(model):
    """A JAX model as ``(apply, params)``: an NNX module split into its graph and state."""
    if isinstance(model, tuple):
        return model
    from flax import nnx

    graph, state = nnx.split(model)
    return (lambda s, *xs: nnx.merge(graph, s)(*xs)), state


def loss(outputs, weights, product):
    return sum(product(o, w) for o, w in zip(outputs, weights) if w is not None)


def shared(source: dict, imported: dict) -> list[tuple[str, str, tuple[int, ...]]]:
    """The source parameters that the ONNX graph holds unchanged, up to a transpose (ONNX's
    OIHW against Keras' HWIO, a Linear's weight stored transposed): ``(source name, initializer
    name, perm)`` with ``initializer == source.transpose(perm)``. Only one-to-one matches count:
    a value that several parameters share (a LayerNorm's initial ones) says nothing of which
    is which."""
    import itertools

    matches = {}
    for name, value in source.items():
        matches[name] = [
            (onnx_name, perm)
            for onnx_name, candidate in imported.items()
            if candidate.size == value.size and candidate.size > 1
            for perm in itertools.permutations(range(value.ndim))
            if value.transpose(perm).shape == candidate.shape and np.array_equal(value.transpose(perm), candidate)
        ]
    sources_of: dict[str, int] = {}
    for found in matches.values():
        for onnx_name in {onnx_name for onnx_name, _ in found}:
            sources_of[onnx_name] = sources_of.get(onnx_name, 0) + 1
    return [
        (name, found[0][0], found[0][1])
        for name, found in matches.items()
        if len(found) == 1 and sources_of[found[0][0]] == 1
    ]


def output_weights(expected) -> list:
    """The loss is ``sum_i <output_i, weights_i>`` over the float outputs: every element counts."""
    return [
        np.random.default_rng(1).normal(size=e.shape).astype(e.dtype) if e.dtype.kind == "f" else None for e in expected
    ]


def import_gradients(backend, case, result, inputs: Inputs, weights: list, source_params: dict, float64: bool = False):
    """``(pairs, gradients)`` through the import on ``backend``: for the input (key "input")
    and for the initializers that are parameters of the source (``shared``), as numpy; with
    ``float64``, the weights and float inputs are widened first (the numpy backend then
    computes in float64)."""
    from xdevice.converters import from_onnx

    imported = from_onnx(result.model, backend=backend.name)
    ops = backend.ops
    pairs = shared(source_params, {k: ops.to_numpy(v) for k, v in imported.params.items()})
    widen = (lambda x: x.astype(np.float64) if x.dtype == np.float32 else x) if float64 else (lambda x: x)
    if float64:
        imported.params = {k: widen(np.asarray(v)) for k, v in imported.params.items()}
    arrays = [ops.asarray(widen(np.asarray(x))) for x in feeds(imported, inputs)]
    position = imported.input_names.index(case.grad_input) if case.grad_input else None

    def objective(p):
        params = {**imported.params, **{k: v for k, v in p.items() if k != "input"}}
        xs = arrays if position is None else [*arrays[:position], p["input"], *arrays[position + 1 :]]
        total = ops.asarray(0.0)
        for out, w in zip(imported.apply(params, *xs), weights):
            if w is not None:
                total = ops.add(total, ops.sum(ops.multiply(out, ops.asarray(w))))
        return total

    trained = {onnx_name: imported.params[onnx_name] for _, onnx_name, _ in pairs}
    if position is not None:
        trained["input"] = arrays[position]
    _, grads = backend.value_and_grad(objective, trained)
    return pairs, {k: ops.to_numpy(g) for k, g in grads.items()}


@pytest.mark.realworld_on("jax")  # JAX's first compile of every op of the graph: make test-models
@pytest.mark.parametrize("name", _params(CASES))
def test_gradients_through_the_import_match_the_source(name, backend):
    """The gradient for the input and for every parameter the graph shares with the source,
    by each backend's autodiff through the import, against the source framework's own."""
    case, model, inputs, result, expected = built(name)
    weights = output_weights(expected)
    want_input, source_params, want = source_gradients(case, model, inputs, weights)
    pairs, grads = import_gradients(backend, case, result, inputs, weights, source_params)
    assert pairs, f"{name}: no parameter of the source is an initializer of the ONNX graph"
    if case.grad_input:
        check = scaled(grads["input"], want_input, cap=None)
        assert check.ok, f"{name} input gradient on {backend.name}: {check.describe()}"
    for source_name, onnx_name, perm in pairs:
        check = scaled(grads[onnx_name], want[source_name].transpose(perm), cap=None)
        assert check.ok, f"{name} gradient of {source_name} ({onnx_name}) on {backend.name}: {check.describe()}"


@pytest.mark.realworld
@pytest.mark.parametrize("name", ["keras-mobilenetv2", "hf-vit"])
def test_gradient_differences_from_the_source_are_float32_rounding(name):
    """MobileNetV2's input gradient through an import differed from Keras' by 1e-4 relative,
    element by element, while the outputs agreed to 6e-7. Against the float64 evaluation of
    the same graph (the numpy backend), Keras' own float32 gradient and every backend's are
    each within float32 rounding of the gradient's scale: the element-wise gap is two
    roundings of near-zero elements, not an error (measured: all <= 1.2e-6 of the scale)."""
    case, model, inputs, result, expected = built(name)
    weights = output_weights(expected)
    want_input, source_params, want = source_gradients(case, model, inputs, weights)
    pairs, reference = import_gradients(
        xdevice.backend("numpy"), case, result, inputs, weights, source_params, float64=True
    )
    assert all(g.dtype == np.float64 for g in reference.values()), "the reference must be float64"
    source = {"input": want_input, **{onnx_name: want[s].transpose(perm) for s, onnx_name, perm in pairs}}
    gradients = {"source": source}
    for framework in ("torch", "jax", "tensorflow"):
        gradients[framework] = import_gradients(
            xdevice.backend(framework), case, result, inputs, weights, source_params
        )[1]
    for who, found in gradients.items():
        for key, exact in reference.items():
            error = float(np.abs(np.asarray(found[key], np.float64) - exact).max() / np.abs(exact).max())
            assert error <= 4e-6, f"{name}: {who}'s gradient for {key} is {error:.2e} of its scale from float64"


@pytest.mark.parametrize("name", _params(CASES))
def test_the_imports_params_are_its_weights_and_train_without_nan(name):
    """One gradient step over ``ImportedModel.params`` keeps every weight finite: exponents
    (GPT-2's and BERT's tanh-GELU ``Pow(x, 3)``) and scalar coefficients are constants."""
    from xdevice.converters import from_onnx

    pytest.importorskip("torch")
    backend = xdevice.backend("torch")
    _, _, inputs, result, expected = built(name)
    imported = from_onnx(result.model, backend="torch")
    assert all(np.ndim(v) > 0 for v in imported.params.values())
    weights, ops = output_weights(expected), backend.ops
    arrays = [ops.asarray(x) for x in feeds(imported, inputs)]

    def objective(params):
        total = ops.asarray(0.0)
        for out, w in zip(imported.apply(params, *arrays), weights):
            if w is not None:
                total = ops.add(total, ops.sum(ops.multiply(out, ops.asarray(w))))
        return total

    _, grads = backend.value_and_grad(objective, imported.params)
    bad = [k for k, g in grads.items() if not np.isfinite(ops.to_numpy(g)).all()]
    assert not bad, f"{name}: non-finite gradients for {bad[:5]}"


@pytest.mark.parametrize("framework", ["torch", "tensorflow", "jax"])
@pytest.mark.parametrize("name", _params(CASES))
def test_converts_to_every_saved_format_and_matches(name, framework, tmp_path):
    from xdevice.converters import convert_model, from_onnx

    pytest.importorskip(framework)
    _, _, inputs, result, expected = built(name)
    suffix = xdevice.backend(framework).saved_format
    converted = convert_model(result.model, to=framework, output=tmp_path / f"model{suffix}")
    arrays = feeds(from_onnx(result.model, backend="numpy"), inputs)
    got = load_and_run(framework, converted.path, arrays)
    for output, actual, want in zip(range(len(expected)), got, expected):
        check = scaled(actual, want)
        assert check.ok, f"{name} as {framework} output {output}: {check.describe()}"


def load_and_run(framework, path, arrays) -> list:
    """Outputs of a converted model loaded with the framework alone (as numpy)."""
    if framework == "torch":
        import torch

        y = torch.export.load(str(path)).module()(*(torch.as_tensor(x) for x in arrays))
        return [t.detach().numpy() for t in (y if isinstance(y, (tuple, list)) else [y])]
    if framework == "tensorflow":
        import tensorflow as tf

        loaded = tf.saved_model.load(str(path))
        y = loaded.serve(*(tf.convert_to_tensor(x) for x in arrays))
        return [t.numpy() for t in (y if isinstance(y, (tuple, list)) else [y])]
    import jax.export

    exported = jax.export.deserialize(bytearray(path.read_bytes()))
    y = exported.call(*arrays)
    return [np.asarray(t) for t in (y if isinstance(y, (tuple, list)) else [y])]


_dynamic_bert: dict = {}


@pytest.mark.realworld
@pytest.mark.parametrize("framework", ["torch", "tensorflow", "jax"])
def test_a_converted_bert_takes_any_batch_and_sequence_in_every_saved_format(framework, tmp_path):
    """A BERT exported with a symbolic batch and sequence (torch.onnx, both dims free) keeps
    both through convert_model: its position table of 64 rows bounds the sequence, which
    torch.export and jax.export learn from the graph."""
    torch = pytest.importorskip("torch")
    pytest.importorskip(framework)
    from xdevice.converters import convert_model, from_onnx

    if "model" not in _dynamic_bert:
        model, example = CASES["hf-bert"].build()
        batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", max=64)

        class Encoder(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.bert = model

            def forward(self, input_ids, attention_mask):
                return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

        args = tuple(torch.as_tensor(example[k]) for k in ("input_ids", "attention_mask"))
        with warnings.catch_warnings():  # torch.onnx notes the two inputs share their axis names
            warnings.simplefilter("ignore")  # and its FutureWarnings about torch internals
            program = torch.onnx.export(
                Encoder().eval(),
                args,
                dynamo=True,
                verbose=False,
                dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}),
                input_names=["input_ids", "attention_mask"],
            )
        _dynamic_bert["model"] = program.model_proto
    proto = _dynamic_bert["model"]
    converted = convert_model(proto, to=framework, output=tmp_path / f"bert{xdevice.backend(framework).saved_format}")
    assert [shape for _, _, shape in converted.inputs] == [("batch", "seq")] * 2 and converted.note == ""
    reference = from_onnx(proto)
    for batch_size, length in [(2, 16), (5, 23)]:
        ids = np.random.default_rng(length).integers(1, 100, size=(batch_size, length)).astype(np.int64)
        mask = np.ones_like(ids)
        mask[:, -3:] = 0
        (got,) = load_and_run(framework, converted.path, [ids, mask])
        check = scaled(got, reference(ids, mask))
        assert got.shape == (batch_size, length, 32) and check.ok, f"{framework} {batch_size}x{length}: {check}"


_recurrent: dict = {}


@pytest.mark.realworld
@pytest.mark.parametrize("framework", ["torch", "tensorflow", "jax"])
def test_a_keras_recurrent_model_with_a_free_sequence_converts_to_every_saved_format(framework, tmp_path):
    """A Keras LSTM + GRU exported with xdevice.export and dynamic_axes={1: "seq"}: tf2onnx
    writes the LSTM as an ONNX LSTM and the GRU as a Loop whose condition compares counters
    with the sequence length. torch and TensorFlow keep the sequence free (a scan over time;
    their while loop, its outputs cut to the iterations run); JAX cannot give a scan output a
    length known only at run time, so it fixes the sequence and says why."""
    keras = pytest.importorskip("keras")
    pytest.importorskip(framework)
    from xdevice.converters import convert_model, export

    if "model" not in _recurrent:
        tokens = keras.Input((None,), dtype="int32", name="tokens")
        h = keras.layers.LSTM(16, return_sequences=True)(keras.layers.Embedding(50, 16)(tokens))
        model = keras.Model(tokens, keras.layers.Dense(3)(keras.layers.GRU(8)(h)))
        example = np.random.default_rng(0).integers(0, 50, size=(2, 12)).astype(np.int32)
        result = export(model, example_inputs=example, dynamic_axes={1: "seq"})
        assert result.inputs[0].shape == ("batch", "seq") and len(result.verification) == 2
        _recurrent["model"] = result.model
    proto = _recurrent["model"]
    output = tmp_path / f"rnn{xdevice.backend(framework).saved_format}"
    free = framework != "jax"
    if not free:  # refused by node, then fixed at the size asked for
        with pytest.raises(ConversionError, match=r"Loop node .*scan outputs.*fixed=\{'seq': <size>\}"):
            convert_model(proto, to=framework, output=output)
    converted = convert_model(proto, to=framework, output=output, fixed=None if free else {"seq": 3})
    assert converted.inputs[0][2] == (("batch", "seq") if free else ("batch", 3))
    assert converted.note == ("" if free else "fixed on request: seq=3")
    reference = _onnxruntime_session(proto)
    for shape in [(2, 12), (5, 19)] if free else [(2, 3), (6, 3)]:
        tokens = np.random.default_rng(shape[1]).integers(0, 50, size=shape).astype(np.int32)
        (got,) = load_and_run(framework, converted.path, [tokens])
        want = reference.run(None, {reference.get_inputs()[0].name: tokens})[0]
        assert got.shape == want.shape and scaled(got, want).ok, f"{framework} {shape}"


def _onnxruntime_session(proto):
    import onnxruntime

    return onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
