"""``gpt2``: GPT-2 (124M by default) as transformers' ``GPT2LMHeadModel`` computes it: token and
learned position embeddings, pre-norm blocks of causal multi-head attention and a tanh-GELU
MLP, a final layer norm, and the language-model head (GPT-2's is the token embedding, tied).

The parameters keep GPT-2's own layouts: its ``Conv1D`` already stores ``(in, out)``, the
zoo's dense layout, so a checkpoint's ``c_attn`` (q, k and v side by side) and ``c_proj``
load as they are. Positions are ``0 .. tokens - 1`` with or without padding, as the
transformers forward makes them when it is not given ``position_ids``; ``generate`` (see
``xdevice.models._generate``) counts them from the attention mask, as ``GenerationMixin``
does. Dropout is left out: the model computes inference's math, and training runs without it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from xdevice.models import _pretrained, _remat
from xdevice.models._attention import fused_heads
from xdevice.models._fit import check_heads, token_fitting
from xdevice.models._generate import Decoder
from xdevice.models._init import Param, norm

DEFAULTS = {
    "vocab": 50257,
    "length": 1024,
    "width": 768,
    "heads": 12,
    "blocks": 12,
    "mlp": 3072,
    "eps": 1e-5,
    "tied": True,
    "eos": 50256,
    "pad": None,
    "remat": False,
}
SMALL = {"vocab": 96, "length": 32, "width": 32, "heads": 4, "blocks": 2, "mlp": 64}
HYPERPARAMETERS = {
    "vocab": "token ids run 0 <= id < vocab (50257: GPT-2's byte-level BPE)",
    "length": "positions (the position embedding's rows): the most tokens a row, prompt and generated, may hold",
    "width": "the model width (embeddings, attention, residual stream)",
    "heads": "attention heads; they split the width, which they must divide",
    "mlp": "hidden width of each block's tanh-GELU MLP (4 x width in GPT-2)",
    "blocks": "pre-norm decoder blocks",
    "eps": "layer norm's epsilon",
    "tied": "the head is the token embedding transposed (GPT-2's); False: a head of its own",
    "eos": "end-of-sequence id (or a list of them) that ends a row in generate; None: none",
    "pad": "id given to a row after its end in generate; None: the first eos id (transformers' rule)",
    "remat": "training recomputes each block's activations in the backward pass instead of keeping them",
}
INPUT = "int[rows, tokens]: token ids, at most length tokens; attention_mask [rows, tokens] optional (0: padding)"
OUTPUT = "float[rows, tokens, vocab]: next-token logits at every position (no softmax)"
INPUTS = ("attention_mask",)
TRANSFORMERS_CLASS = "GPT2LMHeadModel"
MODEL_TYPE = "gpt2"
_PREFIXES = ("transformer.", "")


def check(spec: dict) -> None:
    check_heads("GPT-2", spec)


def parameters(spec: dict) -> dict[str, Param]:
    """GPT-2's initialisation: weights and embeddings normal(0, 0.02), biases zero."""
    d, hidden = spec["width"], spec["mlp"]
    table = {
        "tokens.weight": Param((spec["vocab"], d), "normal"),
        "positions.weight": Param((spec["length"], d), "normal"),
    }

    def dense(prefix: str, inputs: int, outputs: int) -> None:
        table[f"{prefix}.weight"] = Param((inputs, outputs), "normal")
        table[f"{prefix}.bias"] = Param((outputs,), "zeros")

    for i in range(spec["blocks"]):
        b = f"block{i}"
        table.update(norm(f"{b}.norm1", d))
        dense(f"{b}.attn.qkv", d, 3 * d)
        dense(f"{b}.attn.out", d, d)
        table.update(norm(f"{b}.norm2", d))
        dense(f"{b}.mlp.fc1", d, hidden)
        dense(f"{b}.mlp.fc2", hidden, d)
    table.update(norm("norm", d))
    if not spec["tied"]:
        table["head.weight"] = Param((d, spec["vocab"]), "normal")
    return table


def cache_layout(spec: dict) -> tuple[int, int, int]:
    """``(layers, key/value heads, head size)`` of the generation cache."""
    return spec["blocks"], spec["heads"], spec["width"] // spec["heads"]


def apply(ops, params, x, spec, train=False, attention_mask=None, cache=None, positions=None):
    """Logits ``(rows, tokens, vocab)``; with ``cache`` (generation), ``(logits of the last
    token, cache)``; ``positions`` overrides ``0 .. tokens - 1``."""
    d, heads, eps = spec["width"], spec["heads"], spec["eps"]
    decoder = Decoder(ops, x, attention_mask, cache, positions)
    t = decoder.tokens
    if positions is None:
        placed = ops.slice(params["positions.weight"], [0], [t], axes=[0])
    else:
        placed = ops.take(params["positions.weight"], decoder.position_ids(), axis=0)
    h = ops.add(ops.take(params["tokens.weight"], x, axis=0), placed)
    remat = spec.get("remat", False) and train and cache is None  # generation never recomputes
    for i in range(spec["blocks"]):
        b = f"block{i}"

        def run(h, params, i=i, b=b):
            y = ops.layer_norm(h, params[f"{b}.norm1.scale"], params[f"{b}.norm1.offset"], eps=eps)
            q, k, v = fused_heads(
                ops, y, params[f"{b}.attn.qkv.weight"], params[f"{b}.attn.qkv.bias"], t, heads, d // heads
            )
            attended = ops.reshape(ops.transpose(decoder.attend(i, q, k, v), (0, 2, 1, 3)), (-1, t, d))
            h = ops.add(h, ops.linear(attended, params[f"{b}.attn.out.weight"], params[f"{b}.attn.out.bias"]))
            y = ops.layer_norm(h, params[f"{b}.norm2.scale"], params[f"{b}.norm2.offset"], eps=eps)
            y = ops.gelu(ops.linear(y, params[f"{b}.mlp.fc1.weight"], params[f"{b}.mlp.fc1.bias"]), approximate=True)
            return ops.add(h, ops.linear(y, params[f"{b}.mlp.fc2.weight"], params[f"{b}.mlp.fc2.bias"]))

        h = _remat.block(ops, run, h, params, f"{b}.", remat)
    h = decoder.last(ops.layer_norm(h, params["norm.scale"], params["norm.offset"], eps=eps))
    head = ops.transpose(params["tokens.weight"]) if spec["tied"] else params["head.weight"]
    return decoder.result(ops.matmul(h, head), train)


fitting = token_fitting


def example_input(spec: dict, batch: int, rng: np.random.Generator) -> np.ndarray:
    """Token ids without padding, ``min(length, 32)`` a row."""
    return rng.integers(0, spec["vocab"], size=(batch, min(spec["length"], 32))).astype(np.int32)


# -- transformers checkpoints ------------------------------------------------------------------


def spec_from_config(config: dict[str, Any]) -> dict[str, Any]:
    """The spec of a ``GPT2Config`` (transformers' defaults for missing fields). Fields that
    change the math and are not computed here are refused by name."""
    name = "gpt2"
    _pretrained.refuse(name, config, "activation_function", ("gelu_new", "gelu_pytorch_tanh"))
    _pretrained.refuse(name, config, "scale_attn_weights", True)
    _pretrained.refuse(name, config, "scale_attn_by_inverse_layer_idx", False)
    _pretrained.refuse(name, config, "reorder_and_upcast_attn", False)
    _pretrained.refuse(name, config, "add_cross_attention", False)
    width = config.get("n_embd", 768)
    return {
        "vocab": config.get("vocab_size", 50257),
        "length": config.get("n_positions", 1024),
        "width": width,
        "heads": config.get("n_head", 12),
        "blocks": config.get("n_layer", 12),
        "mlp": config.get("n_inner") or 4 * width,
        "eps": config.get("layer_norm_epsilon", 1e-5),
        "tied": config.get("tie_word_embeddings", True),
        "eos": config.get("eos_token_id", 50256),
        "pad": config.get("pad_token_id"),
    }


_RENAMES = {  # zoo name -> transformers' (under transformer.h.{i} for blocks)
    "norm1": "ln_1",
    "attn.qkv": "attn.c_attn",
    "attn.out": "attn.c_proj",
    "norm2": "ln_2",
    "mlp.fc1": "mlp.c_fc",
    "mlp.fc2": "mlp.c_proj",
}
_SUFFIXES = {"scale": "weight", "offset": "bias", "weight": "weight", "bias": "bias"}


def _transformers_name(key: str) -> str:
    """The transformers name of a zoo parameter, without the ``transformer.`` prefix
    (``block3.attn.qkv.weight`` -> ``h.3.attn.c_attn.weight``); Conv1D keeps (in, out)."""
    if key == "tokens.weight":
        return "wte.weight"
    if key == "positions.weight":
        return "wpe.weight"
    layer, _, rest = key.partition(".")
    if layer == "norm":
        return f"ln_f.{_SUFFIXES[rest]}"
    module, _, suffix = rest.rpartition(".")
    return f"h.{layer[len('block') :]}.{_RENAMES[module]}.{_SUFFIXES[suffix]}"


def params_from_transformers(tensors: dict[str, np.ndarray], spec: dict) -> dict[str, np.ndarray]:
    """Zoo parameters from a ``GPT2LMHeadModel`` (or ``GPT2Model``) checkpoint's tensors."""
    out = {}
    for key in parameters(spec):
        if key == "head.weight":
            out[key] = _pretrained.take(tensors, "lm_head.weight").T.copy()
        else:
            out[key] = _pretrained.take(tensors, _transformers_name(key), prefixes=_PREFIXES)
    return out


def to_transformers(params: dict[str, np.ndarray], spec: dict) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A ``GPT2LMHeadModel`` config and its tensors (a tied head is left for transformers to tie)."""
    config = {
        "architectures": [TRANSFORMERS_CLASS],
        "model_type": MODEL_TYPE,
        "vocab_size": spec["vocab"],
        "n_positions": spec["length"],
        "n_embd": spec["width"],
        "n_head": spec["heads"],
        "n_layer": spec["blocks"],
        "n_inner": spec["mlp"],
        "activation_function": "gelu_new",
        "layer_norm_epsilon": spec["eps"],
        "tie_word_embeddings": spec["tied"],
        "eos_token_id": spec["eos"],
        "pad_token_id": spec["pad"],
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
    }
    tensors = {}
    for key, value in params.items():
        name = "lm_head.weight" if key == "head.weight" else "transformer." + _transformers_name(key)
        tensors[name] = np.asarray(value.T if key == "head.weight" else value, dtype=np.float32)
    return config, tensors
