"""``bert``: the BERT encoder (BERT-base by default) as transformers' ``BertModel`` computes it:
the last hidden state, or the pooled output.

Word, token-type and position embeddings are summed (in that order) and layer-normed; then
post-norm encoder layers: multi-head self-attention under the padding mask, a residual and
a layer norm; an exact (erf) GELU MLP, a residual and a layer norm (epsilon 1e-12). The
pooler is a dense layer and tanh on the first token's hidden state (``[CLS]``). Attention
goes through the op set's ``attention``, so each backend's fused kernel runs it.

Two outputs, one model: ``output="last_hidden_state"`` (the default, ``BertModel``'s
``last_hidden_state``) or ``output="pooled"`` (its ``pooler_output``). A spec option rather
than a pair of arrays, so the model keeps one output for ``fit``, export and serving. A
model loaded with ``weights=`` takes its sizes from ``config.json`` and the option beside
them: ``models.build("bert", weights=folder, output="pooled")``.

Inputs besides the ids: ``attention_mask`` (1 for real tokens, 0 for padding; default all
ones) hides padded keys from every query, as ``BertModel`` does; ``token_type_ids`` (segment
ids; default zeros). Positions are ``0 .. tokens - 1``. The word embedding's padding row
gets no gradient (``nn.Embedding(padding_idx=pad_token_id)``'s rule). The zoo trains
without dropout. ``build("bert", weights=folder)`` reads a ``BertModel`` folder, or any
``Bert*`` one (``bert.`` prefixed names); fields that change the math and are not computed
(``position_embedding_type`` other than ``absolute``, ``hidden_act`` other than ``gelu``, a
decoder, cross-attention) are refused by name.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from xdevice._errors import ConfigurationError, ConversionError, message
from xdevice.models import _pretrained, _remat
from xdevice.models._attention import fused_heads
from xdevice.models._fit import check_heads, token_fitting
from xdevice.models._init import Param

DEFAULTS: dict[str, Any] = {
    "vocab": 30522,
    "length": 512,
    "types": 2,
    "width": 768,
    "layers": 12,
    "heads": 12,
    "mlp": 3072,
    "eps": 1e-12,
    "pad": 0,
    "pooler": True,
    "output": "last_hidden_state",
    "remat": False,
}
SMALL: dict[str, Any] = {"vocab": 99, "length": 32, "width": 32, "layers": 2, "heads": 4, "mlp": 64}
HYPERPARAMETERS = {
    "vocab": "token ids run 0 <= id < vocab (30522: BERT's uncased WordPiece)",
    "length": "positions (the position embedding's rows): the most tokens a row may hold",
    "types": "token types (segments) token_type_ids may name",
    "width": "the model width (embeddings, attention, residual stream)",
    "layers": "post-norm encoder layers",
    "heads": "attention heads; they split the width, which they must divide",
    "mlp": "hidden width of each layer's GELU MLP (4 x width in BERT)",
    "eps": "layer norm's epsilon",
    "pad": "the padding token id, whose embedding row gets no gradient; None: every row learns",
    "pooler": "whether the model has the pooler (dense + tanh on the first token); Bert*ForMaskedLM and kin do not",
    "output": '"last_hidden_state": float[rows, tokens, width]; "pooled": the pooler\'s float[rows, width]',
    "remat": "training recomputes each block's activations in the backward pass instead of keeping them",
}
INPUT = (
    "int[rows, tokens]: token ids, at most length tokens; attention_mask [rows, tokens] optional "
    "(1: a real token, 0: padding), token_type_ids [rows, tokens] optional (segments, default 0)"
)
OUTPUT = (
    'float[rows, tokens, width]: the last hidden state (output="pooled": float[rows, width], '
    "the pooler's tanh of the first token)"
)
INPUTS = ("attention_mask", "token_type_ids")
TRANSFORMERS_CLASS = "BertModel"
MODEL_TYPE = "bert"
OUTPUTS = ("last_hidden_state", "pooled")
_PREFIXES = ("", "bert.")
_QKV = ("query", "key", "value")  # transformers' three projections, side by side in the zoo's qkv
#: the Bert* classes transformers builds without the pooler (``add_pooling_layer=False``)
_NO_POOLER = ("BertForMaskedLM", "BertLMHeadModel", "BertForTokenClassification", "BertForQuestionAnswering")


def check(spec: dict) -> None:
    check_heads("BERT", spec)
    if spec["output"] not in OUTPUTS:
        raise ConfigurationError(message("Unknown output for 'bert'", received=spec["output"], choices=OUTPUTS))
    if spec["output"] == "pooled" and not spec["pooler"]:
        raise ConfigurationError(
            message(
                "output='pooled' needs the pooler",
                expected="pooler=True",
                received="pooler=False (a checkpoint of a class built without one, such as BertForMaskedLM)",
                fix='output="last_hidden_state", and pool it yourself',
            )
        )


def parameters(spec: dict) -> dict[str, Param]:
    """BERT's initialisation: weights and embeddings normal(0, 0.02), biases zero, norms one."""
    d, hidden = spec["width"], spec["mlp"]
    table = {
        "tokens.weight": Param((spec["vocab"], d), "normal"),
        "positions.weight": Param((spec["length"], d), "normal"),
        "types.weight": Param((spec["types"], d), "normal"),
        "embeddings.norm.scale": Param((d,), "ones"),
        "embeddings.norm.offset": Param((d,), "zeros"),
    }

    def dense(prefix: str, inputs: int, outputs: int) -> None:
        table[f"{prefix}.weight"] = Param((inputs, outputs), "normal")
        table[f"{prefix}.bias"] = Param((outputs,), "zeros")

    def norm(prefix: str) -> None:
        table[f"{prefix}.scale"] = Param((d,), "ones")
        table[f"{prefix}.offset"] = Param((d,), "zeros")

    for i in range(spec["layers"]):
        b = f"layer{i}"
        dense(f"{b}.attn.qkv", d, 3 * d)
        dense(f"{b}.attn.out", d, d)
        norm(f"{b}.norm1")
        dense(f"{b}.mlp.fc1", d, hidden)
        dense(f"{b}.mlp.fc2", hidden, d)
        norm(f"{b}.norm2")
    if spec["pooler"]:
        dense("pooler", d, d)
    return table


def apply(ops, params, x, spec, train=False, attention_mask=None, token_type_ids=None):
    t = ops.shape(x)[1]  # the batch stays -1 in reshapes: it may only be known at run time
    d, heads, eps = spec["width"], spec["heads"], spec["eps"]
    words = ops.take(params["tokens.weight"], x, axis=0)
    if spec["pad"] is not None:  # nn.Embedding(padding_idx=pad): that row's gradient stays zero
        frozen = ops.take(ops.stop_gradient(params["tokens.weight"]), x, axis=0)
        words = ops.where(ops.expand_dims(ops.equal(x, spec["pad"]), -1), frozen, words)
    if token_type_ids is None:  # every token in segment 0: the first row, broadcast
        types = ops.slice(params["types.weight"], [0], [1], axes=[0])
    else:
        types = ops.take(params["types.weight"], token_type_ids, axis=0)
    h = ops.add(ops.add(words, types), ops.slice(params["positions.weight"], [0], [t], axes=[0]))
    h = ops.layer_norm(h, params["embeddings.norm.scale"], params["embeddings.norm.offset"], eps=eps)
    mask = None if attention_mask is None else ops.reshape(ops.not_equal(attention_mask, 0), (-1, 1, 1, t))
    for i in range(spec["layers"]):
        b = f"layer{i}"

        def run(h, params, b=b):
            q, k, v = fused_heads(
                ops, h, params[f"{b}.attn.qkv.weight"], params[f"{b}.attn.qkv.bias"], t, heads, d // heads
            )
            attended = ops.reshape(ops.transpose(ops.attention(q, k, v, mask), (0, 2, 1, 3)), (-1, t, d))
            y = ops.add(ops.linear(attended, params[f"{b}.attn.out.weight"], params[f"{b}.attn.out.bias"]), h)
            h = ops.layer_norm(y, params[f"{b}.norm1.scale"], params[f"{b}.norm1.offset"], eps=eps)
            y = ops.gelu(ops.linear(h, params[f"{b}.mlp.fc1.weight"], params[f"{b}.mlp.fc1.bias"]))
            y = ops.add(ops.linear(y, params[f"{b}.mlp.fc2.weight"], params[f"{b}.mlp.fc2.bias"]), h)
            return ops.layer_norm(y, params[f"{b}.norm2.scale"], params[f"{b}.norm2.offset"], eps=eps)

        h = _remat.block(ops, run, h, params, f"{b}.", spec.get("remat", False) and train)
    if spec["output"] == "pooled":
        h = ops.tanh(ops.linear(ops.take(h, 0, axis=1), params["pooler.weight"], params["pooler.bias"]))
    return (h, {}) if train else h


fitting = token_fitting


def example_input(spec: dict, batch: int, rng: np.random.Generator) -> np.ndarray:
    """Token ids without padding, ``min(length, 32)`` a row."""
    return rng.integers(0, spec["vocab"], size=(batch, min(spec["length"], 32))).astype(np.int32)


# -- transformers checkpoints ------------------------------------------------------------------


def spec_from_config(config: dict[str, Any]) -> dict[str, Any]:
    """The spec of a ``BertConfig`` (transformers' defaults for missing fields). Fields that
    change the math and are not computed here are refused by name; the pooler is there unless
    ``architectures`` names a class transformers builds without one."""
    name = "bert"
    _pretrained.refuse(name, config, "position_embedding_type", "absolute")
    _pretrained.refuse(name, config, "hidden_act", "gelu")
    _pretrained.refuse(name, config, "is_decoder", False)
    _pretrained.refuse(name, config, "add_cross_attention", False)
    spec = {
        "vocab": int(config.get("vocab_size", 30522)),
        "length": int(config.get("max_position_embeddings", 512)),
        "types": int(config.get("type_vocab_size", 2)),
        "width": int(config.get("hidden_size", 768)),
        "layers": int(config.get("num_hidden_layers", 12)),
        "heads": int(config.get("num_attention_heads", 12)),
        "mlp": int(config.get("intermediate_size", 3072)),
        "eps": float(config.get("layer_norm_eps", 1e-12)),
        "pad": config.get("pad_token_id", 0),
        "pooler": not set(config.get("architectures") or ()) & set(_NO_POOLER),
    }
    check({**DEFAULTS, **spec})
    return spec


def _layer_names(i: int) -> dict[str, str]:
    """Zoo name -> transformers module name, for encoder layer ``i`` (q, k, v apart)."""
    base = f"encoder.layer.{i}"
    return {
        "attn.out": f"{base}.attention.output.dense",
        "norm1": f"{base}.attention.output.LayerNorm",
        "mlp.fc1": f"{base}.intermediate.dense",
        "mlp.fc2": f"{base}.output.dense",
        "norm2": f"{base}.output.LayerNorm",
    }


def _norm(tensors: dict[str, np.ndarray], module: str, zoo: str, out: dict[str, np.ndarray]) -> None:
    """A layer norm's ``weight``/``bias`` (``gamma``/``beta`` in checkpoints converted from
    Google's TensorFlow BERT, which transformers renames as it loads)."""
    for ours, theirs, old in (("scale", "weight", "gamma"), ("offset", "bias", "beta")):
        key = f"{module}.{theirs}"
        if not any(prefix + key in tensors for prefix in _PREFIXES):
            key = f"{module}.{old}"
        out[f"{zoo}.{ours}"] = _pretrained.take(tensors, key, prefixes=_PREFIXES)


def params_from_transformers(tensors: dict[str, np.ndarray], spec: dict) -> dict[str, np.ndarray]:
    """Zoo parameters from a ``BertModel`` checkpoint's tensors (or any ``Bert*``'s, under
    ``bert.``): ``nn.Linear``'s (out, in) transposed, q, k and v side by side."""

    def take(key: str) -> np.ndarray:
        return _pretrained.take(tensors, key, prefixes=_PREFIXES)

    out = {
        "tokens.weight": take("embeddings.word_embeddings.weight"),
        "positions.weight": take("embeddings.position_embeddings.weight"),
        "types.weight": take("embeddings.token_type_embeddings.weight"),
    }
    _norm(tensors, "embeddings.LayerNorm", "embeddings.norm", out)
    for i in range(spec["layers"]):
        b, names = f"layer{i}", _layer_names(i)
        attention = f"encoder.layer.{i}.attention.self"
        out[f"{b}.attn.qkv.weight"] = np.concatenate([take(f"{attention}.{p}.weight").T for p in _QKV], axis=1)
        out[f"{b}.attn.qkv.bias"] = np.concatenate([take(f"{attention}.{p}.bias") for p in _QKV])
        for zoo in ("attn.out", "mlp.fc1", "mlp.fc2"):
            out[f"{b}.{zoo}.weight"] = np.ascontiguousarray(take(f"{names[zoo]}.weight").T)
            out[f"{b}.{zoo}.bias"] = take(f"{names[zoo]}.bias")
        for zoo in ("norm1", "norm2"):
            _norm(tensors, names[zoo], f"{b}.{zoo}", out)
    if spec["pooler"]:
        if not any(prefix + "pooler.dense.weight" in tensors for prefix in _PREFIXES):
            raise ConversionError(
                message(
                    "The checkpoint has no pooler, which its config.json implies",
                    expected="pooler.dense.weight and pooler.dense.bias",
                    received=f"{len(tensors)} tensors, none of the pooler's",
                    fix='list the class it was saved from in config.json\'s "architectures" (BertForMaskedLM '
                    "and kin have no pooler)",
                )
            )
        out["pooler.weight"] = np.ascontiguousarray(take("pooler.dense.weight").T)
        out["pooler.bias"] = take("pooler.dense.bias")
    return out


def to_transformers(params: dict[str, np.ndarray], spec: dict) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A ``BertModel`` config and its tensors (no ``bert.`` prefix, as ``BertModel`` saves)."""
    config = {
        "architectures": [TRANSFORMERS_CLASS],
        "model_type": MODEL_TYPE,
        "vocab_size": spec["vocab"],
        "max_position_embeddings": spec["length"],
        "type_vocab_size": spec["types"],
        "hidden_size": spec["width"],
        "num_hidden_layers": spec["layers"],
        "num_attention_heads": spec["heads"],
        "intermediate_size": spec["mlp"],
        "hidden_act": "gelu",
        "layer_norm_eps": spec["eps"],
        "pad_token_id": spec["pad"],
        "position_embedding_type": "absolute",
        "is_decoder": False,
        "add_cross_attention": False,
    }

    def put(name: str, value: np.ndarray) -> None:
        tensors[name] = np.ascontiguousarray(value, dtype=np.float32)

    tensors: dict[str, np.ndarray] = {}
    put("embeddings.word_embeddings.weight", params["tokens.weight"])
    put("embeddings.position_embeddings.weight", params["positions.weight"])
    put("embeddings.token_type_embeddings.weight", params["types.weight"])
    put("embeddings.LayerNorm.weight", params["embeddings.norm.scale"])
    put("embeddings.LayerNorm.bias", params["embeddings.norm.offset"])
    for i in range(spec["layers"]):
        b, names = f"layer{i}", _layer_names(i)
        attention = f"encoder.layer.{i}.attention.self"
        weights = np.split(np.asarray(params[f"{b}.attn.qkv.weight"]), 3, axis=1)
        biases = np.split(np.asarray(params[f"{b}.attn.qkv.bias"]), 3)
        for part, weight, bias in zip(_QKV, weights, biases):
            put(f"{attention}.{part}.weight", weight.T)
            put(f"{attention}.{part}.bias", bias)
        for zoo in ("attn.out", "mlp.fc1", "mlp.fc2"):
            put(f"{names[zoo]}.weight", np.asarray(params[f"{b}.{zoo}.weight"]).T)
            put(f"{names[zoo]}.bias", params[f"{b}.{zoo}.bias"])
        for zoo in ("norm1", "norm2"):
            put(f"{names[zoo]}.weight", params[f"{b}.{zoo}.scale"])
            put(f"{names[zoo]}.bias", params[f"{b}.{zoo}.offset"])
    if spec["pooler"]:
        put("pooler.dense.weight", np.asarray(params["pooler.weight"]).T)
        put("pooler.dense.bias", params["pooler.bias"])
    return config, tensors
