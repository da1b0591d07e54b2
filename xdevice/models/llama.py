"""``llama``: the Llama architecture (Llama 3.2 1B by default) as transformers' ``LlamaForCausalLM``
computes it: token embeddings, pre-norm blocks of RMSNorm, grouped-query attention with
rotary position embeddings (Llama 3's ``llama3`` frequency scaling included) and a SwiGLU
MLP, a final RMSNorm, and a head tied to the embedding or of its own.

Rotations follow transformers' convention (``rotate_half``: the head's two halves, not
interleaved pairs); the inverse frequencies are computed once from the spec, in float64 on
the host, and angles in float32 (float64 for a float64 model), as transformers computes
them before casting. Query head ``h`` reads key/value head ``h // (heads / kv_heads)``
(``repeat_kv``'s order). RMSNorm normalises in float32 for half-precision inputs, as
``LlamaRMSNorm`` does. Positions are ``0 .. tokens - 1`` unless given; ``generate`` counts
them from the attention mask (see ``xdevice.models._generate``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from xdevice._errors import ConfigurationError, message
from xdevice.backends.composite import HALF_DTYPES
from xdevice.models import _pretrained, _remat
from xdevice.models._fit import Fitting
from xdevice.models._generate import Decoder
from xdevice.models._init import Param

DEFAULTS = {
    "vocab": 128256,
    "width": 2048,
    "mlp": 8192,
    "blocks": 16,
    "heads": 32,
    "kv_heads": 8,
    "head_dim": 64,
    "length": 131072,
    "eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": "llama3",
    "rope_factor": 32.0,
    "rope_low_freq_factor": 1.0,
    "rope_high_freq_factor": 4.0,
    "rope_original_length": 8192,
    "tied": True,
    "eos": 128001,
    "pad": None,
    "remat": False,
}
SMALL = {"vocab": 96, "width": 32, "mlp": 64, "blocks": 2, "heads": 4, "kv_heads": 2, "head_dim": 8}
HYPERPARAMETERS = {
    "vocab": "token ids run 0 <= id < vocab (128256: Llama 3's tokenizer)",
    "width": "the model width (embeddings, residual stream)",
    "mlp": "hidden width of each block's SwiGLU MLP",
    "blocks": "pre-norm decoder blocks",
    "heads": "query heads",
    "kv_heads": "key/value heads (grouped-query attention); they divide heads",
    "head_dim": "size of each attention head",
    "length": "max_position_embeddings: the context the model was configured for (rotations extend past it)",
    "eps": "RMSNorm's epsilon",
    "rope_theta": "rotary embeddings' base wavelength",
    "rope_scaling": '"llama3" (Llama 3.1+ frequency scaling, the rope_factor... fields) or "none"',
    "rope_factor": "llama3 scaling: low frequencies are divided by it",
    "rope_low_freq_factor": "llama3 scaling: wavelengths past rope_original_length / this are scaled fully",
    "rope_high_freq_factor": "llama3 scaling: wavelengths below rope_original_length / this are kept",
    "rope_original_length": "llama3 scaling: the context length of pre-training",
    "tied": "the head is the token embedding transposed (Llama 3.2 1B and 3B); False: a head of its own",
    "eos": "end-of-sequence id (or a list of them) that ends a row in generate; None: none",
    "pad": "id given to a row after its end in generate; None: the first eos id (transformers' rule)",
    "remat": "training recomputes each block's activations in the backward pass instead of keeping them",
}
INPUT = "int[rows, tokens]: token ids; attention_mask [rows, tokens] optional (0: padding)"
OUTPUT = "float[rows, tokens, vocab]: next-token logits at every position (no softmax)"
INPUTS = ("attention_mask",)
TRANSFORMERS_CLASS = "LlamaForCausalLM"
MODEL_TYPE = "llama"
_PREFIXES = ("model.", "")
_SCALINGS = ("llama3", "none")


def check(spec: dict) -> None:
    if spec["heads"] % spec["kv_heads"]:
        raise ConfigurationError(
            message(
                "Grouped-query attention shares each key/value head among the same number of query heads",
                expected=f"kv_heads dividing heads={spec['heads']}",
                received=f"heads={spec['heads']}, kv_heads={spec['kv_heads']}",
                fix=f"kv_heads={math.gcd(spec['heads'], spec['kv_heads'])}",
            )
        )
    if spec["head_dim"] % 2:
        raise ConfigurationError(
            message(
                "Rotary embeddings turn pairs of a head's values",
                expected="an even head_dim",
                received=spec["head_dim"],
            )
        )
    if spec["rope_scaling"] not in _SCALINGS:
        raise ConfigurationError(message("Unknown rope_scaling", received=spec["rope_scaling"], choices=_SCALINGS))


def parameters(spec: dict) -> dict[str, Param]:
    """transformers' initialisation: weights and embeddings normal(0, 0.02), norms ones; no biases."""
    d, hidden, size = spec["width"], spec["mlp"], spec["head_dim"]
    table = {"tokens.weight": Param((spec["vocab"], d), "normal")}
    for i in range(spec["blocks"]):
        b = f"block{i}"
        table[f"{b}.norm1.scale"] = Param((d,), "ones")
        table[f"{b}.attn.q.weight"] = Param((d, spec["heads"] * size), "normal")
        table[f"{b}.attn.k.weight"] = Param((d, spec["kv_heads"] * size), "normal")
        table[f"{b}.attn.v.weight"] = Param((d, spec["kv_heads"] * size), "normal")
        table[f"{b}.attn.out.weight"] = Param((spec["heads"] * size, d), "normal")
        table[f"{b}.norm2.scale"] = Param((d,), "ones")
        table[f"{b}.mlp.gate.weight"] = Param((d, hidden), "normal")
        table[f"{b}.mlp.up.weight"] = Param((d, hidden), "normal")
        table[f"{b}.mlp.down.weight"] = Param((hidden, d), "normal")
    table["norm.scale"] = Param((d,), "ones")
    if not spec["tied"]:
        table["head.weight"] = Param((d, spec["vocab"]), "normal")
    return table


def cache_layout(spec: dict) -> tuple[int, int, int]:
    """``(layers, key/value heads, head size)`` of the generation cache."""
    return spec["blocks"], spec["kv_heads"], spec["head_dim"]


def inverse_frequencies(spec: dict) -> np.ndarray:
    """The rotations' inverse frequencies ``(head_dim / 2,)``, with Llama 3's scaling when the
    spec asks for it (transformers' ``_compute_llama3_parameters``)."""
    size = spec["head_dim"]
    inverse = 1.0 / spec["rope_theta"] ** (np.arange(0, size, 2, dtype=np.float64) / size)
    if spec["rope_scaling"] != "llama3":
        return inverse
    factor, low, high = spec["rope_factor"], spec["rope_low_freq_factor"], spec["rope_high_freq_factor"]
    original = spec["rope_original_length"]
    wavelength = 2 * math.pi / inverse
    scaled = np.where(wavelength > original / low, inverse / factor, inverse)
    smooth = (original / wavelength - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelength >= original / high) & (wavelength <= original / low)
    return np.where(medium, smoothed, scaled)


def _rms_norm(ops, x, scale, eps):
    kind = ops.dtype(x)
    h = ops.cast(x, "float32") if kind in HALF_DTYPES else x
    h = ops.multiply(h, ops.rsqrt(ops.add(ops.mean(ops.square(h), axis=-1, keepdims=True), eps)))
    return ops.multiply(scale, ops.cast(h, kind) if kind in HALF_DTYPES else h)


def _rotate(ops, x, cos, sin):
    first, second = ops.split(x, 2, axis=-1)
    return ops.add(ops.multiply(x, cos), ops.multiply(ops.concat([ops.negative(second), first], axis=-1), sin))


def apply(ops, params, x, spec, train=False, attention_mask=None, cache=None, positions=None):
    """Logits ``(rows, tokens, vocab)``; with ``cache`` (generation), ``(logits of the last
    token, cache)``; ``positions`` overrides ``0 .. tokens - 1``."""
    heads, kv_heads, size, eps = spec["heads"], spec["kv_heads"], spec["head_dim"], spec["eps"]
    decoder = Decoder(ops, x, attention_mask, cache, positions)
    t = decoder.tokens
    h = ops.take(params["tokens.weight"], x, axis=0)
    kind = ops.dtype(h)
    wide = "float64" if kind == "float64" else "float32"  # angles never in half precision
    angles = ops.multiply(
        ops.expand_dims(ops.cast(decoder.position_ids(), wide), -1),
        ops.asarray(inverse_frequencies(spec).astype(wide)),
    )
    angles = ops.expand_dims(ops.concat([angles, angles], axis=-1), 1)  # (rows or 1, 1, tokens, head_dim)
    cos, sin = ops.cast(ops.cos(angles), kind), ops.cast(ops.sin(angles), kind)

    def split_heads(y, count):
        return ops.transpose(ops.reshape(y, (-1, t, count, size)), (0, 2, 1, 3))

    remat = spec.get("remat", False) and train and cache is None  # generation never recomputes
    for i in range(spec["blocks"]):
        b = f"block{i}"

        def run(h, params, i=i, b=b):
            y = _rms_norm(ops, h, params[f"{b}.norm1.scale"], eps)
            q = _rotate(ops, split_heads(ops.matmul(y, params[f"{b}.attn.q.weight"]), heads), cos, sin)
            k = _rotate(ops, split_heads(ops.matmul(y, params[f"{b}.attn.k.weight"]), kv_heads), cos, sin)
            v = split_heads(ops.matmul(y, params[f"{b}.attn.v.weight"]), kv_heads)
            attended = ops.reshape(ops.transpose(decoder.attend(i, q, k, v), (0, 2, 1, 3)), (-1, t, heads * size))
            h = ops.add(h, ops.matmul(attended, params[f"{b}.attn.out.weight"]))
            y = _rms_norm(ops, h, params[f"{b}.norm2.scale"], eps)
            gate = ops.matmul(y, params[f"{b}.mlp.gate.weight"])
            y = ops.multiply(ops.multiply(gate, ops.sigmoid(gate)), ops.matmul(y, params[f"{b}.mlp.up.weight"]))
            return ops.add(h, ops.matmul(y, params[f"{b}.mlp.down.weight"]))

        h = _remat.block(ops, run, h, params, f"{b}.", remat)
    h = decoder.last(_rms_norm(ops, h, params["norm.scale"], eps))
    head = ops.transpose(params["tokens.weight"]) if spec["tied"] else params["head.weight"]
    return decoder.result(ops.matmul(h, head), train)


def fitting(spec: dict, row: tuple[int, ...]) -> Fitting | None:
    """Rows of token ids, any length (rotations have no table to run past)."""
    return None if len(row) == 1 else Fitting()


def example_input(spec: dict, batch: int, rng: np.random.Generator) -> np.ndarray:
    """Token ids without padding, 32 a row."""
    return rng.integers(0, spec["vocab"], size=(batch, 32)).astype(np.int32)


# -- transformers checkpoints ------------------------------------------------------------------


def spec_from_config(config: dict[str, Any]) -> dict[str, Any]:
    """The spec of a ``LlamaConfig`` (transformers' defaults for missing fields), from either
    rope format: transformers 5's ``rope_parameters`` or the older ``rope_scaling`` with
    ``rope_theta`` beside it. Fields that change the math and are not computed here are
    refused by name."""
    name = "llama"
    _pretrained.refuse(name, config, "hidden_act", "silu")
    _pretrained.refuse(name, config, "attention_bias", False)
    _pretrained.refuse(name, config, "mlp_bias", False)
    field = "rope_scaling" if config.get("rope_scaling") else "rope_parameters"
    rope = dict(config.get(field) or {})
    kind = rope.get("rope_type", rope.get("type", "default"))
    _pretrained.refuse(name, {f"{field}.rope_type": kind}, f"{field}.rope_type", ("default", "llama3"))
    partial = rope.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    _pretrained.refuse(name, {"partial_rotary_factor": partial}, "partial_rotary_factor", 1.0)
    width, heads = config.get("hidden_size", 4096), config.get("num_attention_heads", 32)
    length = config.get("max_position_embeddings", 2048)
    spec = {
        "vocab": config.get("vocab_size", 32000),
        "width": width,
        "mlp": config.get("intermediate_size", 11008),
        "blocks": config.get("num_hidden_layers", 32),
        "heads": heads,
        "kv_heads": config.get("num_key_value_heads") or heads,
        "head_dim": config.get("head_dim") or width // heads,
        "length": length,
        "eps": config.get("rms_norm_eps", 1e-6),
        "rope_theta": float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
        "rope_scaling": "llama3" if kind == "llama3" else "none",
        "tied": config.get("tie_word_embeddings", False),
        "eos": config.get("eos_token_id", 2),
        "pad": config.get("pad_token_id"),
    }
    if kind == "llama3":
        spec.update(
            rope_factor=float(rope["factor"]),
            rope_low_freq_factor=float(rope["low_freq_factor"]),
            rope_high_freq_factor=float(rope["high_freq_factor"]),
            rope_original_length=int(
                config.get("original_max_position_embeddings", rope.get("original_max_position_embeddings", length))
            ),
        )
    return spec


_RENAMES = {  # zoo module -> transformers' (under model.layers.{i}); dense weights transposed
    "norm1": "input_layernorm",
    "attn.q": "self_attn.q_proj",
    "attn.k": "self_attn.k_proj",
    "attn.v": "self_attn.v_proj",
    "attn.out": "self_attn.o_proj",
    "norm2": "post_attention_layernorm",
    "mlp.gate": "mlp.gate_proj",
    "mlp.up": "mlp.up_proj",
    "mlp.down": "mlp.down_proj",
}


def _transformers_name(key: str) -> str:
    """``block3.attn.q.weight`` -> ``model.layers.3.self_attn.q_proj.weight`` (and the rest)."""
    if key == "tokens.weight":
        return "model.embed_tokens.weight"
    if key == "norm.scale":
        return "model.norm.weight"
    if key == "head.weight":
        return "lm_head.weight"
    layer, _, rest = key.partition(".")
    module = rest.rpartition(".")[0]
    return f"model.layers.{layer[len('block') :]}.{_RENAMES[module]}.weight"


def _transposed(key: str) -> bool:
    """Dense weights: transformers' ``nn.Linear`` stores ``(out, in)``, the zoo ``(in, out)``."""
    return key.endswith(".weight") and key != "tokens.weight"


def params_from_transformers(tensors: dict[str, np.ndarray], spec: dict) -> dict[str, np.ndarray]:
    """Zoo parameters from a ``LlamaForCausalLM`` (or ``LlamaModel``) checkpoint's tensors."""
    out = {}
    for key in parameters(spec):
        name = _transformers_name(key)
        if name.startswith("model."):  # a LlamaModel checkpoint saves its names without the prefix
            value = _pretrained.take(tensors, name.removeprefix("model."), prefixes=_PREFIXES)
        else:
            value = _pretrained.take(tensors, name)
        out[key] = np.ascontiguousarray(value.T) if _transposed(key) else value
    return out


def to_transformers(params: dict[str, np.ndarray], spec: dict) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A ``LlamaForCausalLM`` config (transformers 5's ``rope_parameters``, and ``rope_theta``
    and ``rope_scaling`` as transformers 4 reads them) and its tensors."""
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": spec["rope_theta"]}
    if spec["rope_scaling"] == "llama3":
        rope.update(
            rope_type="llama3",
            factor=spec["rope_factor"],
            low_freq_factor=spec["rope_low_freq_factor"],
            high_freq_factor=spec["rope_high_freq_factor"],
            original_max_position_embeddings=spec["rope_original_length"],
        )
    config = {
        "architectures": [TRANSFORMERS_CLASS],
        "model_type": MODEL_TYPE,
        "vocab_size": spec["vocab"],
        "hidden_size": spec["width"],
        "intermediate_size": spec["mlp"],
        "num_hidden_layers": spec["blocks"],
        "num_attention_heads": spec["heads"],
        "num_key_value_heads": spec["kv_heads"],
        "head_dim": spec["head_dim"],
        "max_position_embeddings": spec["length"],
        "rms_norm_eps": spec["eps"],
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": spec["tied"],
        "rope_parameters": rope,
        "rope_theta": spec["rope_theta"],
        "rope_scaling": None if spec["rope_scaling"] == "none" else dict(rope),
        "eos_token_id": spec["eos"],
        "pad_token_id": spec["pad"],
    }
    tensors = {
        _transformers_name(key): np.asarray(value.T if _transposed(key) else value, dtype=np.float32)
        for key, value in params.items()
    }
    return config, tensors
