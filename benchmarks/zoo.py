"""Zoo forward time against the same network written directly in each framework.

For each model and backend: the zoo model (``apply`` over the op set) and a hand-written
native network loaded with the same weights (their outputs are compared first, so the two
really are the same network), both at batch 64 and in the framework's fast mode
(``jax.jit``, ``tf.function``, PyTorch eager under ``no_grad``). The two take turns call by
call on ``--threads`` threads per framework; prints median (min-max) ms and the ratio zoo /
native of the medians (with the spread of the per-round ratios); 1.00 means no overhead.
The zoo runs the way a user of each framework runs it (``zoo_runner``). Run:

    .venv/bin/python benchmarks/zoo.py [--models cnn lstm] [--backends torch] [--repeats 30] [--threads 1]
"""

from __future__ import annotations

import argparse

import numpy as np
from _timing import THREADS_HELP, cell, interleaved, pin_threads, ratio_cell

import xdevice
from xdevice import models
from xdevice._tolerance import compare

BATCH = 64


# -- hand-written native networks, built from the zoo's canonical weights ---------------------


def torch_native(name, spec, w):
    import torch
    from torch import nn

    t = {k: torch.as_tensor(v) for k, v in w.items()}

    def linear(prefix):
        layer = nn.Linear(*t[f"{prefix}.weight"].shape)
        layer.weight.data, layer.bias.data = t[f"{prefix}.weight"].T.contiguous(), t[f"{prefix}.bias"]
        return layer

    def conv(prefix, stride=1, padding=1, bias=True):
        weight = t[f"{prefix}.weight"]
        layer = nn.Conv2d(weight.shape[1], weight.shape[0], weight.shape[2], stride, padding, bias=bias)
        layer.weight.data = weight
        if bias:
            layer.bias.data = t[f"{prefix}.bias"]
        return layer

    def bn(prefix):
        layer = nn.BatchNorm2d(t[f"{prefix}.scale"].shape[0])
        layer.weight.data, layer.bias.data = t[f"{prefix}.scale"], t[f"{prefix}.offset"]
        layer.running_mean.data, layer.running_var.data = t[f"{prefix}.mean"], t[f"{prefix}.var"]
        return layer

    if name == "mlp":
        net = nn.Sequential(linear("dense0"), nn.ReLU(), linear("dense1"), nn.ReLU(), linear("out"))
    elif name == "cnn":
        net = nn.Sequential(
            conv("conv0"),
            nn.ReLU(),
            nn.MaxPool2d(2),
            conv("conv1"),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            linear("out"),
        )
    elif name == "resnet":

        class Block(nn.Module):
            def __init__(self, i):
                super().__init__()
                s = 1 if i == 0 else 2
                self.c1, self.b1 = conv(f"stage{i}.conv1", s, bias=False), bn(f"stage{i}.bn1")
                self.c2, self.b2 = conv(f"stage{i}.conv2", bias=False), bn(f"stage{i}.bn2")
                self.short = (
                    nn.Sequential(conv(f"stage{i}.shortcut", s, 0, False), bn(f"stage{i}.shortcut_bn"))
                    if i
                    else nn.Identity()
                )

            def forward(self, x):
                return torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))) + self.short(x))

        net = nn.Sequential(
            conv("stem.conv", bias=False),
            bn("stem.bn"),
            nn.ReLU(),
            Block(0),
            Block(1),
            Block(2),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            linear("out"),
        )
    elif name == "lstm":

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding.from_pretrained(t["embedding.weight"])
                self.lstm = nn.LSTM(spec["embedding"], spec["hidden"], batch_first=True)
                self.lstm.weight_ih_l0.data, self.lstm.weight_hh_l0.data = (
                    t["lstm.w_ih"].T.contiguous(),
                    t["lstm.w_hh"].T.contiguous(),
                )
                self.lstm.bias_ih_l0.data, self.lstm.bias_hh_l0.data = t["lstm.b"], torch.zeros_like(t["lstm.b"])
                self.out = linear("out")

            def forward(self, x):
                return self.out(self.lstm(self.embed(x.long()))[1][0][0])

        net = Net()
    else:

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                d = spec["width"]
                self.tokens = nn.Embedding.from_pretrained(t["tokens.weight"])
                self.positions = t["positions.weight"]
                self.blocks = nn.ModuleList()
                for i in range(spec["blocks"]):
                    layer = nn.TransformerEncoderLayer(
                        d, spec["heads"], spec["mlp"], 0.0, "gelu", spec["eps"], batch_first=True, norm_first=True
                    )
                    p = f"block{i}"
                    layer.self_attn.in_proj_weight.data = t[f"{p}.attn.qkv.weight"].T.contiguous()
                    layer.self_attn.in_proj_bias.data = t[f"{p}.attn.qkv.bias"]
                    layer.self_attn.out_proj.weight.data = t[f"{p}.attn.out.weight"].T.contiguous()
                    layer.self_attn.out_proj.bias.data = t[f"{p}.attn.out.bias"]
                    layer.linear1, layer.linear2 = linear(f"{p}.mlp.fc1"), linear(f"{p}.mlp.fc2")
                    for ln in ("norm1", "norm2"):
                        getattr(layer, ln).weight.data = t[f"{p}.{ln}.scale"]
                        getattr(layer, ln).bias.data = t[f"{p}.{ln}.offset"]
                    self.blocks.append(layer)
                self.norm = nn.LayerNorm(d, spec["eps"])
                self.norm.weight.data, self.norm.bias.data = t["norm.scale"], t["norm.offset"]
                self.out = linear("out")

            def forward(self, x):
                keep = x != 0
                h = self.tokens(x.long()) + self.positions[: x.shape[1]]
                for block in self.blocks:
                    h = block(h, src_key_padding_mask=~keep)
                h = self.norm(h)
                weights = keep.unsqueeze(-1).to(h.dtype)
                return self.out((h * weights).sum(1) / weights.sum(1))

        net = Net()
    net.eval()

    def run(x):
        with torch.no_grad():
            return net(x)

    return run


def jax_native(name, spec, w):
    import jax
    import jax.numpy as jnp

    p = {k: jnp.asarray(v) for k, v in w.items()}
    conv = lambda x, k, s=1, pad=1: jax.lax.conv_general_dilated(x, k, (s, s), [(pad, pad)] * 2)
    pool = lambda x: jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

    def bn(x, q):
        inv = p[f"{q}.scale"] / jnp.sqrt(p[f"{q}.var"] + spec.get("eps", 1e-5))
        return x * inv[None, :, None, None] + (p[f"{q}.offset"] - p[f"{q}.mean"] * inv)[None, :, None, None]

    def ln(x, q):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + spec["eps"]) * p[f"{q}.scale"] + p[f"{q}.offset"]

    def forward(x):
        if name == "mlp":
            h = jax.nn.relu(x @ p["dense0.weight"] + p["dense0.bias"])
            h = jax.nn.relu(h @ p["dense1.weight"] + p["dense1.bias"])
            return h @ p["out.weight"] + p["out.bias"]
        if name == "cnn":
            h = pool(jax.nn.relu(conv(x, p["conv0.weight"]) + p["conv0.bias"][None, :, None, None]))
            h = pool(jax.nn.relu(conv(h, p["conv1.weight"]) + p["conv1.bias"][None, :, None, None]))
            return h.reshape(h.shape[0], -1) @ p["out.weight"] + p["out.bias"]
        if name == "resnet":
            h = jax.nn.relu(bn(conv(x, p["stem.conv.weight"]), "stem.bn"))
            for i in range(3):
                s, q = (1 if i == 0 else 2), f"stage{i}"
                y = jax.nn.relu(bn(conv(h, p[f"{q}.conv1.weight"], s), f"{q}.bn1"))
                y = bn(conv(y, p[f"{q}.conv2.weight"]), f"{q}.bn2")
                if i:
                    h = bn(conv(h, p[f"{q}.shortcut.weight"], s, 0), f"{q}.shortcut_bn")
                h = jax.nn.relu(y + h)
            return h.mean((2, 3)) @ p["out.weight"] + p["out.bias"]
        if name == "lstm":
            e = p["embedding.weight"][x]
            inputs = e @ p["lstm.w_ih"] + p["lstm.b"]

            def step(carry, xt):
                h, c = carry
                i, f, g, o = jnp.split(xt + h @ p["lstm.w_hh"], 4, -1)
                c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
                h = jax.nn.sigmoid(o) * jnp.tanh(c)
                return (h, c), None

            zeros = jnp.zeros((x.shape[0], spec["hidden"]))
            (h, _), _ = jax.lax.scan(step, (zeros, zeros), jnp.swapaxes(inputs, 0, 1))
            return h @ p["out.weight"] + p["out.bias"]
        n, t = x.shape
        d, heads = spec["width"], spec["heads"]
        keep = x != 0
        h = p["tokens.weight"][x] + p["positions.weight"][:t]
        for i in range(spec["blocks"]):
            q = f"block{i}"
            y = ln(h, f"{q}.norm1") @ p[f"{q}.attn.qkv.weight"] + p[f"{q}.attn.qkv.bias"]
            qs, ks, vs = (a.reshape(n, t, heads, d // heads) for a in jnp.split(y, 3, -1))
            att = jax.nn.dot_product_attention(qs, ks, vs, mask=keep[:, None, None, :])
            h = h + att.reshape(n, t, d) @ p[f"{q}.attn.out.weight"] + p[f"{q}.attn.out.bias"]
            y = jax.nn.gelu(ln(h, f"{q}.norm2") @ p[f"{q}.mlp.fc1.weight"] + p[f"{q}.mlp.fc1.bias"], approximate=False)
            h = h + y @ p[f"{q}.mlp.fc2.weight"] + p[f"{q}.mlp.fc2.bias"]
        h = ln(h, "norm")
        wts = keep[..., None].astype(h.dtype)
        return ((h * wts).sum(1) / wts.sum(1)) @ p["out.weight"] + p["out.bias"]

    return jax.jit(forward)


def tensorflow_native(name, spec, w):
    import tensorflow as tf
    from tensorflow import keras

    t = {k: tf.constant(v) for k, v in w.items()}
    hwio = lambda k: tf.transpose(t[k], (2, 3, 1, 0))

    def conv(key, filters, stride=1, bias=True, padding="same"):
        layer = keras.layers.Conv2D(filters, t[key].shape[2], stride, "valid" if stride > 1 else padding, use_bias=bias)
        layer.build((None, None, None, t[key].shape[1]))
        layer.set_weights([hwio(key).numpy()] + ([t[key.replace("weight", "bias")].numpy()] if bias else []))
        if stride > 1 and padding == "same":  # Keras' "same" pads (0, 1) at stride 2; the zoo pads (1, 1)
            return keras.Sequential([keras.layers.ZeroPadding2D(1), layer])
        return layer

    def dense(prefix):
        layer = keras.layers.Dense(t[f"{prefix}.weight"].shape[1])
        layer.build((None, t[f"{prefix}.weight"].shape[0]))
        layer.set_weights([w[f"{prefix}.weight"], w[f"{prefix}.bias"]])
        return layer

    def bn(prefix):
        layer = keras.layers.BatchNormalization(epsilon=spec.get("eps", 1e-5))
        layer.build((None, None, None, t[f"{prefix}.scale"].shape[0]))
        layer.set_weights([w[f"{prefix}.{k}"] for k in ("scale", "offset", "mean", "var")])
        return layer

    if name == "mlp":
        layers = [dense("dense0"), dense("dense1"), dense("out")]

        def forward(x):
            return layers[2](tf.nn.relu(layers[1](tf.nn.relu(layers[0](x)))))
    elif name == "cnn":
        c0, c1, out = conv("conv0.weight", 32), conv("conv1.weight", 64), dense("out")
        pool = keras.layers.MaxPooling2D(2)

        def forward(x):  # a native TF user feeds NHWC; flatten in NCHW order to share the weights
            h = pool(tf.nn.relu(c1(pool(tf.nn.relu(c0(tf.transpose(x, (0, 2, 3, 1))))))))
            return out(tf.reshape(tf.transpose(h, (0, 3, 1, 2)), (tf.shape(h)[0], -1)))
    elif name == "resnet":
        stem, stem_bn, out = conv("stem.conv.weight", 16, bias=False), bn("stem.bn"), dense("out")
        blocks = []
        for i, width in enumerate(spec["widths"]):
            s, q = (1 if i == 0 else 2), f"stage{i}"
            blocks.append(
                (
                    conv(f"{q}.conv1.weight", width, s, False),
                    bn(f"{q}.bn1"),
                    conv(f"{q}.conv2.weight", width, 1, False),
                    bn(f"{q}.bn2"),
                    (conv(f"{q}.shortcut.weight", width, s, False, "valid"), bn(f"{q}.shortcut_bn")) if i else None,
                )
            )

        def forward(x):
            h = tf.nn.relu(stem_bn(stem(tf.transpose(x, (0, 2, 3, 1))), training=False))
            for c1, b1, c2, b2, short in blocks:
                y = b2(c2(tf.nn.relu(b1(c1(h), training=False))), training=False)
                if short:
                    h = short[1](short[0](h), training=False)
                h = tf.nn.relu(y + h)
            return out(tf.reduce_mean(h, (1, 2)))
    elif name == "lstm":
        lstm = keras.layers.LSTM(spec["hidden"])
        lstm.build((None, spec["length"], spec["embedding"]))
        lstm.set_weights([w["lstm.w_ih"], w["lstm.w_hh"], w["lstm.b"]])
        out = dense("out")

        def forward(x):
            return out(lstm(tf.gather(t["embedding.weight"], x)))
    else:
        d, heads = spec["width"], spec["heads"]
        attention = []
        for i in range(spec["blocks"]):
            layer = keras.layers.MultiHeadAttention(heads, d // heads)
            layer.build((None, spec["length"], d), (None, spec["length"], d))
            q, k, v = np.split(w[f"block{i}.attn.qkv.weight"], 3, -1)
            bq, bk, bv = np.split(w[f"block{i}.attn.qkv.bias"], 3, -1)
            shape = (d, heads, d // heads)
            layer.set_weights(
                [
                    q.reshape(shape),
                    bq.reshape(heads, -1),
                    k.reshape(shape),
                    bk.reshape(heads, -1),
                    v.reshape(shape),
                    bv.reshape(heads, -1),
                    w[f"block{i}.attn.out.weight"].reshape(heads, d // heads, d),
                    w[f"block{i}.attn.out.bias"],
                ]
            )
            norms = []
            for ln in (
                "norm1",
                "norm2",
            ):
                layer_norm = keras.layers.LayerNormalization(epsilon=spec["eps"])
                layer_norm.build((None, None, d))
                layer_norm.set_weights([w[f"block{i}.{ln}.scale"], w[f"block{i}.{ln}.offset"]])
                norms.append(layer_norm)
            attention.append((layer, norms, dense(f"block{i}.mlp.fc1"), dense(f"block{i}.mlp.fc2")))
        final = keras.layers.LayerNormalization(epsilon=spec["eps"])
        final.build((None, None, d))
        final.set_weights([w["norm.scale"], w["norm.offset"]])
        out = dense("out")

        def forward(x):
            keep = tf.not_equal(x, 0)
            h = tf.gather(t["tokens.weight"], x) + t["positions.weight"][: x.shape[1]]
            mask = keep[:, None, :]
            for layer, (n1, n2), fc1, fc2 in attention:
                y = n1(h)
                h = h + layer(y, y, attention_mask=mask)
                h = h + fc2(tf.nn.gelu(fc1(n2(h)), approximate=False))
            h = final(h)
            wts = tf.cast(keep[..., None], h.dtype)
            return out(tf.reduce_sum(h * wts, 1) / tf.reduce_sum(wts, 1))

    return tf.function(forward)


NATIVE = {"torch": torch_native, "jax": jax_native, "tensorflow": tensorflow_native}


def zoo_runner(model, backend_name):
    """The zoo model run the way a user of that framework runs it: PyTorch eager under
    ``no_grad``; JAX ``jit(apply_fn)(params, x)``; TensorFlow ``tf.function`` over the
    ``to_native`` module, whose variables the graph captures."""
    if backend_name == "torch":
        import torch

        module = models.to_native(model, "torch").eval()

        def run(x):
            with torch.no_grad():
                return module(x)

        return run
    if backend_name == "jax":
        import jax

        apply_fn, params = models.to_native(model, "jax")
        compiled = jax.jit(apply_fn)
        return lambda x: compiled(params, x)
    import tensorflow as tf

    return tf.function(models.to_native(model, "tensorflow"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(models.NAMES))
    parser.add_argument("--backends", nargs="+", default=[b for b in NATIVE if b in xdevice.backends()])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    args = parser.parse_args()
    print(pin_threads(args.threads, frameworks=tuple(args.backends)))
    print(
        f"batch {BATCH}, {args.repeats} rounds after 3 warm-ups, zoo and native in turns; "
        "ms median (min-max); ratio = zoo / native (1.00 = no overhead)"
    )
    print(f"{'model':<12} {'backend':<11} {'zoo ms':>20} {'native ms':>20} {'ratio':>18}  same output")
    for name in args.models:
        model = models.build(name, seed=0)
        x = model.example_input(BATCH, seed=1)
        weights = model.numpy_params()
        for backend_name in args.backends:
            backend = xdevice.backend(backend_name)
            zoo_run = zoo_runner(model, backend_name)
            native = NATIVE[backend_name](name, model.spec, weights)
            xin = backend.ops.asarray(x)
            same = compare(backend.ops.to_numpy(native(xin)), backend.ops.to_numpy(zoo_run(xin)), "float32")
            to_numpy = backend.ops.to_numpy  # every call is waited for
            times = interleaved(
                {"zoo": lambda: to_numpy(zoo_run(xin)), "native": lambda: to_numpy(native(xin))},
                samples=args.repeats,
                warmup=3,
                budget=30,
            )
            print(
                f"{name:<12} {backend_name:<11} {cell(times['zoo'], 'ms'):>20} {cell(times['native'], 'ms'):>20} "
                f"{ratio_cell(times['zoo'], times['native']):>18}  "
                f"{'yes' if same.ok else 'NO: ' + same.describe()}",
                flush=True,
            )


if __name__ == "__main__":
    main()
