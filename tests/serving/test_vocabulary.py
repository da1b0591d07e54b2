"""Token ids are checked against the model's vocabulary before ONNX Runtime sees them: read
from the graph (an integer input indexing a constant table), or from the configuration's
``vocab_size``; an id outside it gets a 400 naming the input, the ids and the vocabulary, and
the server keeps serving."""

from __future__ import annotations

import numpy as np
import pytest

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
pytest.importorskip("starlette")
onnx = pytest.importorskip("onnx")

from tritonclient.utils import InferenceServerException  # noqa: E402 - below the importorskip guard

from xdevice.serving.config import ModelConfig  # noqa: E402 - below the importorskip guard
from xdevice.serving.server import Server  # noqa: E402 - below the importorskip guard
from xdevice.serving.vocabulary import Vocabulary, from_graph, vocabularies  # noqa: E402 - below the guard

from .onnx_models import onnx_model, write_model  # noqa: E402 - below the importorskip guard

TABLE = np.arange(200, dtype=np.float32).reshape(100, 2)  # a vocabulary of 100 ids, 2 numbers each


def embedding_model():
    """total[b, t] = sum(TABLE[ids[b, t]]): token ids in, one number per token out."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["rows"]),
        helper.make_node("ReduceSum", ["rows", "axes"], ["total"], keepdims=0),
    ]
    return onnx_model(
        nodes,
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 3])],
        [helper.make_tensor_value_info("total", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(TABLE, "table"), numpy_helper.from_array(np.array([2], np.int64), "axes")],
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokens")
    write_model(root, "embed", embedding_model(), versions=(1,))
    write_model(
        root,
        "narrow",
        embedding_model(),
        versions=(1,),
        config='parameters { key: "vocab_size" value { string_value: "50" } }',
    )
    with Server(root) as running:
        yield running


def ids(values):
    tensor = httpclient.InferInput("ids", [1, 3], "INT64")
    tensor.set_data_from_numpy(np.array([values], np.int64))
    return tensor


def test_an_id_outside_the_vocabulary_gets_400_naming_it_and_the_next_request_is_served(server):
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as refused:
        client.infer("embed", [ids([3, 999, -1])])
    assert refused.value.status() == "400"
    assert refused.value.message() == (
        "Input 'ids' of model 'embed' holds 2 token ids outside its vocabulary of 100. "
        "Expected 0 <= id < 100 (the rows of 'table' in the graph). Received: [-1, 999]. "
        "Fix: map each id outside the vocabulary to the tokenizer's unknown-token id, "
        "or use the tokenizer this model was trained with."
    )
    assert "GatherND" not in refused.value.message() and "invalid index" not in refused.value.message()
    served = client.infer("embed", [ids([0, 5, 99])]).as_numpy("total")
    assert served.tolist() == [[TABLE[0].sum(), TABLE[5].sum(), TABLE[99].sum()]]


def test_over_grpc_too(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("ids", [1, 3], "INT64")
    tensor.set_data_from_numpy(np.array([[1, 2, 100]], np.int64))
    with pytest.raises(InferenceServerException, match=r"outside its vocabulary of 100.*Received: \[100\]") as refused:
        client.infer("embed", [tensor])
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_vocab_size_in_the_config_overrides_the_graph(server):
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException, match=r"0 <= id < 50 \(vocab_size in .*config.pbtxt\)"):
        client.infer("narrow", [ids([1, 60, 2])])
    assert client.infer("narrow", [ids([1, 49, 2])]).as_numpy("total").shape == (1, 3)


def test_the_graph_is_read_through_the_exporters_idioms_but_not_through_shape_or_comparisons():
    """ids -> Where(ids < 0, ids + 100, ids) -> Gather(table of 100): vocabulary 100 (how JAX and
    TensorFlow export an embedding); positions Range(Shape(ids)) -> Gather(table of 8), and a
    mask Equal(ids, 0) -> Cast -> Gather(table of 2), do not bound the ids."""
    from onnx import TensorProto, helper, numpy_helper

    scalar = {n: numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("zero", 0), ("size", 100))}
    nodes = [
        helper.make_node("Less", ["ids", "zero"], ["negative"]),
        helper.make_node("Add", ["ids", "size"], ["wrapped"]),
        helper.make_node("Where", ["negative", "wrapped", "ids"], ["index"]),
        helper.make_node("Gather", ["table", "index"], ["tokens"]),
        helper.make_node("Shape", ["ids"], ["shape"], start=1, end=2),
        helper.make_node("Squeeze", ["shape"], ["length"]),
        helper.make_node("Range", ["zero", "length", "one"], ["positions"]),
        helper.make_node("Gather", ["positions_table", "positions"], ["placed"]),
        helper.make_node("Equal", ["ids", "zero"], ["pad"]),
        helper.make_node("Cast", ["pad"], ["pad_id"], to=TensorProto.INT64),
        helper.make_node("Gather", ["pad_table", "pad_id"], ["padded"]),
    ]
    tables = [
        numpy_helper.from_array(np.zeros((100, 4), np.float32), "table"),
        numpy_helper.from_array(np.zeros((8, 4), np.float32), "positions_table"),
        numpy_helper.from_array(np.zeros((2, 4), np.float32), "pad_table"),
        numpy_helper.from_array(np.array(1, np.int64), "one"),
        *scalar.values(),
    ]
    graph = onnx_model(
        nodes,
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 8])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("tokens", "placed", "padded")],
        tables,
    ).graph
    assert from_graph(graph) == {"ids": Vocabulary(100, "the rows of 'table' in the graph")}


def test_a_model_without_a_table_has_no_vocabulary_unless_the_config_gives_one(tmp_path):
    from .onnx_models import pair_model

    path = tmp_path / "pair.onnx"
    path.write_bytes(pair_model().SerializeToString())
    assert vocabularies(path, ModelConfig("pair")) == {}
    configured = vocabularies(path, ModelConfig("pair", vocab_size=7, source="pair/config.pbtxt"))
    assert configured == {"n": Vocabulary(7, "vocab_size in pair/config.pbtxt")}  # its one integer input


SMALL = {  # the zoo's token models, small: the export's embedding is what is read
    "lstm": {"embedding": 4, "hidden": 8, "length": 4},
    "transformer": {"length": 4, "width": 8, "heads": 2, "mlp": 16, "blocks": 1},
}


def test_vocab_size_overrides_the_largest_table_only_and_never_beyond_it(tmp_path):
    """BERT's layout: input_ids index the words (100 rows), token_type_ids a table of 2."""
    from onnx import TensorProto, helper, numpy_helper

    from xdevice import ConfigurationError

    model = onnx_model(
        [
            helper.make_node("Gather", ["words", "input_ids"], ["w"]),
            helper.make_node("Gather", ["types", "token_type_ids"], ["t"]),
            helper.make_node("Add", ["w", "t"], ["out"]),
        ],
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", 3]) for n in ("input_ids", "token_type_ids")],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 3, 2])],
        [
            numpy_helper.from_array(np.zeros((100, 2), np.float32), "words"),
            numpy_helper.from_array(np.zeros((2, 2), np.float32), "types"),
        ],
    )
    path = tmp_path / "bert.onnx"
    path.write_bytes(model.SerializeToString())
    sizes = {k: v.size for k, v in vocabularies(path, ModelConfig("bert", vocab_size=90, source="c")).items()}
    assert sizes == {"input_ids": 90, "token_type_ids": 2}
    with pytest.raises(ConfigurationError, match=r"c: vocab_size is larger than the table input 'input_ids' indexes"):
        vocabularies(path, ModelConfig("bert", vocab_size=101, source="c"))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SMALL))
@pytest.mark.realworld_on("jax")  # 19 s for JAX's export of both; the vocabulary is read from the graph alike
def test_every_exported_zoo_token_model_has_its_vocabulary_read_from_the_graph(backend, name, tmp_path):
    if backend.name == "numpy":
        pytest.skip("numpy has no ONNX exporter")
    from xdevice import models
    from xdevice.converters import export

    path = tmp_path / "model.onnx"
    export(models.build(name, backend=backend.name, seed=0, vocab=77, **SMALL[name]), path, verify=False)
    assert {k: v.size for k, v in vocabularies(path, ModelConfig(name)).items()} == {"input": 77}
