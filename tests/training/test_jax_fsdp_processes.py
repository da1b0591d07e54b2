"""JAX's sharded data parallel (``strategy="fsdp"``) across two processes started by
``xdevice launch`` (``jax.distributed``, one CPU device each, a ``Mesh`` over both): the zoo
mlp trains as one process does, each process holding half of the weights and of the
optimizer state; ``gather``, ``weights``, ``evaluate`` and ``save`` all-gather the shards, and the
one process's checkpoint resumes sharded over two.
SGD with momentum, not Adam: Adam's step does not change when every gradient is scaled alike,
so it would hide a gradient averaged where it should be summed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from xdevice import estimate_memory
from xdevice.training import checkpoint

pytest.importorskip("jax")

STEPS = 20
SPEC = {"hidden": [16], "inputs": 6, "classes": 2, "seed": 0}  # the script's model

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import xdevice
    from xdevice import models, Trainer
    from xdevice.training.launch import world
    xdevice.join_processes("jax")  # before building the model: JAX joins before computing

    def held(value):  # the bytes of value's pieces on this process's devices
        return sum(shard.data.nbytes for shard in value.addressable_shards)

    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * 8, 6)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    model = models.build("mlp", backend="jax", hidden=[16], inputs=6, classes=2, seed=0)
    trainer = Trainer(model, optimizer="momentum", lr=0.05, strategy="fsdp")
    history = trainer.fit((x, y), epochs=1, batch_size=8, verbose=0, seed=0)
    params = trainer.program.params
    slots = {k: v for k, v in trainer.state.items() if "/" in k}  # momentum/
    whole = trainer.gather()  # a zoo Model: its params whole on this process's device
    rank, size = world()
    trainer.save(sys.argv[1] + f"/of{size}")  # process 0 writes it, from the gathered arrays
    # the one process's checkpoint (written first, whole arrays) resumes sharded here
    resumed = Trainer(models.build("mlp", backend="jax", hidden=[16], inputs=6, classes=2, seed=1),
                      optimizer="momentum", lr=0.05, strategy="fsdp")
    resumed.load(sys.argv[1] + "/of1")
    after = [resumed.step(x[i:i + 8], y[i:i + 8]) for i in (0, 8)]
    with open(sys.argv[1] + f"/rank{rank}of{size}.json", "w") as out:
        json.dump({
            "steps": history.steps,
            "params": {k: np.asarray(v).ravel().tolist() for k, v in whole.numpy_params().items()},
            "weights": {k: v.ravel().tolist() for k, v in trainer.weights().items()},
            "evaluated": trainer.evaluate((x, y), batch_size=32),
            "resumed": after,
            "param_bytes": sum(held(v) for v in params.values()),
            "slot_bytes": sum(held(v) for v in slots.values()),
            "whole_bytes": sum(v.nbytes for v in params.values()),
            "addressable": sorted({v.is_fully_addressable for v in params.values()}),
        }, out)
""").replace("STEPS", str(STEPS))


def run(tmp_path, *launch: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, *launch, str(script), str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_fsdp_on_two_jax_processes_trains_as_one_process_with_half_the_weights_each(tmp_path):
    run(tmp_path)  # one process, not launched: one device, nothing to shard
    run(tmp_path, "-m", "xdevice", "launch", "--nproc-per-node", "2")
    one = json.loads((tmp_path / "rank0of1.json").read_text())
    ranks = [json.loads((tmp_path / f"rank{rank}of2.json").read_text()) for rank in range(2)]
    assert len(one["steps"]) == STEPS
    for many in ranks:
        np.testing.assert_allclose(many["steps"], one["steps"], rtol=1e-5)
        for key, value in one["params"].items():  # gathered whole in every process
            np.testing.assert_allclose(many["params"][key], value, rtol=0, atol=1e-5, err_msg=key)
            np.testing.assert_allclose(many["weights"][key], value, rtol=0, atol=1e-5, err_msg=key)
        for key, value in one["evaluated"].items():
            np.testing.assert_allclose(many["evaluated"][key], value, rtol=1e-5, err_msg=key)
        # sharded: each process holds half of the weights and of their momentum, across both
        # processes (no process can read the whole array without gathering it)
        assert many["param_bytes"] * 2 == one["param_bytes"] == many["whole_bytes"] == 146 * 4
        assert many["slot_bytes"] * 2 == one["slot_bytes"] == one["param_bytes"]
        assert many["addressable"] == [False]
        # the one process's checkpoint (whole arrays) resumes sharded over two: the same steps
        np.testing.assert_allclose(many["resumed"], one["resumed"], rtol=1e-5)
    assert one["addressable"] == [True]
    # what each process measured is what the memory estimate says for fsdp over that many devices
    for count, measured in [(1, one), (2, ranks[0]), (2, ranks[1])]:
        parts = estimate_memory(
            "mlp", batch=8, optimizer="momentum", measure=False, strategy="fsdp", devices=count, **SPEC
        ).parts
        assert (parts["parameters"], parts["optimizer state"]) == (measured["param_bytes"], measured["slot_bytes"])
    # the checkpoint process 0 wrote holds whole arrays, the same as the one process's
    arrays, state, record = checkpoint.read(str(tmp_path / "of2"))
    alone, alone_state, _ = checkpoint.read(str(tmp_path / "of1"))
    assert record["step"] == STEPS
    for key, value in {**alone, **alone_state}.items():
        saved = {**arrays, **state}[key]
        assert saved.shape == value.shape, key
        np.testing.assert_allclose(saved, value, rtol=0, atol=1e-5, err_msg=key)
