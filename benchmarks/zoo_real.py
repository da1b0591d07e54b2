"""The real-scale zoo against the canonical implementations, side by side on each framework.

For each model (``resnet50``, ``vit``, ``bert``, ``gpt2``, ``llama``) at batch 8, length 128
(text) or 224x224 (images):

- torch: the zoo model against transformers' class (``ResNetForImageClassification``,
  ``ViTForImageClassification``, ``BertModel``, ``GPT2LMHeadModel``, ``LlamaForCausalLM``,
  transformers' default attention, SDPA) loaded with the SAME weights (the zoo's
  ``save_pretrained`` folder, read by ``from_pretrained``; outputs compared first);
- jax and tensorflow: the zoo model against keras-hub's backbone of the same configuration
  (random weights; a backbone stops before the head, so the same head matmul is added:
  the tied vocabulary projection for gpt2 and llama, a classifier for the image models);
  both sides compiled alike: ``jax.jit``, ``tf.function`` (no XLA on either side).

Forward: inference (``no_grad`` / ``training=False``). Training step: forward in training
mode, the same loss on both sides (cross-entropy on logits, mean square of BERT's hidden
state), backward, and a plain SGD update of every trainable weight; dropout is 0 on both
sides. xdevice's ``fit`` is not called per step (it sets up a whole loop), so both sides run
the framework's own step. Greedy generation (gpt2): zoo ``generate`` against transformers'
``generate(do_sample=False)`` on torch (tokens compared), and the zoo on JAX.

Every framework runs in its own subprocess (Keras reads ``KERAS_BACKEND`` when it is first
imported), pinned to ``--threads`` threads; the two sides take turns call by call; prints
median (min-max) ms and the ratio zoo / canonical of the medians (with the per-round spread).
A configuration smaller than the real one is marked ``REDUCED`` in the output.

``--apart`` (training step): each side runs in a process of its own, the two in turns, one
process per side per round (after ``--warmup`` steps in it), for models whose two sides do not
fit in memory together: llama's training step at all 16 blocks needs 11.8 GiB a side
(``xdevice estimate-memory llama --batch 8 --optimizer sgd``). On torch both sides load the same
``save_pretrained`` folder, written once; on JAX and TensorFlow the zoo side builds seed 0's
weights and keras-hub's backbone its own random ones, as without ``--apart``. Run:

    .venv/bin/python benchmarks/zoo_real.py [--models bert gpt2] [--frameworks torch jax]
        [--size real|small] [--llama-layers 2] [--measure forward train generate] [--repeats 3] [--threads 1]
    .venv/bin/python benchmarks/zoo_real.py --models llama --frameworks torch tensorflow --measure train \\
        --apart --repeats 2

``--device gpu --dtype bfloat16`` (torch, JAX): the same table on GPU 0 in bf16, both sides'
weights and images cast alike (the zoo by ``Model.to``, transformers by ``.to``, keras-hub by
its ``dtype`` policy); each call waits for the GPU's work to finish. Outputs are then compared
at bf16's tolerance (5e-2 relative). Run there (the image has no keras-hub: carry it, see
docs/performance.md):

    python3 benchmarks/zoo_real.py --frameworks torch jax --device gpu --dtype bfloat16 --repeats 20
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
from _timing import THREADS_HELP, cell, interleaved, pin_threads, ratio_cell

MODELS = ("resnet50", "vit", "bert", "gpt2", "llama")
FRAMEWORKS = ("torch", "jax", "tensorflow")
BATCH, LENGTH = 8, 128
IMAGES = ("resnet50", "vit")
LANGUAGE = ("gpt2", "llama")  # logits over the vocabulary at every position
HF_CLASS = {
    "resnet50": "ResNetForImageClassification",
    "vit": "ViTForImageClassification",
    "bert": "BertModel",
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
}
KERAS_CLASS = {
    "resnet50": "ResNetBackbone",
    "vit": "ViTBackbone",
    "bert": "BertBackbone",
    "gpt2": "GPT2Backbone",
    "llama": "LlamaBackbone",
}
HF_NO_DROPOUT = {  # training steps compare the same math: no dropout on either side
    "vit": {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
    "bert": {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
    "gpt2": {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
    "llama": {"attention_dropout": 0.0},
}
LR = 1e-5


# -- configurations and inputs, the same in every subprocess -----------------------------


def spec_of(name: str, args: argparse.Namespace) -> tuple[dict, str]:
    """The spec overrides for ``name`` and a note saying how it differs from the real one."""
    from xdevice.models import definition

    if args.size == "small":
        return dict(definition(name).SMALL), "REDUCED: the small test configuration"
    if name == "llama" and args.llama_layers:
        return {"blocks": args.llama_layers}, f"REDUCED: {args.llama_layers} of Llama 3.2 1B's 16 blocks"
    return {}, ""


def inputs_of(name: str, spec: dict) -> dict[str, np.ndarray]:
    """Batch 8: images NCHW float32 (and NHWC for Keras); token ids int32 with an attention mask
    whose last row is padded for its last 16 tokens (so the mask does matter on both sides)."""
    rng = np.random.default_rng(1)
    if name in IMAGES:
        c, h, w = spec["image"]
        images = rng.standard_normal((BATCH, c, h, w)).astype(np.float32)
        labels = rng.integers(0, spec["classes"], BATCH)
        return {"x": images, "nhwc": images.transpose(0, 2, 3, 1).copy(), "labels": labels}
    length = min(LENGTH, spec["length"])
    ids = rng.integers(0, spec["vocab"], (BATCH, length)).astype(np.int32)
    mask = np.ones((BATCH, length), np.int32)
    mask[-1, length - length // 8 :] = 0
    labels = ids if name in LANGUAGE else None
    return {"x": ids, "mask": mask, "labels": labels}


def zoo_model(name: str, backend: str, args: argparse.Namespace, placed: bool = True):
    """Seed 0's zoo model; ``placed``: moved to ``--device`` in ``--dtype`` (else fp32 on the CPU)."""
    from xdevice import models

    overrides, note = spec_of(name, args)
    model = models.build(name, backend=backend, seed=0, **overrides)
    if placed and (args.device, args.dtype) != ("cpu", "float32"):
        model = model.to(device="gpu:0" if args.device == "gpu" else "cpu", dtype=args.dtype)
    return model, note


def row(name: str, framework: str, canonical: str, fwd, train, note: str, same: str) -> None:
    fwd_cells = (cell(fwd[0], "ms"), cell(fwd[1], "ms"), ratio_cell(*fwd)) if fwd else ("-",) * 3
    train_cells = (cell(train[0], "ms"), cell(train[1], "ms"), ratio_cell(*train)) if train else ("-",) * 3
    print(
        f"{name:<9} {framework:<10} {canonical:<29} {fwd_cells[0]:>22} {fwd_cells[1]:>22} {fwd_cells[2]:>18} "
        f"{train_cells[0]:>22} {train_cells[1]:>22} {train_cells[2]:>18}  {same}{'  ' + note if note else ''}",
        flush=True,
    )


def header() -> None:
    print(
        f"{'model':<9} {'framework':<10} {'canonical':<29} {'zoo fwd ms':>22} {'canonical fwd ms':>22} "
        f"{'fwd ratio':>18} {'zoo train ms':>22} {'canonical train ms':>22} {'train ratio':>18}  same output",
        flush=True,
    )


def agreement(zoo_out: np.ndarray, canonical_out: np.ndarray, dtype: str = "float32") -> str:
    """Relative error of the zoo's output against the canonical one: within 1e-4 in fp32,
    5e-2 in bf16 (8 bits of mantissa, each side rounding in its own order, summed over the
    blocks: 3.9e-2 for llama's 16 on an H200, 0 for resnet50, vit and bert)."""
    zoo_out, canonical_out = (np.asarray(a, np.float64) for a in (zoo_out, canonical_out))
    err = float(np.linalg.norm(zoo_out - canonical_out) / max(np.linalg.norm(canonical_out), 1e-30))
    return f"yes (rel {err:.1e})" if err <= (1e-4 if dtype == "float32" else 5e-2) else f"NO (rel {err:.1e})"


def timed(sides: dict, args: argparse.Namespace) -> tuple[list[float], list[float]]:
    times = interleaved(sides, samples=args.repeats, warmup=args.warmup, budget=args.budget)
    return tuple(times.values())


# -- torch: the zoo against transformers with the same weights ----------------------------


def torch_worker(args: argparse.Namespace) -> None:
    import torch
    import transformers

    from xdevice.models import definition

    device, dtype = torch.device("cuda" if args.device == "gpu" else "cpu"), getattr(torch, args.dtype)
    wait = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)  # each call's GPU work done
    host = lambda t: t.float().cpu().numpy()
    for name in args.models:
        model, note = zoo_model(name, "torch", args, placed=False)
        spec, apply = model.spec, definition(name).apply
        with tempfile.TemporaryDirectory() as folder:
            model.save_pretrained(folder)
            hf = getattr(transformers, HF_CLASS[name]).from_pretrained(folder, **HF_NO_DROPOUT.get(name, {}))
        if (args.device, args.dtype) != ("cpu", "float32"):  # both sides moved and cast alike
            model, _ = zoo_model(name, "torch", args)
            hf.to(device=device, dtype=dtype)
        data = inputs_of(name, spec)
        x = torch.as_tensor(data["x"]).to(device)
        x = x.to(dtype) if name in IMAGES else x
        extra = {} if name in IMAGES else {"attention_mask": torch.as_tensor(data["mask"]).to(device)}
        hf_in = {"pixel_values": x} if name in IMAGES else {"input_ids": x.long(), **extra}

        def hf_out(out):
            return out.last_hidden_state if name == "bert" else out.logits

        def zoo_fwd():
            with torch.no_grad():
                out = model(x, **extra)
            wait()
            return out

        def hf_fwd():
            with torch.no_grad():
                out = hf_out(hf(**hf_in))
            wait()
            return out

        hf.eval()
        same = agreement(host(zoo_fwd()), host(hf_fwd()), args.dtype)
        fwd = timed({"zoo": zoo_fwd, "canonical": hf_fwd}, args) if "forward" in args.measure else None

        train = None
        if "train" in args.measure:
            labels = None if data["labels"] is None else torch.as_tensor(data["labels"]).long().to(device)

            def loss_of(out):
                if labels is None:
                    return out.square().mean()
                return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), labels.reshape(-1))

            params = dict(model.params)
            for key in model.trainable:
                params[key] = params[key].detach().clone().requires_grad_(True)
            zoo_opt = torch.optim.SGD([params[k] for k in model.trainable], lr=LR)
            hf_opt = torch.optim.SGD(hf.parameters(), lr=LR)
            hf.train()

            def zoo_step():
                zoo_opt.zero_grad(set_to_none=True)
                with model.ops.new_tensors_on(device):  # masks and positions made beside the weights
                    out, _ = apply(model.ops, params, x, spec=spec, train=True, **extra)
                loss_of(out).backward()
                zoo_opt.step()
                wait()

            def hf_step():
                hf_opt.zero_grad(set_to_none=True)
                loss_of(hf_out(hf(**hf_in))).backward()
                hf_opt.step()
                wait()

            train = timed({"zoo": zoo_step, "canonical": hf_step}, args)
            hf.eval()
        row(name, "torch", f"transformers {HF_CLASS[name]}", fwd, train, note, same)

        if name == "gpt2" and "generate" in args.measure:
            prompt = x[: args.gen_batch, : prompt_length(spec, args)]
            n = args.new_tokens
            eos = spec["eos"] if isinstance(spec["eos"], int) else spec["eos"][0]
            zoo_gen = lambda: model.generate(prompt, max_new_tokens=n)  # numpy: the GPU's work done
            hf_gen = lambda: hf.generate(
                prompt.long(),
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=eos,
            ).cpu()
            same_tokens = np.array_equal(zoo_gen(), hf_gen().numpy())
            zoo_t, hf_t = timed({"zoo": zoo_gen, "canonical": hf_gen}, args)
            generation_row("torch", "transformers generate", zoo_t, hf_t, args, same_tokens, prompt.shape[1])


def train_apart(args: argparse.Namespace) -> None:
    """The training step of each model with each side in processes of its own (``--apart``),
    on each framework asked for: torch's two sides load one ``save_pretrained`` folder, written
    first; JAX's and TensorFlow's zoo side builds seed 0's weights, keras-hub's its own."""
    for framework in args.frameworks:
        canonical = {"torch": "transformers", "jax": "keras-hub", "tensorflow": "keras-hub"}[framework]
        env = dict(os.environ, KERAS_BACKEND=framework, TF_CPP_MIN_LOG_LEVEL="2")
        for name in args.models:
            _, note = spec_of(name, args)
            with tempfile.TemporaryDirectory() as folder:
                worker = [sys.executable, __file__, *sys.argv[1:], "--models", name]
                worker += ["--worker", framework, "--weights", folder]
                if framework == "torch":
                    subprocess.run([*worker, "--side", "save"], check=True, env=env)
                runs: dict[str, list[list[float]]] = {"zoo": [], "canonical": []}  # seconds, GiB, faults
                for _ in range(args.repeats):
                    for side, measured in runs.items():
                        done = subprocess.run(
                            [*worker, "--side", side], check=True, stdout=subprocess.PIPE, text=True, env=env
                        )
                        measured.append([float(word) for word in done.stdout.split()[-3:]])
            zoo, other = (np.median(np.array(runs[side]), axis=0) for side in runs)
            what = HF_CLASS[name] if framework == "torch" else KERAS_CLASS[name]
            apart_note = f"each side in its own process, {args.warmup} warm-up step(s) per process"
            times = tuple([seconds for seconds, _, _ in runs[side]] for side in runs)
            row(name, framework, f"{canonical} {what}", None, times, note, apart_note)
            print(
                f"  {name} {framework}, medians of the processes: peak resident memory {zoo[1]:.1f} GiB zoo "
                f"vs {other[1]:.1f} GiB {canonical}; page faults in the timed step {zoo[2]:,.0f} vs {other[2]:,.0f}",
                flush=True,
            )


def keras_side(args: argparse.Namespace) -> None:
    """One side of ``--apart`` on JAX or TensorFlow in this process: ``--warmup`` training
    steps, then one timed (:func:`one_timed_step`)."""
    (name,) = args.models
    _, data, _ = spec_and_inputs(name, args)
    sides = {"jax": jax_sides, "tensorflow": tensorflow_sides}[args.worker]
    _, step, _ = sides(name, data, (args.side,), args, forward=False)[args.side]
    one_timed_step(step, args.warmup)


def one_timed_step(step, warmup: int) -> None:
    """``warmup`` steps, then one timed: prints its seconds, this process's peak resident memory
    (GiB) and the page faults the timed step took (memory it touched afresh)."""
    import resource
    import time

    for _ in range(warmup):
        step()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    begin = time.perf_counter()
    step()
    seconds = time.perf_counter() - begin
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(seconds, usage.ru_maxrss / 2**20, usage.ru_minflt - faults, flush=True)


def torch_side(args: argparse.Namespace) -> None:
    """One side of ``--apart`` in this process: ``save`` writes the zoo's weights to
    ``--weights``; ``zoo`` or ``canonical`` loads them, runs ``--warmup`` training steps and
    one timed (:func:`one_timed_step`)."""
    import torch
    import transformers

    from xdevice import models
    from xdevice.models import definition

    (name,) = args.models
    overrides, _ = spec_of(name, args)
    if args.side == "save":
        models.build(name, backend="torch", seed=0, **overrides).save_pretrained(args.weights)
        return
    if args.side == "zoo":
        model = models.build(name, backend="torch", weights=args.weights)
        spec, apply, params = model.spec, definition(name).apply, dict(model.params)
        for key in model.trainable:  # the model's own tensors train: no second copy of 1B weights
            params[key] = params[key].detach().requires_grad_(True)
        weights = [params[k] for k in model.trainable]
    else:
        hf = getattr(transformers, HF_CLASS[name]).from_pretrained(args.weights, **HF_NO_DROPOUT.get(name, {}))
        hf.train()
        spec, weights = {**definition(name).DEFAULTS, **overrides}, list(hf.parameters())
    data = inputs_of(name, spec)
    x = torch.as_tensor(data["x"])
    extra = {} if name in IMAGES else {"attention_mask": torch.as_tensor(data["mask"])}
    labels = None if data["labels"] is None else torch.as_tensor(data["labels"]).long()
    optimizer = torch.optim.SGD(weights, lr=LR)

    def forward():
        if args.side == "zoo":
            return apply(model.ops, params, x, spec=spec, train=True, **extra)[0]
        out = hf(**({"pixel_values": x} if name in IMAGES else {"input_ids": x.long(), **extra}))
        return out.last_hidden_state if name == "bert" else out.logits

    def step():
        optimizer.zero_grad(set_to_none=True)
        out = forward()
        if labels is None:
            loss = out.square().mean()
        else:
            loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), labels.reshape(-1))
        loss.backward()
        optimizer.step()

    one_timed_step(step, args.warmup)


def prompt_length(spec: dict, args: argparse.Namespace) -> int:
    """``--gen-prompt``, shortened where prompt and new tokens would pass the model's positions
    (the small configuration: then ``--new-tokens`` shrinks too)."""
    args.new_tokens = min(args.new_tokens, spec["length"] // 2)
    return min(args.gen_prompt, spec["length"] - args.new_tokens)


def generation_row(framework, canonical, zoo_t, other_t, args, same_tokens, prompt) -> None:
    tokens = args.gen_batch * args.new_tokens
    rate = lambda ts: f"{tokens / np.median(ts):.1f} tok/s"
    print(
        f"gpt2 generate ({framework}; {args.gen_batch} x {prompt}-token prompt, {args.new_tokens} new, "
        f"greedy): zoo {rate(zoo_t)} [{cell(zoo_t, 'ms')} ms]"
        + (
            f", {canonical} {rate(other_t)} [{cell(other_t, 'ms')} ms], time ratio {ratio_cell(zoo_t, other_t)}, "
            f"same tokens: {'yes' if same_tokens else 'NO'}"
            if other_t
            else ""
        ),
        flush=True,
    )


# -- JAX and TensorFlow: the zoo against keras-hub's backbones ----------------------------


def keras_backbone(name: str, spec: dict):
    """keras-hub's backbone of ``spec``'s configuration (random weights, dropout 0) and a
    function from our input dict to its keyword-free input."""
    import keras_hub

    m = keras_hub.models
    if name == "resnet50":
        depth_strides = [1, 2, 2, 2]
        backbone = m.ResNetBackbone(
            input_conv_filters=[spec["stem"]],
            input_conv_kernel_sizes=[7],
            stackwise_num_filters=[w // 4 for w in spec["widths"]],
            stackwise_num_blocks=spec["depths"],
            stackwise_num_strides=depth_strides,
            block_type="bottleneck_block",
            use_pre_activation=False,
            image_shape=(None, None, spec["image"][0]),
        )
        return backbone, lambda d: d["nhwc"], spec["widths"][-1], spec["classes"]
    if name == "vit":
        backbone = m.ViTBackbone(
            image_shape=tuple(spec["image"][1:]) + (spec["image"][0],),
            patch_size=spec["patch"],
            num_layers=spec["layers"],
            num_heads=spec["heads"],
            hidden_dim=spec["width"],
            mlp_dim=spec["mlp"],
            layer_norm_epsilon=spec["eps"],
        )
        return backbone, lambda d: d["nhwc"], spec["width"], spec["classes"]
    if name == "bert":
        backbone = m.BertBackbone(
            vocabulary_size=spec["vocab"],
            num_layers=spec["layers"],
            num_heads=spec["heads"],
            hidden_dim=spec["width"],
            intermediate_dim=spec["mlp"],
            dropout=0.0,
            max_sequence_length=spec["length"],
            num_segments=spec["types"],
        )
        return (
            backbone,
            lambda d: {"token_ids": d["x"], "segment_ids": np.zeros_like(d["x"]), "padding_mask": d["mask"]},
            None,
            None,
        )
    if name == "gpt2":
        backbone = m.GPT2Backbone(
            vocabulary_size=spec["vocab"],
            num_layers=spec["blocks"],
            num_heads=spec["heads"],
            hidden_dim=spec["width"],
            intermediate_dim=spec["mlp"],
            dropout=0.0,
            max_sequence_length=spec["length"],
        )
    else:
        backbone = m.LlamaBackbone(
            vocabulary_size=spec["vocab"],
            num_layers=spec["blocks"],
            num_query_heads=spec["heads"],
            hidden_dim=spec["width"],
            intermediate_dim=spec["mlp"],
            num_key_value_heads=spec["kv_heads"],
            rope_max_wavelength=spec["rope_theta"],
            layer_norm_epsilon=spec["eps"],
            tie_word_embeddings=spec["tied"],
        )
    return backbone, lambda d: {"token_ids": d["x"], "padding_mask": d["mask"]}, None, None


def keras_output(name: str, out, head):
    """The backbone's output carried to the zoo's: logits through the same head matmul."""
    from keras import ops

    if name == "bert":
        return out["sequence_output"]
    if name == "resnet50":
        return ops.matmul(ops.mean(out, axis=(1, 2)), head)
    if name == "vit":
        return ops.matmul(out[:, 0], head)
    return ops.matmul(out, head)  # gpt2, llama: the tied projection, embedding transposed


class KerasRefuses(Exception):
    """keras-hub refuses the configuration asked for (its ResNet insists on a 64-filter first stage)."""


def keras_backbone_of(name: str, spec: dict, dtype: str = "float32"):
    """keras-hub's backbone (:func:`keras_backbone`) with its weights and arithmetic in ``dtype``."""
    import keras

    keras.config.set_dtype_policy(dtype)
    try:
        return keras_backbone(name, spec)
    except ValueError as error:
        raise KerasRefuses(str(error)) from error


def spec_and_inputs(name: str, args: argparse.Namespace) -> tuple[dict, dict, str]:
    """The model's configuration (defaults and ``--size`` / ``--llama-layers``), its inputs and
    the note saying how it differs from the real one."""
    from xdevice.models import definition

    overrides, note = spec_of(name, args)
    spec = {**definition(name).DEFAULTS, **overrides}
    return spec, inputs_of(name, spec), note


def jax_sides(name: str, data: dict, sides: tuple[str, ...], args: argparse.Namespace, forward: bool = True) -> dict:
    """``{side: (forward, training step, model or backbone)}`` on JAX for each of ``sides``
    ("zoo", "canonical"), each built only when asked (``--apart`` builds one per process);
    ``forward=False`` (``--apart``: training alone) builds no forward. Each side keeps its
    starting weights beside the ones it trains (the zoo's params, keras' variables): alike."""
    import jax
    import jax.numpy as jnp

    from xdevice.models import definition

    spec, _, _ = spec_and_inputs(name, args)
    labels = None if data["labels"] is None else jnp.asarray(data["labels"])

    def loss_of(out):
        if labels is None:
            return jnp.mean(out**2)
        logp = jax.nn.log_softmax(out.reshape(-1, out.shape[-1]))
        return -jnp.mean(jnp.take_along_axis(logp, labels.reshape(-1, 1), 1))

    built = {}
    if "zoo" in sides:
        model, _ = zoo_model(name, "jax", args)
        apply, ops, zoo_spec, params = definition(name).apply, model.ops, model.spec, dict(model.params)
        x = jnp.asarray(data["x"], args.dtype if name in IMAGES else None)
        extra = {} if name in IMAGES else {"attention_mask": jnp.asarray(data["mask"])}
        zoo_f = jax.jit(lambda p, x, extra: apply(ops, p, x, spec=zoo_spec, **extra))
        frozen = {k: v for k, v in params.items() if k not in model.trainable}

        @jax.jit
        def zoo_step(trainable, x, extra):
            def loss(t):
                out, _ = apply(ops, {**frozen, **t}, x, spec=zoo_spec, train=True, **extra)
                return loss_of(out)

            grads = jax.grad(loss)(trainable)
            return jax.tree_util.tree_map(lambda p, g: p - LR * g, trainable, grads)

        zoo_state = {k: params[k] for k in model.trainable}

        def zoo_train():
            nonlocal zoo_state
            zoo_state = jax.block_until_ready(zoo_step(zoo_state, x, extra))

        built["zoo"] = ((lambda: zoo_f(params, x, extra).block_until_ready()) if forward else None, zoo_train, model)
    if "canonical" in sides:
        backbone, keras_in, features, classes = keras_backbone_of(name, spec, args.dtype)
        head = jnp.asarray(head_of(name, spec, features, classes), args.dtype)
        k_in = jax.tree_util.tree_map(jnp.asarray, keras_in(data))
        tv = [v.value for v in backbone.trainable_variables]
        ntv = [v.value for v in backbone.non_trainable_variables]
        keras_f = jax.jit(lambda tv, ntv, inp, head: keras_output(name, backbone.stateless_call(tv, ntv, inp)[0], head))

        @jax.jit
        def keras_step(tv, ntv, inp, head):
            def loss(tv, head):
                out, _ = backbone.stateless_call(tv, ntv, inp, training=True)
                return loss_of(keras_output(name, out, head))

            grads = jax.grad(loss, (0, 1))(tv, head)
            return jax.tree_util.tree_map(lambda p, g: p - LR * g, (tv, head), grads)

        keras_state = (tv, head)

        def keras_train():
            nonlocal keras_state
            keras_state = jax.block_until_ready(keras_step(keras_state[0], ntv, k_in, keras_state[1]))

        keras_fwd = (lambda: keras_f(tv, ntv, k_in, head).block_until_ready()) if forward else None
        built["canonical"] = (keras_fwd, keras_train, backbone)
    return built


def tensorflow_sides(
    name: str, data: dict, sides: tuple[str, ...], args: argparse.Namespace, forward: bool = True
) -> dict:
    """``{side: (forward, training step, model or backbone)}`` on TensorFlow, as
    :func:`jax_sides`; without ``forward`` the zoo side keeps no copy of its weights beside the
    variables it trains (keras-hub's variables are its one copy too: at llama's size a second
    copy is gigabytes)."""
    import tensorflow as tf

    from xdevice.models import definition

    spec, _, _ = spec_and_inputs(name, args)
    labels = None if data["labels"] is None else tf.constant(data["labels"].reshape(-1))

    def loss_of(out):
        if labels is None:
            return tf.reduce_mean(tf.square(out))
        flat = tf.reshape(out, (-1, out.shape[-1]))
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, flat))

    def sgd(grads, targets):
        for g, v in zip(grads, targets):
            if g is not None:  # a weight the output does not use (BERT's pooler)
                v.assign_sub(LR * tf.convert_to_tensor(g))

    built = {}
    if "zoo" in sides:
        model, _ = zoo_model(name, "tensorflow", args)
        apply, ops, zoo_spec = definition(name).apply, model.ops, model.spec
        x = tf.constant(data["x"], args.dtype if name in IMAGES else None)
        extra = {} if name in IMAGES else {"attention_mask": tf.constant(data["mask"])}
        variables = {k: tf.Variable(model.params[k]) for k in model.trainable}
        frozen = {k: v for k, v in model.params.items() if k not in variables}

        @tf.function
        def zoo_step():
            with tf.GradientTape() as tape:
                out, _ = apply(ops, {**frozen, **variables}, x, spec=zoo_spec, train=True, **extra)
                loss = loss_of(out)
            targets = list(variables.values())
            sgd(tape.gradient(loss, targets), targets)

        zoo_fwd = None
        if forward:  # the forward reads the model's own weights (immutable: conv kernels laid out once)
            params = dict(model.params)
            zoo_f = tf.function(lambda x, extra: apply(ops, params, x, spec=zoo_spec, **extra))
            zoo_fwd = lambda: zoo_f(x, extra).numpy()
        else:  # the variables are the one copy of the trained weights, as keras-hub's are
            model = None
        built["zoo"] = (zoo_fwd, zoo_step, model)
    if "canonical" in sides:
        backbone, keras_in, features, classes = keras_backbone_of(name, spec, args.dtype)
        head = tf.Variable(tf.cast(head_of(name, spec, features, classes), args.dtype))
        k_in = tf.nest.map_structure(tf.constant, keras_in(data))
        keras_f = tf.function(lambda inp: keras_output(name, backbone(inp, training=False), head)) if forward else None

        @tf.function
        def keras_step():
            with tf.GradientTape() as tape:
                loss = loss_of(keras_output(name, backbone(k_in, training=True), head))
            targets = list(backbone.trainable_variables) + [head]
            sgd(tape.gradient(loss, targets), targets)

        built["canonical"] = ((lambda: keras_f(k_in).numpy()) if forward else None, keras_step, backbone)
    return built


def keras_worker(args: argparse.Namespace) -> None:
    """JAX or TensorFlow (``--worker``): each model's zoo side against keras-hub's."""
    framework = args.worker
    for name in args.models:
        _, data, note = spec_and_inputs(name, args)
        try:
            sides = {"jax": jax_sides, "tensorflow": tensorflow_sides}[framework](
                name, data, ("zoo", "canonical"), args
            )
        except KerasRefuses as error:
            print(f"{name:<9} {framework} keras-hub refuses this configuration: {error}", flush=True)
            continue
        (zoo_fwd, zoo_train, model), (keras_fwd, keras_train, backbone) = sides["zoo"], sides["canonical"]
        shape_ok = zoo_fwd().shape == keras_fwd().shape
        fwd = timed({"zoo": zoo_fwd, "canonical": keras_fwd}, args) if "forward" in args.measure else None
        train = timed({"zoo": zoo_train, "canonical": keras_train}, args) if "train" in args.measure else None
        row(name, framework, f"keras-hub {type(backbone).__name__}", fwd, train, note, same_shape(shape_ok))

        if framework == "jax" and name == "gpt2" and "generate" in args.measure:
            import jax

            prompt = jax.numpy.asarray(data["x"])[: args.gen_batch, : prompt_length(model.spec, args)]
            zoo_gen = lambda: jax.block_until_ready(model.generate(prompt, max_new_tokens=args.new_tokens))
            zoo_t, _ = timed({"zoo": zoo_gen, "none": lambda: None}, args)
            generation_row("jax", "", zoo_t, None, args, True, prompt.shape[1])


def head_of(name: str, spec: dict, features, classes) -> np.ndarray:
    """The head matmul's weights the keras-hub side adds (a backbone has none)."""
    rng = np.random.default_rng(2)
    if name in IMAGES:
        return (rng.standard_normal((features, classes)) * 0.02).astype(np.float32)
    if name in LANGUAGE:
        return (rng.standard_normal((spec["width"], spec["vocab"])) * 0.02).astype(np.float32)
    return np.zeros((1, 1), np.float32)


def same_shape(ok: bool) -> str:
    return "same shape (random weights)" if ok else "SHAPE DIFFERS"


WORKERS = {"torch": torch_worker, "jax": keras_worker, "tensorflow": keras_worker}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--frameworks", nargs="+", default=list(FRAMEWORKS), choices=FRAMEWORKS)
    parser.add_argument("--size", choices=("real", "small"), default="real")
    parser.add_argument("--llama-layers", type=int, default=None, help="Llama blocks (default: all 16, 3.2 1B's)")
    parser.add_argument(
        "--measure",
        nargs="+",
        default=["forward", "train", "generate"],
        choices=("forward", "train", "generate"),
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per side (after --warmup)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--budget", type=float, default=120.0, help="seconds per measurement before stopping early")
    parser.add_argument("--gen-batch", type=int, default=1)
    parser.add_argument("--gen-prompt", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="gpu: GPU 0 (torch and JAX)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--apart", action="store_true", help="training step: each side in processes of its own")
    parser.add_argument("--worker", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    parser.add_argument("--side", choices=("save", "zoo", "canonical"), help=argparse.SUPPRESS)
    parser.add_argument("--weights", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.apart and args.measure != ["train"]:
        parser.error("--apart measures the training step alone: add --measure train")
    if args.apart and (args.device, args.dtype) != ("cpu", "float32"):
        parser.error("--apart runs on the CPU in fp32: leave out --device and --dtype")
    if args.side:
        print(pin_threads(args.threads, frameworks=(args.worker,)), file=sys.stderr, flush=True)
        torch_side(args) if args.worker == "torch" else keras_side(args)
        return
    if args.worker:
        print(pin_threads(args.threads, frameworks=(args.worker,)), file=sys.stderr, flush=True)
        WORKERS[args.worker](args)
        return
    print(
        f"batch {BATCH}, length {LENGTH} (text), 224x224 (images), {args.dtype} on {args.device}, "
        f"{args.threads} CPU thread(s) for every "
        f"framework; {args.repeats} rounds after {args.warmup} warm-up(s), zoo and canonical in turns; "
        "ms median (min-max); ratio = zoo / canonical (1.00 = no overhead); transformers with its default "
        "attention (sdpa); keras-hub random weights + the same head matmul; train = fwd + loss + backward + SGD",
        flush=True,
    )
    header()
    if args.apart:
        train_apart(args)
        return
    for framework in args.frameworks:
        command = [sys.executable, __file__, "--worker", framework] + sys.argv[1:]
        env = dict(os.environ, KERAS_BACKEND=framework, TF_CPP_MIN_LOG_LEVEL="2")
        done = subprocess.run(command, env=env, stderr=subprocess.PIPE, text=True)
        if done.returncode:
            print(f"{framework}: worker failed ({done.returncode}):\n{done.stderr[-3000:]}", flush=True)


if __name__ == "__main__":
    main()
