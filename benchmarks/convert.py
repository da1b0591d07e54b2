"""The conversion matrix, and how fast an imported model runs.

1. ``--parts matrix``: for every model and source framework, export to ONNX (verified), then
   import the ONNX model on torch, tensorflow, jax and numpy and run it in ONNX Runtime; print
   the max abs error of each target against the source framework's own output, the export and
   import times, and ONNX Runtime's speed-up over the source framework's eager forward pass at
   batch 64, measured in the same run (medians).
2. ``--parts speed``: every zoo model exported from each backend and imported back onto the
   same backend, run as a user of that framework runs a model (``imported(x)``: compiled with
   ``jax.jit`` / ``tf.function`` where the backend compiles, PyTorch eager under ``no_grad``),
   against the zoo model run the same way (``zoo.py``'s runner) and against ONNX Runtime on the
   same file, at batch 1 and 32; median (min-max) ms over rounds taken in turns, and the
   ratios imported / zoo and imported / ONNX Runtime (targets: 1.2x and, at batch 32, 1.5x).

3. ``--parts calls``: the same pair (imported and zoo, on their own backend, batch 1 and 32)
   measured so that a loaded machine does not decide the answer: (a) on JAX, the compiled
   programs compared op by op (``jit(...).lower(...).compile().as_text()``, layout-only ops
   such as ``bitcast`` left out): ``same`` or the ops one has more than the other; (b) the
   CPU time of a call (``time.process_time``, which a process waiting for a core does not
   accrue) as the minimum over ``--repeats`` groups of calls taken in turns, for the
   imported model, the zoo model and the imported model's compiled program called directly;
   ``python us``: the Python a call of the imported model runs around its program (the call
   timed with the program stood in for by a function returning its outputs, less that
   function's own call), the one cost the zoo's ``jit(apply)(params, x)`` does not pay.

4. ``--parts realworld``: the real-model suite's cases (``tests/realworld/cases.py``: transformers,
   keras.applications, Flax, equinox; random weights), each exported from its framework and
   imported onto every backend: the import's max error relative to the output's scale, and its
   speed (``imported(x)``, captured) as a ratio to ONNX Runtime on the same file and to the
   source framework running the model itself, at the case's example batch.

Every framework and ONNX Runtime run on ``--threads`` threads. Run:

    .venv/bin/python benchmarks/convert.py [--parts matrix speed calls realworld] [--models cnn] [--sources torch]
                                           [--repeats 20] [--threads 1] [--cases hf-bert keras-lstm-gru]
"""

from __future__ import annotations

import argparse
import collections
import re
import statistics
import time

import numpy as np
from _timing import THREADS_HELP, cell, interleaved, ort_options, pin_threads, ratio_cell

import xdevice
from xdevice import models
from xdevice.converters import export
from xdevice.converters.importer import from_onnx
from xdevice.converters.importer.model import _quick_key

BATCH = 64
TARGETS = ("torch", "tensorflow", "jax", "numpy", "onnxruntime")


def median_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def eager_source(model, source: str):
    """The source framework's own eager forward (no jit, no tf.function)."""
    backend = xdevice.backend(source)
    placed = model.to(source)
    if source == "torch":
        import torch

        module = models.to_native(placed, "torch").eval()

        def run(x):
            with torch.no_grad():
                return module(x)

        return run, backend
    if source == "tensorflow":
        module = models.to_native(placed, "tensorflow")
        return (lambda x: module(x)), backend
    apply_fn, params = models.to_native(model, "jax")
    return (lambda x: apply_fn(params, x)), backend


def round_trips(names: list[str], sources: list[str]):
    """For each zoo model and source framework: ``(name, source, the zoo model on it, backend,
    export result, imported model, zoo runner)``: the model exported from the source and
    imported back onto it."""
    from zoo import zoo_runner

    for name in names:
        model = models.build(name, seed=0)
        for source in sources:
            placed = model.to(source)
            result = export(placed, example_inputs=model.example_input(4))
            imported = from_onnx(result.model, backend=source)
            yield name, source, placed, xdevice.backend(source), result, imported, zoo_runner(placed, source)


def speed(names: list[str], sources: list[str], repeats: int) -> None:
    """Imported onto its own backend against the zoo model and ONNX Runtime (part 2)."""
    import onnxruntime

    print(
        "imported = the zoo model exported from the backend and imported back onto it; ms per call, "
        "median (min-max) of rounds of 10 calls, the sides in a shuffled order each round"
    )
    print(
        f"{'model':<12} {'backend':<11} {'batch':>5} {'imported ms':>20} {'zoo ms':>20} {'ORT ms':>20} "
        f"{'imported/zoo':>18} {'imported/ORT':>18}"
    )
    for name, source, model, backend, result, imported, zoo in round_trips(names, sources):
        session = onnxruntime.InferenceSession(
            result.model.SerializeToString(), ort_options(), providers=["CPUExecutionProvider"]
        )
        feed_name = session.get_inputs()[0].name
        for batch in (1, 32):
            x = model.example_input(batch, seed=1)
            xin = backend.ops.asarray(x)
            to_numpy = backend.ops.to_numpy
            sides = {
                "imported": lambda: to_numpy(imported(xin)),
                "zoo": lambda: to_numpy(zoo(xin)),
                "ort": lambda: session.run(None, {feed_name: x}),
            }
            times = interleaved(sides, samples=repeats, inner=10, warmup=3, budget=20)
            print(
                f"{name:<12} {source:<11} {batch:>5} {cell(times['imported'], 'ms'):>20} "
                f"{cell(times['zoo'], 'ms'):>20} {cell(times['ort'], 'ms'):>20} "
                f"{ratio_cell(times['imported'], times['zoo']):>18} "
                f"{ratio_cell(times['imported'], times['ort']):>18}",
                flush=True,
            )


#: HLO ops that only relabel or pass values (no work): left out when programs are compared
_FREE_OPS = {"parameter", "constant", "bitcast", "tuple", "get-tuple-element", "after-all"}


def _hlo_ops(compiled_text: str) -> collections.Counter:
    """How many of each op a compiled XLA program runs, fused computations' bodies included."""
    found = re.findall(r"=\s*[\w\[\]{},:()\s]*?\s([a-z][a-z0-9\-]*)\(", compiled_text)
    return collections.Counter(op for op in found if op not in _FREE_OPS)


def _compare_programs(mine: collections.Counter, theirs: collections.Counter) -> str:
    """``same``, or the ops one program has more of than the other (``+2 transpose -1 copy``)."""
    more, fewer = mine - theirs, theirs - mine
    if not more and not fewer:
        return "same"
    changes = [f"+{n} {op}" for op, n in sorted(more.items())] + [f"-{n} {op}" for op, n in sorted(fewer.items())]
    return " ".join(changes)


def _cpu_us_per_call(sides: dict, repeats: int, seconds: float = 0.1) -> dict[str, float]:
    """CPU microseconds per call of each side: the minimum over ``repeats`` groups of calls
    (each about ``seconds`` long), the sides taking turns."""
    calls = {}
    for name, fn in sides.items():
        for _ in range(3):
            fn()
        start = time.process_time()
        for _ in range(20):
            fn()
        calls[name] = max(20, int(seconds / max((time.process_time() - start) / 20, 1e-7)))
    best = dict.fromkeys(sides, float("inf"))
    for _ in range(repeats):
        for name, fn in sides.items():
            start = time.process_time()
            for _ in range(calls[name]):
                fn()
            best[name] = min(best[name], (time.process_time() - start) / calls[name] * 1e6)
    return best


def calls(names: list[str], sources: list[str], repeats: int) -> None:
    """Per-call cost of imported against zoo, free of the machine's load (part 3)."""

    print(
        "imported vs zoo, per call: compiled program ops (JAX; layout-only ops left out) and CPU us "
        f"per call (time.process_time, min of {repeats} groups taken in turns; output to numpy each call)"
    )
    print(
        f"{'model':<12} {'backend':<11} {'batch':>5} {'imported us':>11} {'zoo us':>9} {'program us':>10} "
        f"{'python us':>9} {'imported/zoo':>12}  program ops, imported vs zoo"
    )
    for name, source, model, backend, _, imported, zoo in round_trips(names, sources):
        to_numpy = backend.ops.to_numpy
        for batch in (1, 32):
            xin = backend.ops.asarray(model.example_input(batch, seed=1))
            imported(xin)
            # the program a call runs and what it takes (private: what __call__ looks up)
            program = imported._known.get(_quick_key((xin,)))
            if program is None:
                print(f"{name:<12} {source:<11} {batch:>5} not captured: the imported model runs interpreted")
                continue
            weights = imported._weights() if imported._prepare or imported._preparing else imported.params
            sides = {
                "imported": lambda: to_numpy(imported(xin)),
                "zoo": lambda: to_numpy(zoo(xin)),
                "program": lambda: to_numpy(program(weights, xin)[0]),
            }
            best = _cpu_us_per_call(sides, repeats)
            # the Python of a call alone: the program stood in for by a function that returns
            # its outputs, against that function called directly (a few us, so no load hides it)
            outputs = program(weights, xin)
            imported._known[_quick_key((xin,))] = stand_in = lambda w, *xs: outputs
            python = _cpu_us_per_call(
                {"call": lambda: imported(xin), "stand-in": lambda: stand_in(weights, xin)}, repeats, 0.02
            )
            imported._known[_quick_key((xin,))] = program
            ops = "-"
            if source == "jax":
                apply_fn, params = models.to_native(model, "jax")
                zoo_text = jax_compiled_text(apply_fn, params, xin)
                ops = _compare_programs(_hlo_ops(program.lower(weights, xin).compile().as_text()), _hlo_ops(zoo_text))
            print(
                f"{name:<12} {source:<11} {batch:>5} {best['imported']:>11.1f} {best['zoo']:>9.1f} "
                f"{best['program']:>10.1f} {python['call'] - python['stand-in']:>9.2f} "
                f"{best['imported'] / best['zoo']:>11.3f}x  {ops}",
                flush=True,
            )


def jax_compiled_text(apply_fn, params, x) -> str:
    """The compiled XLA program of the zoo model as ``zoo_runner`` runs it (``jax.jit``)."""
    import jax

    return jax.jit(apply_fn).lower(params, x).compile().as_text()


def matrix(names: list[str], sources: list[str], repeats: int) -> None:
    """Errors of every target against the source, and times (part 1)."""
    import onnxruntime

    print(f"max abs error of each target against the source framework (batch {BATCH}); times in seconds;")
    print("ORT speed-up = source eager forward / ONNX Runtime session.run, medians, same run")
    header = f"{'model':<12} {'source':<11} {'export s':>8} " + " ".join(f"{t:>11}" for t in TARGETS)
    print(header + f" {'import s':>8} {'ORT x':>6}")
    for target in TARGETS[:-1]:  # start each framework first: import times are then the import's own
        xdevice.backend(target).ops.to_numpy(xdevice.backend(target).ops.asarray(np.ones(2, np.float32)) * 2)
    for name in names:
        model = models.build(name, seed=0)
        x = model.example_input(BATCH, seed=1)
        for source in sources:
            result = export(model.to(source), example_inputs=x[:8])
            run_source, backend = eager_source(model, source)
            xin = backend.ops.asarray(x)
            expected = backend.ops.to_numpy(run_source(xin))
            errors, import_seconds = [], []
            for target in TARGETS:
                if target == "onnxruntime":
                    session = onnxruntime.InferenceSession(
                        result.model.SerializeToString(), ort_options(), providers=["CPUExecutionProvider"]
                    )
                    feed = {session.get_inputs()[0].name: x}
                    got = session.run(None, feed)[0]
                else:
                    start = time.perf_counter()
                    imported = from_onnx(result.model, backend=target)
                    import_seconds.append(time.perf_counter() - start)
                    got = xdevice.backend(target).ops.to_numpy(imported(x))
                errors.append(float(np.max(np.abs(np.asarray(got, dtype=np.float64) - expected))))
            source_ms = median_ms(lambda: backend.ops.to_numpy(run_source(xin)), repeats)
            ort_ms = median_ms(lambda: session.run(None, feed), repeats)
            print(
                f"{name:<12} {source:<11} {result.seconds:>8.1f} "
                + " ".join(f"{e:>11.1e}" for e in errors)
                + f" {max(import_seconds):>8.2f} {source_ms / ort_ms:>6.1f}",
                flush=True,
            )


def realworld(names: list[str] | None, repeats: int) -> None:
    """The real-model suite's cases: import error and speed against ORT and the source (part 4)."""
    import sys
    from pathlib import Path

    import onnxruntime

    from xdevice.converters.importer import from_onnx

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.realworld.cases import CASES
    from tests.realworld.test_realworld import built, feeds, scaled

    print(
        "real models (random weights) exported from their framework and imported onto each backend; "
        "error relative to the output's scale; ms per call, median of rounds taken in turns"
    )
    print(
        f"{'case':<24} {'backend':<11} {'max rel err':>11} {'imported ms':>12} {'ORT ms':>8} {'source ms':>9} "
        f"{'x ORT':>6} {'x source':>8}"
    )
    for name in names or list(CASES):
        try:
            case, model, inputs, result, expected = built(name)
        except BaseException as error:  # noqa: BLE001 - pytest.skip outside pytest, or a failed export
            print(f"{name:<24} skipped: {type(error).__name__}: {str(error).splitlines()[0][:100]}")
            continue
        session = onnxruntime.InferenceSession(
            result.model.SerializeToString(), ort_options(), providers=["CPUExecutionProvider"]
        )
        ort_feed = dict(zip(inputs.names, inputs))
        source = xdevice.backend(case.framework)
        for target in ("numpy", "torch", "tensorflow", "jax"):
            imported = from_onnx(result.model, backend=target)
            args = [imported.backend.ops.asarray(x) for x in feeds(imported, inputs)]
            got = imported(*args)
            got = got if isinstance(got, tuple) else (got,)
            worst = max(
                scaled(imported.backend.ops.to_numpy(g), e).max_abs / max(min(1.0, float(np.abs(e).max())), 1e-30)
                for g, e in zip(got, expected)
            )
            sides = {
                "imported": lambda: [
                    imported.backend.ops.to_numpy(y)
                    for y in (lambda r: r if isinstance(r, tuple) else (r,))(imported(*args))
                ],
                "ort": lambda: session.run(None, ort_feed),
                "source": lambda: source.native_outputs(model, inputs),
            }
            times = interleaved(sides, samples=repeats, warmup=2, budget=15)
            med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            print(
                f"{name:<24} {target:<11} {worst:>11.1e} {med['imported']:>12.2f} {med['ort']:>8.2f} "
                f"{med['source']:>9.2f} {med['imported'] / med['ort']:>6.2f} {med['imported'] / med['source']:>8.2f}",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--parts", nargs="+", default=["matrix", "speed"], choices=["matrix", "speed", "calls", "realworld"]
    )
    parser.add_argument("--cases", nargs="+", default=None, help="real-model cases (default: all)")
    parser.add_argument("--models", nargs="+", default=list(models.NAMES))
    parser.add_argument(
        "--sources", nargs="+", default=[b for b in ("torch", "tensorflow", "jax") if b in xdevice.backends()]
    )
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    args = parser.parse_args()
    print(pin_threads(args.threads, frameworks=tuple(args.sources)))
    if "matrix" in args.parts:
        matrix(args.models, args.sources, args.repeats)
    if "speed" in args.parts:
        speed(args.models, args.sources, args.repeats)
    if "calls" in args.parts:
        calls(args.models, args.sources, args.repeats)
    if "realworld" in args.parts:
        realworld(args.cases, args.repeats)


if __name__ == "__main__":
    main()
