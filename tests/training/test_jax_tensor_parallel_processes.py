"""JAX's tensor parallel (``mesh={"model": 2}``, ``{"data": 2, "model": 2}``) across processes
started by ``xdevice launch`` on loopback (``jax.distributed``, one CPU device each, one global
``Mesh`` with axes ("data", "model")): the zoo's bert, gpt2 and llama (small, one block) train as
one process does for 20 steps, each process holding its part of each split weight and of its Adam
slots, the part of its column of the grid (of a fused ``attn.qkv``, whole heads of q, k and v);
``weights()`` and ``save`` all-gather the whole arrays, in the saved layout."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from xdevice.training import checkpoint

pytest.importorskip("jax")

STEPS = 20
#: the zoo's small sizes with one block; bert trains its last hidden state towards random targets (mse)
SIZES = {"bert": {"pooler": False, "layers": 1}, "gpt2": {"blocks": 1}, "llama": {"blocks": 1}}
#: per model, split layers each process should hold a part of: {name: the axis split}; a fused
#: ``attn.qkv`` is held by its parts, (width, 3, width) and bias (3, width), split along the last axis
SPLIT = {
    "bert": {"layer0.attn.qkv.weight": 2, "layer0.attn.qkv.bias": 1, "layer0.mlp.fc2.weight": 0},
    "gpt2": {"block0.attn.qkv.weight": 2, "block0.attn.qkv.bias": 1, "block0.mlp.fc2.weight": 0},
    # llama's query, key and value are three layers; the key has kv_heads (2) heads, one per process
    "llama": {
        "block0.attn.q.weight": 1,
        "block0.attn.k.weight": 1,
        "block0.mlp.gate.weight": 1,
        "block0.mlp.down.weight": 0,
    },
}

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import xdevice
    from xdevice import models, Trainer
    from xdevice.training.launch import world
    xdevice.join_processes("jax")  # before building the model: JAX joins before computing

    folder, name, sizes, mesh = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
    rank, size = world()
    model = models.build(name, backend="jax", **{**models.definition(name).SMALL, **sizes}, seed=0)
    rng = np.random.default_rng(0)
    x = rng.integers(0, model.spec["vocab"], size=(20 * 4, 8)).astype("int32")
    if name == "bert":  # its last hidden state, towards random targets
        y, loss = rng.normal(size=(20 * 4, 8, model.spec["width"])).astype("float32"), "mse"
    else:
        y, loss = np.roll(x, -1, axis=1).astype("int64"), "cross_entropy"  # the next token
    # eps=1e-6: see tests/training/test_tensor_parallel.py (the key bias's rounding-noise gradient)
    trainer = Trainer(model, loss, "adam", lr=1e-3, eps=1e-6, mesh=mesh if size > 1 else None)
    history = trainer.fit((x, y), epochs=1, batch_size=4, verbose=0, seed=0)

    def held(value):  # the piece of value on this process's one device: where it starts, its shape
        (shard,) = value.addressable_shards
        return {"start": [s.start or 0 for s in shard.index], "shape": list(shard.data.shape)}

    params = trainer.program.params
    weights = trainer.weights()
    trainer.save(folder + f"/saved{size}")  # process 0 writes it, from the gathered arrays
    with open(folder + f"/rank{rank}of{size}.json", "w") as out:
        json.dump({
            "steps": history.steps,
            "params": {k: v.ravel().tolist() for k, v in weights.items()},
            "shapes": {k: list(v.shape) for k, v in weights.items()},
            "held": {k: held(v) for k, v in params.items()},
            "slots": {k: held(v) for k, v in trainer.state.items() if k.startswith(("m/", "v/"))},
            "fused": {k: np.asarray(v.addressable_shards[0].data).tolist() for k, v in params.items() if ".qkv.w" in k},
            "addressable": {k: v.is_fully_addressable for k, v in params.items()},
        }, out)
""")


def start(tmp_path, name: str, mesh: dict, *launch: str) -> subprocess.Popen:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    command = [sys.executable, *launch, str(script), str(tmp_path), name, json.dumps(SIZES[name]), json.dumps(mesh)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(started: subprocess.Popen) -> None:
    _, stderr = started.communicate(timeout=300)
    assert started.returncode == 0, stderr[-3000:]


@pytest.mark.parametrize(
    "name, mesh",
    [
        # make test-models: each starts three or five processes and compiles the model in each
        pytest.param("gpt2", {"model": 2}, id="gpt2-model2", marks=pytest.mark.realworld),
        pytest.param("gpt2", {"data": 2, "model": 2}, id="gpt2-data2-model2", marks=pytest.mark.realworld),
        pytest.param("bert", {"model": 2}, id="bert-model2", marks=pytest.mark.realworld),
        pytest.param("llama", {"model": 2}, id="llama-model2", marks=pytest.mark.realworld),
    ],
)
def test_a_model_axis_across_jax_processes_trains_as_one_process_with_a_part_of_each_split_weight(tmp_path, name, mesh):
    model = mesh["model"]
    processes = mesh.get("data", 1) * model
    alone = start(tmp_path, name, mesh)  # one process, one device: the reference, beside the launched ones
    launched = start(tmp_path, name, mesh, "-m", "xdevice", "launch", "--nproc-per-node", str(processes))
    finish(alone)
    finish(launched)
    one = json.loads((tmp_path / "rank0of1.json").read_text())
    ranks = [json.loads((tmp_path / f"rank{rank}of{processes}.json").read_text()) for rank in range(processes)]
    assert len(one["steps"]) == STEPS
    for rank, many in enumerate(ranks):
        np.testing.assert_allclose(many["steps"], one["steps"], rtol=1e-5)
        assert many["shapes"] == one["shapes"]  # weights() gathers whole arrays
        for key, value in one["params"].items():
            np.testing.assert_allclose(many["params"][key], value, rtol=0, atol=1e-5, err_msg=key)
        for key, axis in SPLIT[name].items():  # its column's part of a split weight, and of its Adam slots
            part = list(one["shapes"][key])
            if ".attn.qkv." in key:  # held by its parts: [..., 3 * width] -> [..., 3, width]
                part[-1:] = [3, part[-1] // 3]
            part[axis] //= model
            start_at = [0] * len(part)
            start_at[axis] = (rank % model) * part[axis]  # process r sits in column r % model
            assert many["held"][key] == {"start": start_at, "shape": part}, key
            assert many["slots"][f"m/{key}"] == many["slots"][f"v/{key}"] == many["held"][key], key
            assert many["addressable"][key] is False  # no process can read it whole without gathering
        norm = next(k for k in one["shapes"] if "norm" in k)
        assert many["held"][norm]["shape"] == one["shapes"][norm]  # a layer outside the layout is whole
        for key, local in many["fused"].items():  # a fused qkv: the same whole heads of q, k and v
            saved = np.asarray(many["params"][key]).reshape(one["shapes"][key])
            width = saved.shape[1] // 3 // model
            column = rank % model
            mine = saved.reshape(saved.shape[0], 3, -1)[..., column * width : (column + 1) * width]
            np.testing.assert_array_equal(np.asarray(local), mine, err_msg=key)
    # save gathers too: process 0 wrote the whole arrays and optimizer state, as one process does
    arrays, state, record = checkpoint.read(str(tmp_path / f"saved{processes}"))
    alone_arrays, alone_state, _ = checkpoint.read(str(tmp_path / "saved1"))
    assert record["step"] == STEPS
    for key, value in {**alone_arrays, **alone_state}.items():
        saved = {**arrays, **state}[key]
        assert saved.shape == value.shape, key
        np.testing.assert_allclose(saved, value, rtol=0, atol=1e-5, err_msg=key)


def test_a_mesh_that_leaves_out_some_of_the_launched_processes_devices_is_refused(tmp_path):
    # each of the two processes holds two CPU devices: {"model": 2} counts the processes (2), not
    # the four devices JAX's global mesh would lay out
    script = tmp_path / "refused.py"
    script.write_text(
        textwrap.dedent("""
        import jax
        jax.config.update("jax_num_cpu_devices", 2)
        import xdevice
        from xdevice import models, Trainer
        xdevice.join_processes("jax")
        model = models.build("gpt2", backend="jax", **models.definition("gpt2").SMALL, seed=0)
        Trainer(model, mesh={"model": 2})
        """)
    )
    command = [sys.executable, "-m", "xdevice", "launch", "--nproc-per-node", "2", str(script)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "lays out every device the processes hold" in done.stderr, done.stderr[-3000:]
    assert "data * model == 4" in done.stderr
