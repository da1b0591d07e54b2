"""Tensor parallel at the zoo's real scale (``mesh={"model": 2}``, issue 31: "the zoo's real-scale
bert, gpt2 and llama run under it"): ``models.build(name)``'s default spec, not the small one,
takes one training step split over two processes started by ``xdevice launch`` (PyTorch: DTensor
over gloo; JAX: ``jax.distributed``, one CPU device each), with the loss one process computes.

bert (base, 12 layers, its pooler), gpt2 (124M, 12 blocks) and llama (Llama 3.2 1B's sizes: 16
blocks, 32 heads of which 8 key/value, a 128,256-token vocabulary, 1.24B parameters) run whole.
llama fits two processes on a 24 GiB machine because nothing holds the whole model beside its
parts for long: each array is placed as it is drawn (``models.build``), the trainer lets the
model's whole arrays go once it holds its parts, and learns the output's shape by shape
evaluation, not from a forward pass on gathered weights, and the token embedding (1 GB, tied to
the output layer) is split by vocabulary like the layers. Peak memory per phase:
``benchmarks/tp_memory.py`` (docs/training.md's table). SGD, not Adam (no optimizer slots:
2 x 5 GB more on one process). Two steps on one batch of two rows of 16 tokens, each loss as one
process's; on PyTorch the second step's collectives are counted too: per block, the two sums
after the row layers in the forward pass and the two of the column layers' input gradients in
the backward, and the vocabulary split's (``EMBEDDING``), nothing else. ``make
test-models`` (``realworld``): a case took 16-52 s here, the two llama ones 3 min 17 s together.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from xdevice import models

#: the default spec, whole (see above); and each model's number of blocks
SIZES: dict[str, dict] = {"bert": {}, "gpt2": {}, "llama": {}}
DEPTH = {"bert": "layers", "gpt2": "blocks", "llama": "blocks"}
#: PyTorch's collectives in a step besides Megatron's four sums a block, from the token embedding
#: split by vocabulary over two (tests/training/test_torch_tensor_parallel.py, ``exchanges``):
#: bert's 30,522 rows split, and it looks them up twice (the padding row's lookup, detached), one
#: sum each; gpt2's 50,257 do not split evenly and stay whole; llama's 128,256 split, and its
#: tied head adds the sum of its input's gradient, and its logits, split by vocabulary, are
#: all-gathered for the loss's log_softmax and for the metrics
EMBEDDING = {"bert": {"all_reduce": 2}, "gpt2": {}, "llama": {"all_reduce": 2, "all_gather_into_tensor": 2}}

SCRIPT = textwrap.dedent("""
    import json, resource, sys
    import numpy as np
    import xdevice
    from xdevice import models, Trainer
    from xdevice.training.launch import world

    backend, name, sizes, out = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
    if backend == "jax":
        xdevice.join_processes("jax")  # before building the model: JAX joins before computing
    rank, size = world()
    model = models.build(name, backend=backend, **sizes, seed=0)
    rng = np.random.default_rng(0)
    x = rng.integers(0, model.spec["vocab"], size=(2, 16)).astype("int32")
    if name == "bert":  # the last hidden state towards random targets
        y, loss = rng.normal(size=(2, 16, model.spec["width"])).astype("float32"), "mse"
    else:  # the next token
        y, loss = np.roll(x, -1, axis=1).astype("int64"), "cross_entropy"
    trainer = Trainer(model, loss, "sgd", lr=1e-3, mesh={"model": size} if size > 1 else None)
    trainer.fit((x, y), epochs=1, batch_size=2, verbose=0, seed=0)
    counted = {}
    if backend == "torch" and size > 1:  # the second step's collectives
        from torch.distributed.tensor.debug import CommDebugMode

        comm = CommDebugMode()
        with comm:
            history = trainer.fit((x, y), epochs=2, batch_size=2, verbose=0, seed=0)
        counted = {str(op).split(".")[-1]: n for op, n in comm.get_comm_counts().items()}
    else:
        history = trainer.fit((x, y), epochs=2, batch_size=2, verbose=0, seed=0)
    with open(f"{out}/rank{rank}of{size}.json", "w") as file:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # bytes (Linux counts KiB)
        json.dump({"steps": history.steps, "spec": model.spec, "collectives": counted, "peak": peak}, file)
""")


def run(tmp_path, backend: str, name: str, *launch: str) -> None:
    script = tmp_path / "step.py"
    script.write_text(SCRIPT)
    command = [sys.executable, *launch, str(script), backend, name, json.dumps(SIZES[name]), str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.realworld
@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_a_real_scale_transformer_trains_over_a_model_axis_of_two_processes_as_one_does(tmp_path, backend, name):
    if not backend.supports_tensor_parallel:
        pytest.skip(f"{backend.title} has no tensor-parallel layout (a mesh with a 'model' axis)")
    run(tmp_path, backend.name, name)  # one process: the reference (alone first: the memory is shared)
    run(tmp_path, backend.name, name, "-m", "xdevice", "launch", "--nproc-per-node", "2")
    one = json.loads((tmp_path / "rank0of1.json").read_text())
    ranks = [json.loads((tmp_path / f"rank{rank}of2.json").read_text()) for rank in range(2)]
    real = models.definition(name).DEFAULTS
    assert all(one["spec"][k] == v for k, v in real.items() if k not in SIZES[name])  # the real sizes
    assert len(one["steps"]) == 2 and np.isfinite(one["steps"]).all()
    for many in ranks:
        np.testing.assert_allclose(many["steps"], one["steps"], rtol=1e-5)
        if backend.name == "torch":  # Megatron's exchanges only: per block two sums forward, two backward
            megatron = 4 * one["spec"][DEPTH[name]]
            extra = EMBEDDING[name]
            assert many["collectives"] == {**extra, "all_reduce": megatron + extra.get("all_reduce", 0)}, many[
                "collectives"
            ]
        if name == "llama":  # each process held its part, never the whole model beside it (see above)
            assert many["peak"] < 0.8 * one["peak"], (many["peak"], one["peak"])


def test_a_model_drawn_array_by_array_in_runs_of_rows_has_the_weights_of_one_draw_each(monkeypatch):
    # what lets two processes build llama: each array is drawn in runs of rows, cast as it comes,
    # and placed before the next is drawn; the weights are those of one whole draw per array
    from xdevice.models import _init

    spec = {**models.definition("llama").SMALL, "blocks": 1}
    whole = models.build("llama", backend="numpy", **spec, seed=3).params
    monkeypatch.setattr(_init, "_RUN", 7)  # a run of one row (wider than 7) or a few
    runs = models.build("llama", backend="numpy", **spec, seed=3).params
    assert list(runs) == list(whole)
    for key, value in whole.items():
        np.testing.assert_array_equal(runs[key], value, err_msg=key)
