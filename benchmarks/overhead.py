"""What xdevice costs over the framework it wraps: hot calls and the optimizer update.

1. Hot calls (``--parts hot``), each beside the framework's own call doing the same thing, on
   a small CPU array (so the call, not the copy, is measured): ``to_device`` vs ``Tensor.to`` /
   ``jax.device_put``; ``device_of`` vs ``Tensor.device``; ``backend_of`` vs ``isinstance``;
   entering and leaving ``on("cpu:0")`` vs ``torch.device`` + ``jax.default_device`` entered by
   hand; ``convert`` vs the raw DLPack call (``jax.dlpack.from_dlpack`` / ``torch.from_dlpack``).
2. Optimizer updates (``--parts optimizer``): the update xdevice's trainer makes on the zoo
   mlp's parameters and gradients, torch backend (``update(..., inplace=True)``), against
   ``torch.optim`` ``Adam``, ``AdamW`` and ``SGD(momentum=0.9)`` stepping the same parameters
   with their defaults (on the CPU, torch's for-loop kernel), and ``Adam(foreach=True)``.

Each cell is microseconds per call, median (min-max) over ``--samples`` rounds in which the two
sides take turns (``--inner`` calls per round); the ratio is of the medians (with the spread of
the per-round ratios). Every framework runs on ``--threads`` threads. Run:

    .venv/bin/python benchmarks/overhead.py [--parts hot optimizer] [--samples 15] [--threads 1]
"""

from __future__ import annotations

import argparse
import contextlib

from _timing import THREADS_HELP, cell, interleaved, pin_threads, ratio_cell

TARGETS = {"to_device": 5.0, "device_of": 10.0, "backend_of": 10.0, "on": 10.0, "convert": 1.5, "optimizer": 1.2}


def hot_calls() -> list[tuple[str, str, dict, str]]:
    """(call, native, the two sides, target key) for every hot call of an installed framework."""
    import numpy as np

    import xdevice

    rows = []
    if "torch" in xdevice.backends():
        import torch

        t = torch.ones(16)
        cpu = torch.device("cpu")
        rows += [
            (
                "to_device(torch, 'cpu')",
                "t.to('cpu')",
                {"xdevice": lambda: xdevice.to_device(t, "cpu"), "native": lambda: t.to("cpu")},
                "to_device",
            ),
            (
                "device_of(torch)",
                "t.device",
                {"xdevice": lambda: xdevice.device_of(t), "native": lambda: t.device},
                "device_of",
            ),
            (
                "backend_of(torch)",
                "isinstance(t, Tensor)",
                {"xdevice": lambda: xdevice.backend_of(t), "native": lambda: isinstance(t, torch.Tensor)},
                "backend_of",
            ),
        ]
    if "jax" in xdevice.backends():
        import jax
        import jax.numpy as jnp

        a = jnp.ones(16)
        first = jax.devices("cpu")[0]
        rows += [
            (
                "to_device(jax, 'cpu')",
                "jax.device_put",
                {"xdevice": lambda: xdevice.to_device(a, "cpu"), "native": lambda: jax.device_put(a, first)},
                "to_device",
            )
        ]
        if "torch" in xdevice.backends():

            def enter_native():
                with torch.device(cpu), jax.default_device(first):
                    pass

            def enter_xdevice():
                with xdevice.on("cpu:0"):
                    pass

            rows.append(
                (
                    "with on('cpu:0')",
                    "torch.device + jax.default_device",
                    {"xdevice": enter_xdevice, "native": enter_native},
                    "on",
                )
            )
            rows.append(
                (
                    "convert(torch, to='jax')",
                    "jax.dlpack.from_dlpack(t)",
                    {"xdevice": lambda: xdevice.convert(t, to="jax"), "native": lambda: jax.dlpack.from_dlpack(t)},
                    "convert",
                )
            )
    x = np.ones(16, np.float32)
    rows.append(
        (
            "backend_of(numpy)",
            "isinstance(x, ndarray)",
            {"xdevice": lambda: xdevice.backend_of(x), "native": lambda: isinstance(x, np.ndarray)},
            "backend_of",
        )
    )
    return rows


def optimizer_rows() -> list[tuple[str, str, dict, str]]:
    """The trainer's update against torch.optim on the zoo mlp's parameters (torch backend)."""
    import torch

    from xdevice import models
    from xdevice.training.optimizers import SGD, Adam, AdamW

    model = models.build("mlp", backend="torch", seed=0)
    ops = model.ops
    rows = []
    for ours, theirs, how in (
        (Adam(lr=1e-3), torch.optim.Adam, ""),
        (AdamW(lr=1e-3), torch.optim.AdamW, ""),
        (SGD(lr=1e-2, momentum=0.9), lambda ps, lr: torch.optim.SGD(ps, lr=lr, momentum=0.9), ""),
        (Adam(lr=1e-3), lambda ps, lr: torch.optim.Adam(ps, lr=lr, foreach=True), "(foreach=True)"),
    ):
        params = {k: model.params[k].clone() for k in model.trainable}
        grads = {k: torch.randn_like(v) * 1e-3 for k, v in params.items()}
        state = {"value": ours.init(ops, params), "params": params}

        def step_xdevice(ours=ours, grads=grads, state=state):
            state["params"], state["value"] = ours.update(ops, state["params"], grads, state["value"], inplace=True)

        native = [torch.nn.Parameter(v.clone()) for v in params.values()]
        for p, g in zip(native, grads.values()):
            p.grad = g.clone()
        optimizer = theirs(native, lr=ours.lr)
        rows.append(
            (
                f"{type(ours).__name__} update, zoo mlp",
                f"torch.optim.{type(ours).__name__}.step{how}",
                {"xdevice": step_xdevice, "native": optimizer.step},
                "optimizer",
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=["hot", "optimizer"], choices=["hot", "optimizer"])
    parser.add_argument("--samples", type=int, default=15)
    parser.add_argument("--inner", type=int, default=0, help="calls per round (default: 2000 hot, 50 optimizer)")
    parser.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    args = parser.parse_args()
    print(pin_threads(args.threads, frameworks=("torch",)))  # TF left out: on() would enter its scope too
    print(f"us per call, median (min-max) of {args.samples} rounds taken in turn; ratio = xdevice / native")
    print(f"{'call':<28} {'xdevice us':>20} {'native':<34} {'native us':>18} {'ratio':>18} {'target':>7}")
    rows = []
    if "hot" in args.parts:
        rows += [(r, args.inner or 2000) for r in hot_calls()]
    if "optimizer" in args.parts:
        rows += [(r, args.inner or 50) for r in optimizer_rows()]
    for (call, native, sides, target), inner in rows:
        with contextlib.suppress(KeyboardInterrupt):
            times = interleaved(sides, samples=args.samples, inner=inner)
        print(
            f"{call:<28} {cell(times['xdevice']):>20} {native:<34} {cell(times['native']):>18} "
            f"{ratio_cell(times['xdevice'], times['native']):>18} {'<=' + format(TARGETS[target], 'g') + 'x':>7}",
            flush=True,
        )


if __name__ == "__main__":
    main()
