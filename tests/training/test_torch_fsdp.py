"""PyTorch's sharded data parallel (``strategy="fsdp"``): FSDP2's ``fully_shard`` across two
processes started by ``xdevice launch`` on loopback (gloo) trains the zoo mlp as one process
does, each rank holding half of the weights and of the optimizer state, and resumes the one
process's checkpoint sharded. SGD with momentum, not
Adam: Adam's step does not change when every gradient is scaled alike, so it would hide a
gradient averaged where it should be summed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from xdevice import estimate_memory

pytest.importorskip("torch")

STEPS = 20
SPEC = {"hidden": [16], "inputs": 6, "classes": 2, "seed": 0}  # the script's model

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    from torch.distributed.tensor import DTensor
    from xdevice import models, Trainer
    from xdevice.training.launch import world

    def local(value):  # what this rank holds of a param or slot
        return value.to_local() if isinstance(value, DTensor) else value

    rng = np.random.default_rng(0)
    x = rng.normal(size=(20 * 8, 6)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    model = models.build("mlp", backend="torch", hidden=[16], inputs=6, classes=2, seed=0)
    trainer = Trainer(model, optimizer="momentum", lr=0.05, strategy="fsdp")
    history = trainer.fit((x, y), epochs=1, batch_size=8, verbose=0, seed=0)
    held = {k: local(v) for k, v in trainer.program.params.items()}
    slots = {k: local(v) for k, v in trainer.state.items() if "/" in k}  # momentum/
    kept = {k: type(v).__name__ for k, v in model.params.items()}  # what fit handed back
    whole = trainer.gather().params
    rank, size = world()
    if size == 1:  # one process writes the checkpoint that two sharded ones resume from
        trainer.save(sys.argv[1] + "/one")
    resumed = Trainer(models.build("mlp", backend="torch", hidden=[16], inputs=6, classes=2, seed=1),
                      optimizer="momentum", lr=0.05, strategy="fsdp")
    resumed.load(sys.argv[1] + "/one")
    after = [resumed.step(x[i:i + 8], y[i:i + 8]) for i in (0, 8)]
    with open(sys.argv[1] + f"/rank{rank}of{size}.json", "w") as out:
        json.dump({
            "steps": history.steps,
            "params": {k: v.detach().numpy().ravel().tolist() for k, v in whole.items()},
            "shapes": {k: list(v.shape) for k, v in whole.items()},
            "numel": sum(v.numel() for v in held.values()),
            "param_bytes": sum(v.numel() * v.element_size() for v in held.values()),
            "slot_bytes": sum(v.numel() * v.element_size() for v in slots.values()),
            "kept": kept,
            "resumed": after,
        }, out)
""")


def run(tmp_path, *launch: str) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, *launch, str(script), str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_fsdp_on_two_processes_trains_as_one_process_with_half_the_weights_each(tmp_path):
    run(tmp_path)  # one process, not launched: nothing to shard
    run(tmp_path, "-m", "xdevice", "launch", "--nproc-per-node", "2")
    one = json.loads((tmp_path / "rank0of1.json").read_text())
    ranks = [json.loads((tmp_path / f"rank{rank}of2.json").read_text()) for rank in range(2)]
    assert len(one["steps"]) == STEPS
    for many in ranks:
        np.testing.assert_allclose(many["steps"], one["steps"], rtol=1e-5)
        assert many["shapes"] == one["shapes"]  # gathered whole
        for key, value in one["params"].items():
            np.testing.assert_allclose(many["params"][key], value, rtol=0, atol=1e-5, err_msg=key)
        # sharded: each rank holds half of the weights and of their momentum, and the
        # model fit handed back still holds the shards (gathering is the explicit call)
        assert many["numel"] * 2 == one["numel"] == 146
        assert many["param_bytes"] * 2 == one["param_bytes"]
        assert many["slot_bytes"] * 2 == one["slot_bytes"] == one["param_bytes"]
        assert set(many["kept"].values()) == {"DTensor"}
        # the one process's checkpoint (whole arrays) resumes sharded over two: the same steps
        np.testing.assert_allclose(many["resumed"], one["resumed"], rtol=1e-5)
    assert set(one["kept"].values()) == {"Tensor"}
    # what each rank measured is what the memory estimate says for fsdp over that many devices
    for count, measured in [(1, one), (2, ranks[0]), (2, ranks[1])]:
        parts = estimate_memory(
            "mlp", batch=8, backend="torch", optimizer="momentum", measure=False, strategy="fsdp", devices=count, **SPEC
        ).parts
        assert (parts["parameters"], parts["optimizer state"]) == (measured["param_bytes"], measured["slot_bytes"])
