"""Tensor parallel at the zoo's real scale (``mesh={"model": 2}``, issue 31: "the zoo's real-scale
bert, gpt2 and llama run under it"): ``models.build(name)``'s default spec, not the small one,
takes one training step split over two processes started by ``xdevice launch`` (PyTorch: DTensor
over gloo; JAX: ``jax.distributed``, one CPU device each), with the loss one process computes.

bert (base, 12 layers, its pooler) and gpt2 (124M, 12 blocks) run whole. llama runs its real
width, heads (32, 8 of them key/value), MLP and 128,256-token vocabulary with 2 of its 16 blocks:
each process builds the whole model before splitting it, and the 1.2B-parameter model with its
gradients would take more memory than a test may on a shared machine (2 blocks: about 5 GB a
process, measured). SGD, not Adam, for the same reason (no optimizer slots). Two steps on one
batch of two rows of 16 tokens, each loss as one process's; on PyTorch the second step's
collectives are counted too: per block, the two sums after the row layers in the forward pass
and the two of the column layers' input gradients in the backward, and nothing else (the first
``fit`` also gathers every split weight once, to learn the output's shape from a forward pass on
whole weights). ``make test-models`` (``realworld``): a case took 16-52 s here (3 min 15 s for the six).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from xdevice import models

#: the default spec, but for llama's depth (see above); and each model's number of blocks
SIZES = {"bert": {}, "gpt2": {}, "llama": {"blocks": 2}}
DEPTH = {"bert": "layers", "gpt2": "blocks", "llama": "blocks"}

SCRIPT = textwrap.dedent("""
    import json, sys
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
    if backend == "torch" and size > 1:  # the second step's collectives: the first fit also learns
        # the output's shape, from a forward pass on whole (gathered) weights
        from torch.distributed.tensor.debug import CommDebugMode

        comm = CommDebugMode()
        with comm:
            history = trainer.fit((x, y), epochs=2, batch_size=2, verbose=0, seed=0)
        counted = {str(op).split(".")[-1]: n for op, n in comm.get_comm_counts().items()}
    else:
        history = trainer.fit((x, y), epochs=2, batch_size=2, verbose=0, seed=0)
    with open(f"{out}/rank{rank}of{size}.json", "w") as file:
        json.dump({"steps": history.steps, "spec": model.spec, "collectives": counted}, file)
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
            assert many["collectives"] == {"all_reduce": 4 * one["spec"][DEPTH[name]]}, many["collectives"]
