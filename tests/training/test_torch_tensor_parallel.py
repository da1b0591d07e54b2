"""PyTorch's tensor parallel (``mesh={"model": 2}``): the zoo transformers' attention and MLP
layers split over two processes started by ``xdevice launch`` on loopback (gloo), as DTensors
on a ``DeviceMesh``, train as one process does for 20 steps, each rank holding half of each
split weight (parameter and optimizer-slot bytes as ``estimate_memory(..., mesh=...)`` counts
them): of a fused ``attn.qkv``, whole heads of q, k and v. A step's only collectives are
Megatron's, counted with ``CommDebugMode``: the sums after the row layers in the forward pass,
and of the column layers' input gradients in the backward (no weight gathered, no activation
moved); after fit, ``weights()`` and ``save`` gather the whole arrays, in the saved layout. In
one process PyTorch has no devices to split over, and says how to launch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from xdevice import ConfigurationError, Trainer, estimate_memory, models

pytest.importorskip("torch")

STEPS = 20
#: the script's models: the zoo's small sizes with one block (bert without its pooler)
SIZES = {"bert": {"pooler": False, "layers": 1}, "gpt2": {"blocks": 1}, "llama": {"blocks": 1}, "vit": {"layers": 1}}
#: how far a final parameter may be from one process's: 1e-5 (issue 31), but vit's patch weights
#: and key bias get gradients near rounding noise, which Adam turns into steps whose size follows
#: the noise (JAX on one device vs two: 5e-5 in the key bias); its losses still agree within 1e-5
ATOL = {"vit": 1e-4}
#: the split layers each rank should hold a part of: {name: the axis split}; a fused ``attn.qkv``
#: is held by its parts, (width, 3, width) and bias (3, width), split along the last axis
SPLIT = {
    "gpt2": {"block0.attn.qkv.weight": 2, "block0.attn.qkv.bias": 1, "block0.mlp.fc2.weight": 0, "tokens.weight": 0},
    "llama": {
        "block0.attn.q.weight": 1,
        "block0.mlp.gate.weight": 1,
        "block0.mlp.down.weight": 0,
        "tokens.weight": 0,  # by vocabulary (96 rows: 48 a rank), the head tied to it
    },
    "bert": {"layer0.attn.qkv.weight": 2, "layer0.attn.out.weight": 0, "layer0.mlp.fc1.bias": 0},
    "vit": {"block0.attn.qkv.weight": 2, "block0.attn.out.weight": 0, "block0.mlp.fc1.weight": 1},
}

#: the models whose token embedding splits by vocabulary over two ranks (the small 96-token one,
#: tied to the head); bert's 99 tokens do not split evenly and stay whole, vit has no vocabulary
VOCAB_SPLIT = {"gpt2", "llama"}


def exchanges(name: str, remat: bool) -> tuple[dict[str, int], dict[str, int]]:
    """DTensor's collectives over ``model`` in one forward pass, and in one forward and backward
    pass of the loss (cross-entropy, or bert's mse), of a one-block model split over two ranks.

    Megatron's: the sums after ``attn.out`` and the MLP's closing layer in the forward pass, and
    their mirror images in the backward pass, the sums of the gradients of the opening layers'
    input (``attn.qkv`` or q, k, v; ``fc1`` or gate, up); under ``remat`` the recomputed block
    repeats the sum after ``attn.out`` (the one after the MLP the backward pass does not need,
    and torch's checkpoint stops before it). A vocabulary-split embedding adds its lookup's sum
    to the forward pass, and its tied head (a column layer) the sum of its input's gradient to
    the backward; its logits, split by vocabulary, are all-gathered once, where the loss's
    ``log_softmax`` reads the whole vocabulary.
    """
    split = name in VOCAB_SPLIT
    forward = {"all_reduce": 2 + split}
    step = {"all_reduce": 4 + remat + 2 * split, **({"all_gather_into_tensor": 1} if split else {})}
    return forward, step


SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import torch
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode
    from xdevice import models, Trainer
    from xdevice.training.launch import world

    def nbytes(arrays):  # what this rank holds of them: a DTensor's local shard, else the whole array
        local = [v.to_local() if isinstance(v, DTensor) else v for v in arrays.values()]
        return sum(v.numel() * v.element_size() for v in local)

    name, folder, mesh = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    model = models.build(name, backend="torch", **json.loads(sys.argv[4]))
    rng = np.random.default_rng(0)
    if name == "vit":  # images, and a class each
        x, y, loss = model.example_input(20 * 4), rng.integers(0, model.spec["classes"], 20 * 4), "cross_entropy"
    else:
        x = rng.integers(0, model.spec["vocab"], size=(20 * 4, 8)).astype("int32")
    if name == "bert":  # the last hidden state towards random targets
        y, loss = rng.normal(size=(20 * 4, 8, model.spec["width"])).astype("float32"), "mse"
    elif name != "vit":  # the next token
        y, loss = np.roll(x, -1, axis=1).astype("int64"), "cross_entropy"
    rank, size = world()
    mesh = mesh if size > 1 else None  # one process: the reference
    # eps=1e-6: see tests/training/test_tensor_parallel.py (the key bias's rounding-noise gradient)
    trainer = Trainer(model, loss, "adam", lr=1e-3, eps=1e-6, mesh=mesh)
    history = trainer.fit((x, y), epochs=1, batch_size=4, verbose=0, seed=0)
    params = trainer.program.params
    held = {k: list(v.to_local().shape) for k, v in params.items() if isinstance(v, DTensor)}
    slots = {k: list(v.to_local().shape) for k, v in trainer.state.items() if isinstance(v, DTensor)}
    fused = {k: v.to_local().tolist() for k, v in params.items() if ".attn.qkv.weight" in k and isinstance(v, DTensor)}
    def counted(comm):  # {"all_reduce": n, ...}: DTensor's collectives, and dist's own (the data axis's)
        return {str(op).split(".")[-1]: n for op, n in comm.get_comm_counts().items()}

    def objective(p):
        out, _ = trainer.program.forward(p, trainer.program.buffers, rows, True)
        return trainer.loss(trainer.ops, out, targets), None

    rows, targets = torch.as_tensor(x[:4]), torch.as_tensor(y[:4])
    forward, step = CommDebugMode(), CommDebugMode()
    if size > 1:
        with forward, trainer.replicas.computing():  # the collectives of one forward pass, as the step runs it
            trainer.program.forward(params, trainer.program.buffers, rows, True)
        with step:  # and of one forward and backward pass, the step's own
            trainer.replicas.value_and_grad(objective, params)
    weights = trainer.weights()
    trainer.save(folder + f"/saved{size}")
    with open(folder + f"/rank{rank}of{size}.json", "w") as out:
        json.dump({
            "steps": history.steps,
            "params": {k: v.ravel().tolist() for k, v in weights.items()},
            "shapes": {k: list(v.shape) for k, v in weights.items()},
            "held": held,
            "slots": slots,
            "fused": fused,
            "forward": counted(forward),
            "step": counted(step),
            "param_bytes": nbytes(trainer.program.params),
            "slot_bytes": nbytes({k: v for k, v in trainer.state.items() if "/" in k}),  # m/, v/; not the step
        }, out)
""")


def spec(name: str, remat: bool = False) -> dict:
    """The script's model: the zoo's small sizes with one block (``remat``: recomputed in the backward pass)."""
    return {**models.definition(name).SMALL, **SIZES[name], "seed": 0, **({"remat": True} if remat else {})}


def start(tmp_path, name: str, mesh: dict, remat: bool, *launch: str) -> subprocess.Popen:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    model = json.dumps(spec(name, remat))
    command = [sys.executable, *launch, str(script), name, str(tmp_path), json.dumps(mesh), model]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(started: subprocess.Popen) -> None:
    _, stderr = started.communicate(timeout=300)
    assert started.returncode == 0, stderr[-3000:]


@pytest.mark.multi_device
@pytest.mark.parametrize(
    "name, mesh, remat",
    [
        # make test-models: each starts three processes and takes 30 s or more on two cores
        pytest.param("gpt2", {"model": 2}, False, id="gpt2-model2", marks=pytest.mark.realworld),
        pytest.param("llama", {"model": 2}, False, id="llama-model2", marks=pytest.mark.realworld),
        pytest.param("bert", {"model": 2}, False, id="bert-model2", marks=pytest.mark.realworld),
        pytest.param("vit", {"model": 2}, False, id="vit-model2", marks=pytest.mark.realworld),  # images: a plain input
        pytest.param("gpt2", {"data": 2, "model": 2}, False, id="gpt2-data2-model2", marks=pytest.mark.realworld),
        pytest.param("llama", {"model": 2}, True, id="llama-remat-model2", marks=pytest.mark.realworld),
    ],
)
def test_a_model_axis_across_processes_trains_as_one_process_with_a_part_of_each_split_weight(
    tmp_path, name, mesh, remat
):
    processes = mesh.get("data", 1) * mesh["model"]
    alone = start(tmp_path, name, mesh, remat)  # one process: the reference, beside the launched ones
    launched = start(tmp_path, name, mesh, remat, "-m", "xdevice", "launch", "--nproc-per-node", str(processes))
    finish(alone)
    finish(launched)
    one = json.loads((tmp_path / "rank0of1.json").read_text())
    ranks = [json.loads((tmp_path / f"rank{rank}of{processes}.json").read_text()) for rank in range(processes)]
    assert len(one["steps"]) == STEPS and one["held"] == {}
    for many in ranks:
        np.testing.assert_allclose(many["steps"], one["steps"], rtol=1e-5)
        assert many["shapes"] == one["shapes"]  # weights() gathers whole arrays
        for key, value in one["params"].items():
            np.testing.assert_allclose(many["params"][key], value, rtol=0, atol=ATOL.get(name, 1e-5), err_msg=key)
        for key, axis in SPLIT[name].items():  # each rank holds its part of a split weight, and of its Adam slots
            part = list(one["shapes"][key])
            if ".attn.qkv." in key:  # held by its parts: [..., 3 * width] -> [..., 3, width]
                part[-1:] = [3, part[-1] // 3]
            part[axis] //= mesh["model"]
            assert many["held"][key] == part, key
            assert many["slots"][f"m/{key}"] == many["slots"][f"v/{key}"] == part, key
        norm = next(k for k in one["shapes"] if "norm" in k)
        assert many["held"][norm] == one["shapes"][norm]  # a layer outside the layout is copied whole
        if name == "bert":  # a vocabulary of 99 has no even split over two: whole on each rank
            assert many["held"]["tokens.weight"] == one["shapes"]["tokens.weight"]
    for rank, many in enumerate(ranks):  # a fused qkv: each rank the same whole heads of q, k and v
        column, model = rank % mesh["model"], mesh["model"]
        for key, local in many["fused"].items():
            saved = np.asarray(many["params"][key]).reshape(one["shapes"][key])
            width = saved.shape[1] // 3
            by_part = saved.reshape(saved.shape[0], 3, width)
            mine = by_part[..., column * width // model : (column + 1) * width // model]  # heads of this column
            np.testing.assert_array_equal(np.asarray(local), mine, err_msg=key)
        # Megatron's exchanges and no others (no weight gathered, no activation moved but the
        # vocabulary-split logits: see exchanges); the data axis's own sums of the gradients
        # (dist.all_reduce: allreduce_) come on top
        forward, step = exchanges(name, remat)
        assert many["forward"] == forward, many["forward"]
        exchanged = {kind: n for kind, n in many["step"].items() if kind != "allreduce_"}
        assert exchanged == step, many["step"]
        assert many["step"].get("allreduce_", 0) == (len(many["held"]) if "data" in mesh else 0), many["step"]
    # what each rank holds of the parameters and Adam's slots is what the memory estimate says
    for measured, layout in [(one, None), *((many, mesh) for many in ranks)]:
        parts = estimate_memory(name, batch=4, backend="torch", measure=False, mesh=layout, **spec(name, remat)).parts
        assert (measured["param_bytes"], measured["slot_bytes"]) == (parts["parameters"], parts["optimizer state"])
    # save gathers too: rank 0 wrote the whole arrays, as one process does
    from safetensors.numpy import load_file

    saved = {f.name: load_file(f) for f in (tmp_path / f"saved{processes}").glob("*.safetensors")}
    whole = {f.name: load_file(f) for f in (tmp_path / "saved1").glob("*.safetensors")}
    assert saved.keys() == whole.keys() and saved
    for file, arrays in whole.items():
        for key, value in arrays.items():
            np.testing.assert_allclose(saved[file][key], value, rtol=0, atol=ATOL.get(name, 1e-5), err_msg=key)


@pytest.mark.parametrize("devices", [["cpu:0", "cpu:1"], None], ids=["two-devices", "no-devices"])
def test_a_model_axis_in_one_process_is_refused_with_the_launch_that_works(devices):
    model = models.build("gpt2", backend="torch", **models.definition("gpt2").SMALL, seed=0)
    with pytest.raises(ConfigurationError) as refused:
        Trainer(model, devices=devices, mesh={"model": 2})
    said = str(refused.value)
    assert "PyTorch splits a model's layers across processes" in said
    assert "xdevice launch --nproc-per-node 2" in said


FIRST_FIT = textwrap.dedent("""
    import json, sys
    import numpy as np
    from torch.distributed.tensor.debug import CommDebugMode
    from xdevice import models, Trainer
    from xdevice.training.launch import world

    model = models.build("gpt2", backend="torch", **json.loads(sys.argv[2]))
    rng = np.random.default_rng(0)
    x = rng.integers(0, model.spec["vocab"], size=(4, 8)).astype("int32")
    trainer = Trainer(model, "cross_entropy", "sgd", lr=1e-3, mesh={"model": 2})
    comm = CommDebugMode()
    with comm:  # the first fit: the output's shape learnt, then one step
        trainer.fit((x, np.roll(x, -1, axis=1).astype("int64")), epochs=1, batch_size=4, verbose=0, seed=0)
    rank, _ = world()
    with open(f"{sys.argv[1]}/rank{rank}.json", "w") as out:
        counts = {str(op).split(".")[-1]: n for op, n in comm.get_comm_counts().items()}
        json.dump({"collectives": counts, "outputs": list(trainer.rules.shape)}, out)
""")


@pytest.mark.multi_device
def test_a_first_fit_learns_the_output_shape_without_gathering_the_split_weights(tmp_path):
    # gpt2 declares no output width: the first fit learns it by shape evaluation on the split
    # weights (fake tensors), so its collectives are the one step's, with no all-gather of the
    # weights nor broadcast of the batch before it: Megatron's four sums per block, the two of
    # the vocabulary-split embedding and its tied head (exchanges), and the logits, split by
    # vocabulary, all-gathered twice: for the loss's log_softmax, and as the step's outputs,
    # which the metrics (accuracy) read whole
    script = tmp_path / "first_fit.py"
    script.write_text(FIRST_FIT)
    launch = [sys.executable, "-m", "xdevice", "launch", "--nproc-per-node", "2"]
    done = subprocess.run(
        [*launch, str(script), str(tmp_path), json.dumps(spec("gpt2"))], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in range(2):
        found = json.loads((tmp_path / f"rank{rank}.json").read_text())
        _, step = exchanges("gpt2", remat=False)
        assert found["collectives"] == {**step, "all_gather_into_tensor": 2}, found["collectives"]
        assert found["outputs"] == [8, models.definition("gpt2").SMALL["vocab"]]
