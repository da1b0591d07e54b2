"""Real architectures, built from each library's own code with random weights (nothing is
downloaded), as their users hold them, with example inputs: the real-model suite's cases.

Each case builds lazily and is small (a few layers, narrow widths) so that the whole suite
runs on a CPU in minutes; ``SMOKE`` names the few that ``make test`` runs, the others run
under ``make test-models`` (marker ``realworld``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

rng = np.random.default_rng(0)


@dataclasses.dataclass
class Case:
    name: str
    framework: str  # the source framework: "torch", "tensorflow" or "jax"
    build: Callable[[], tuple[Any, Any]]  # -> (model as its users hold it, example inputs)
    library: str  # the import the case needs (skipped without it)
    grad_input: str | None = None  # the float input to differentiate through (None: no float input)


def _images(n: int, size: int, channels_last: bool = False) -> np.ndarray:
    shape = (n, size, size, 3) if channels_last else (n, 3, size, size)
    return rng.normal(size=shape).astype(np.float32)


def _tokens(n: int, length: int, vocab: int) -> dict[str, np.ndarray]:
    mask = np.ones((n, length), np.int64)
    mask[:, -2:] = 0  # padding at the end: the mask matters
    return {"input_ids": rng.integers(1, vocab, size=(n, length)).astype(np.int64), "attention_mask": mask}


# -- PyTorch: transformers' own architectures ----------------------------------------------------


def hf_resnet():
    from transformers import ResNetConfig, ResNetForImageClassification

    config = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], num_labels=5)
    return ResNetForImageClassification(config).eval(), {"pixel_values": _images(2, 32)}


def hf_vit():
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
    )
    return ViTModel(config, add_pooling_layer=False).eval(), {"pixel_values": _images(2, 32)}


def hf_bert():
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    return BertModel(config).eval(), _tokens(2, 12, 100)


def hf_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=100, n_positions=64, n_embd=32, n_layer=2, n_head=4)
    return GPT2LMHeadModel(config).eval(), _tokens(2, 12, 100)


def hf_t5():
    from transformers import T5Config, T5Model

    config = T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
    tokens = _tokens(2, 10, 100)
    return T5Model(config).eval(), {**tokens, "decoder_input_ids": tokens["input_ids"][:, :6]}


# -- Keras -------------------------------------------------------------------------------------


def keras_mobilenet():
    import keras

    return keras.applications.MobileNetV2(weights=None, input_shape=(32, 32, 3), alpha=0.35, classes=7), _images(
        2, 32, channels_last=True
    )


def keras_efficientnet():
    import keras

    return keras.applications.EfficientNetB0(weights=None, input_shape=(32, 32, 3), classes=7), _images(
        2, 32, channels_last=True
    )


def keras_recurrent():
    import keras

    tokens = keras.Input((12,), dtype="int32", name="tokens")
    h = keras.layers.Embedding(50, 16)(tokens)
    h = keras.layers.LSTM(16, return_sequences=True)(h)
    h = keras.layers.GRU(8)(h)
    model = keras.Model(tokens, keras.layers.Dense(3)(h))
    return model, rng.integers(0, 50, size=(2, 12)).astype(np.int32)


def keras_dict_inputs():
    import keras

    image = keras.Input((8, 8, 3), name="image")
    meta = keras.Input((4,), name="meta")
    h = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(8, 3, activation="relu")(image))
    joined = keras.layers.Concatenate()([h, meta])
    model = keras.Model(
        {"image": image, "meta": meta},
        {"score": keras.layers.Dense(1)(joined), "classes": keras.layers.Dense(4)(joined)},
    )
    return model, {"image": _images(2, 8, channels_last=True), "meta": rng.normal(size=(2, 4)).astype(np.float32)}


def keras_hub_bert():
    import keras_hub

    model = keras_hub.models.BertBackbone(
        vocabulary_size=100, num_layers=2, num_heads=4, hidden_dim=32, intermediate_dim=64, max_sequence_length=64
    )
    tokens = _tokens(2, 12, 100)
    return model, {
        "token_ids": tokens["input_ids"].astype(np.int32),
        "segment_ids": np.zeros((2, 12), np.int32),
        "padding_mask": tokens["attention_mask"].astype(np.int32),
    }


# -- JAX ---------------------------------------------------------------------------------------


def nnx_cnn():
    import jax
    from flax import nnx

    class CNN(nnx.Module):
        def __init__(self, rngs):
            self.conv = nnx.Conv(3, 8, (3, 3), rngs=rngs)
            self.norm = nnx.LayerNorm(8, rngs=rngs)
            self.out = nnx.Linear(8, 5, rngs=rngs)

        def __call__(self, x):
            h = jax.nn.gelu(self.norm(self.conv(x)))
            return self.out(h.mean(axis=(1, 2)))

    return CNN(nnx.Rngs(0)), _images(2, 16, channels_last=True)


def linen_transformer():
    import flax.linen as nn
    import jax

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.LayerNorm()(x)
            x = x + nn.MultiHeadDotProductAttention(num_heads=4)(h, h)
            h = nn.LayerNorm()(x)
            return x + nn.Dense(32)(nn.gelu(nn.Dense(64)(h)))

    class Model(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            x = nn.Embed(100, 32)(tokens)
            for _ in range(2):
                x = Block()(x)
            return nn.Dense(5)(x.mean(axis=1))

    model = Model()
    tokens = rng.integers(0, 100, size=(2, 10)).astype(np.int32)
    return (model.apply, model.init(jax.random.key(0), tokens)), tokens


def equinox_cnn():
    import equinox as eqx
    import jax

    keys = jax.random.split(jax.random.key(0), 3)

    class CNN(eqx.Module):
        conv: eqx.nn.Conv2d
        out: eqx.nn.Linear

        def __init__(self):
            self.conv = eqx.nn.Conv2d(3, 8, 3, key=keys[0])
            self.out = eqx.nn.Linear(8, 5, key=keys[1])

        def __call__(self, x):  # one image, channels first, as equinox layers take it
            return self.out(jax.nn.relu(self.conv(x)).mean(axis=(1, 2)))

    model = CNN()
    return (lambda m, x: jax.vmap(m)(x), model), _images(2, 12)


CASES = {
    case.name: case
    for case in [
        Case("hf-resnet", "torch", hf_resnet, "transformers", "pixel_values"),
        Case("hf-vit", "torch", hf_vit, "transformers", "pixel_values"),
        Case("hf-bert", "torch", hf_bert, "transformers"),
        Case("hf-gpt2", "torch", hf_gpt2, "transformers"),
        Case("hf-t5", "torch", hf_t5, "transformers"),
        Case("keras-mobilenetv2", "tensorflow", keras_mobilenet, "keras", "input"),
        Case("keras-efficientnetb0", "tensorflow", keras_efficientnet, "keras", "input"),
        Case("keras-lstm-gru", "tensorflow", keras_recurrent, "keras"),
        Case("keras-hub-bert", "tensorflow", keras_hub_bert, "keras_hub"),
        Case("keras-dict-inputs", "tensorflow", keras_dict_inputs, "keras", "image"),
        Case("flax-nnx-cnn", "jax", nnx_cnn, "flax", "input"),
        Case("flax-linen-transformer", "jax", linen_transformer, "flax"),
        Case("equinox-cnn", "jax", equinox_cnn, "equinox", "input"),
    ]
}
#: the cases ``make test`` runs (one per framework, quick); ``make test-models`` runs them all
SMOKE = ("hf-bert", "keras-dict-inputs", "flax-nnx-cnn")
