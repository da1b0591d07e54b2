"""The ``xdevice`` command: ``devices``, ``doctor``; each subcommand is one small function.

>>> main(["devices", "--machine", "--json"])  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import json
import sys

from xdevice import _quiet, _registry
from xdevice._device import Device
from xdevice._discovery import devices, machine_devices
from xdevice._errors import XDeviceError
from xdevice._progress import progress, step
from xdevice._types import format_bytes

__all__ = ["main", "build_parser"]


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = build_parser().parse_args(argv)
    if args.verbose:
        _quiet.set_verbose()  # frameworks write to stderr untouched, here and in child processes
    else:
        _quiet_frameworks()
    try:
        return args.run(args)
    except XDeviceError as error:
        print(f"xdevice {args.command}: {type(error).__name__}: {error}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand and its flags (deployment manifests are checked against it)."""
    from xdevice import __version__

    parser = argparse.ArgumentParser(
        prog="xdevice",
        description="Devices, parity, ONNX export and import, serving and training on PyTorch, JAX and TensorFlow.",
    )
    parser.add_argument("--version", action="version", version=f"xdevice {__version__}")
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="let the frameworks log as they like (by default their start-up chatter is hidden)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # Every registered backend, installed or not, built in or from the xdevice.backends entry
    # point (read without importing any): one that is not installed, or cannot do what the
    # command asks (numpy has no ONNX exporter), gets xdevice's error saying so and the fix.
    registered = _registry.backends(all=True)

    listing = commands.add_parser("devices", help="one table of devices and which framework sees each")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.add_argument(
        "--machine", action="store_true", help="only what the OS and NVML report (starts no framework)"
    )
    listing.set_defaults(run=_devices)

    checkup = commands.add_parser("doctor", help="check frameworks, devices, ONNX Runtime, CUDA")
    checkup.add_argument("--json", action="store_true", help="print JSON instead of text")
    checkup.set_defaults(run=_doctor)

    check = commands.add_parser("parity", help="run the zoo on every backend against the numpy reference")
    check.add_argument("--models", nargs="+", default=None, metavar="NAME", help="zoo models (default: all)")
    check.add_argument(
        "--backends", nargs="+", default=None, metavar="NAME", help="backends to check (default: every installed one)"
    )
    check.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    check.add_argument(
        "--grads",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compare every parameter's gradient too (default: in float32 only)",
    )
    check.add_argument("--batch", type=int, default=4)
    form = check.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="print JSON")
    form.add_argument("--markdown", action="store_true", help="print a Markdown table")
    check.set_defaults(run=_parity)

    zoo = commands.add_parser("models", help="the reference zoo: each model's input, output and hyper-parameters")
    zoo.add_argument("names", nargs="*", metavar="NAME", help="zoo models to describe (default: all)")
    zoo.set_defaults(run=_models)

    out = commands.add_parser("export", help="export a zoo model to ONNX, checked and verified")
    out.add_argument("model", metavar="MODEL", help="a zoo model name, or a .safetensors file from Model.save")
    out.add_argument(
        "--backend",
        required=True,
        choices=registered,
        type=_backend_name,
        help="the framework whose exporter writes the model",
    )
    out.add_argument("--output", default=None, metavar="PATH", help="where to write it (default: MODEL.onnx)")
    out.add_argument("--opset", type=_opset, default=18, help="the ONNX opset to ask for (default: 18)")
    out.add_argument("--static-batch", action="store_true", help="fix the batch size (default: dynamic)")
    out.add_argument(
        "--dynamic-axis",
        action="append",
        default=[],
        metavar="AXIS=NAME",
        type=_named_axis,
        help="keep another axis of every input symbolic, e.g. 1=seq (repeatable)",
    )
    out.add_argument(
        "--no-verify", action="store_true", help="skip comparing ONNX Runtime's outputs with the framework's"
    )
    out.add_argument("--batch", type=int, default=8, help="the example batch size (default: 8)")
    out.set_defaults(run=_export)

    into = commands.add_parser("convert", help="save an ONNX model in a framework's own format")
    into.add_argument("model", help="path of the .onnx file")
    into.add_argument(
        "--to", required=True, choices=registered, type=_backend_name, help="the framework whose format to write"
    )
    into.add_argument("--output", help="where to write (default: next to the model; the format's suffix added)")
    into.add_argument(
        "--fixed",
        action="append",
        default=[],
        metavar="NAME=SIZE",
        type=_sized_dimension,
        help="fix a symbolic dimension the framework cannot keep free at a size, e.g. seq=128 (repeatable)",
    )
    into.set_defaults(run=_convert)

    suite = commands.add_parser("conformance", help="run ONNX's node test suite on backends")
    suite.add_argument(
        "--backend",
        nargs="+",
        default=None,
        metavar="NAME",
        help="backends to run (default: every installed one, each in its own process)",
    )
    suite.add_argument("--pattern", default=None, help="only tests whose name matches this regex")
    suite.add_argument(
        "--modules",
        nargs="+",
        default=None,
        metavar="MODULE",
        help="only build the tests of these files of onnx/backend/test/case/node "
        "(e.g. conv gemm): ONNX takes minutes to build all of them",
    )
    suite.add_argument("--failures", action="store_true", help="list every test that did not pass, with why")
    suite.add_argument("--json", action="store_true", help="print JSON")
    suite.set_defaults(run=_conformance)

    server = commands.add_parser("serve", help="serve a model repository over KServe V2 (HTTP and gRPC)")
    server.add_argument(
        "repository",
        help="a folder in Triton's layout, REPO/<model>/<version>/model.onnx; or one .onnx file, "
        "served as a model named after the file",
    )
    server.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    server.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    server.add_argument("--grpc-port", type=int, default=8001, help="gRPC port (default 8001; 0: no gRPC)")
    server.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads per model")
    server.add_argument(
        "--device",
        default="cpu",
        help="where models run whose config.pbtxt does not say (KIND_AUTO or no instance_group): "
        "cpu (default) or gpu:N",
    )
    server.add_argument(
        "--memory-limit",
        default=None,
        help="GPU memory each model's ONNX Runtime session may use, e.g. 8GiB (its gpu_mem_limit; "
        "xdevice.configure(memory_limit=...))",
    )
    server.add_argument(
        "--exit-on-error",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="exit when a model fails to load (default); --no-exit-on-error serves the others",
    )
    server.add_argument(
        "--strict-readiness",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ready only when every model is (default)",
    )
    server.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="what the server logs (default info: each model's load, failures with reasons)",
    )
    server.add_argument("--access-log", action="store_true", help="also log every HTTP request")
    server.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        help="seconds a client has to send its request headers (default 10)",
    )
    server.add_argument(
        "--shutdown-timeout",
        type=float,
        default=10.0,
        help="on SIGTERM/SIGINT, seconds the requests in flight get to finish before the server exits (default 10)",
    )
    server.set_defaults(run=_serve)

    sizing = commands.add_parser(
        "estimate-memory",
        help="memory per device to train a zoo model: arithmetic "
        "and the framework's own measurement, against the device or its limit",
    )
    sizing.add_argument("model", metavar="MODEL", help="a zoo model name (xdevice models lists them)")
    sizing.add_argument("--batch", type=int, required=True, help="rows per device")
    sizing.add_argument("--optimizer", default="adam", choices=["sgd", "momentum", "adam", "adamw"])
    sizing.add_argument(
        "--precision", default="float32", type=_precision, help="float32, bfloat16 (bf16) or float16 (fp16)"
    )
    sizing.add_argument(
        "--backend",
        default="jax",
        choices=registered,
        type=_backend_name,
        help="the framework that measures (default jax: XLA's memory_analysis)",
    )
    sizing.add_argument("--device", default="cpu", help="the device to fit (default cpu)")
    sizing.add_argument(
        "--strategy",
        default="replicate",
        choices=["replicate", "fsdp"],
        help="data parallel: every device holds the whole model (replicate), or a shard of it (fsdp)",
    )
    sizing.add_argument("--devices", type=int, default=1, help="how many devices the training spans (default 1)")
    sizing.add_argument(
        "--mesh",
        type=_mesh,
        default=None,
        help="the devices as a grid, e.g. data=2,model=2: transformer layers split over 'model' (tensor parallel)",
    )
    sizing.add_argument(
        "--remat",
        action="store_true",
        help="recompute each block's activations in the backward pass (bert, gpt2, llama, vit, resnet50)",
    )
    sizing.add_argument("--json", action="store_true", help="print JSON")
    sizing.set_defaults(run=_estimate_memory)

    starter = commands.add_parser(
        "launch",
        help="start N training processes, each set up for every installed framework (torchrun's agent); "
        "inside a Kubeflow TrainJob, PyTorchJob, TFJob or JAXJob or a Slurm step, joins it with no flags",
    )
    starter.add_argument(
        "--nproc-per-node", type=int, default=None, help="processes on this machine (default: the job's, else 1)"
    )
    starter.add_argument(
        "--nnodes",
        default=None,
        help="machines taking part: N, or MIN:MAX for an elastic run (default: the job's, else 1)",
    )
    starter.add_argument(
        "--max-restarts", type=int, default=0, help="restart the group this many times when a worker fails (default 0)"
    )
    starter.add_argument(
        "--rdzv-backend", default=None, help="torchrun's rendezvous (default c10d; static inside a cluster job)"
    )
    starter.add_argument("--rdzv-id", default=None, help="the run's id, the same on every node")
    starter.add_argument(
        "--node-rank", type=int, default=None, help="this machine's number (static rendezvous; default: the job's)"
    )
    starter.add_argument(
        "--master-addr",
        default=None,
        help="node 0's address, the rendezvous endpoint (default: the job's, else 127.0.0.1)",
    )
    starter.add_argument(
        "--master-port",
        type=int,
        default=None,
        help="the rendezvous port on node 0 (default: the job's, else a free one, one node only)",
    )
    starter.add_argument("--log-dir", default=None, help="write each rank's stdout and stderr under this folder")
    starter.add_argument("script", help="the training script")
    starter.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
    starter.set_defaults(run=_launch)
    return parser


def _devices(args: argparse.Namespace) -> int:
    rows = machine_devices()
    names = _registry.backends()
    if not args.machine:
        rows = _with_framework_views(rows, names)
    if args.json:
        print(json.dumps([_as_dict(d) for d in rows], indent=2))
        return 0
    table = [["DEVICE", "NAME", "MEMORY FREE / TOTAL", *names]]
    for d in rows:
        memory = f"{format_bytes(d.memory_free)} / {format_bytes(d.memory_total)}"
        table.append([str(d), d.name or "-", memory, *("yes" if n in d.backends else "-" for n in names)])
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    if args.machine:
        print("(backends: installed builds that support the device; frameworks not asked)")
    return 0


def _with_framework_views(rows: list[Device], names: list[str]) -> list[Device]:
    """Machine devices, plus virtual ones, marked with the frameworks that really see them."""
    seen: dict[Device, list[str]] = {}
    facts = {d: d for d in rows}
    for name in names:
        for found in devices(backend=name):
            seen.setdefault(found, []).append(name)
            facts.setdefault(found, found)
    return [facts[d].with_facts(backends=tuple(seen.get(d, []))) for d in facts]


def _as_dict(d: Device) -> dict:
    return {
        "device": str(d),
        "kind": d.kind,
        "index": d.index,
        "name": d.name,
        "vendor": d.vendor,
        "memory_total": d.memory_total,
        "memory_free": d.memory_free,
        "compute_capability": list(d.compute_capability) if d.compute_capability else None,
        "backends": list(d.backends),
    }


def _backend_name(value: str) -> str:
    """A backend name as typed; an alias (``tf``) or a device word gets the registry's
    message, with the name meant, instead of argparse's bare "invalid choice"."""
    if value in _registry.backends(all=True):
        return value
    raise argparse.ArgumentTypeError(_registry.unknown(value).replace("Fix: pass '", "Fix: give '"))


def _models(args: argparse.Namespace) -> int:
    from xdevice import models

    print("\n\n".join(models.describe(name) for name in args.names) if args.names else models.describe())
    return 0


def _parity(args: argparse.Namespace) -> int:
    from xdevice import models
    from xdevice.testing import ParityReport, parity

    names = args.models or list(models.NAMES)
    for name in names:
        models.definition(name)  # an unknown name fails before any work
    for name in args.backends or []:
        _registry.backend(name)
    report = ParityReport(dtype=args.dtype)
    for name in progress(names, "parity"):
        report += parity(name, backends=args.backends, grads=args.grads, dtype=args.dtype, batch=args.batch)
    print(report.to_json() if args.json else report.to_markdown() if args.markdown else report)
    return 0 if report.ok else 1


def _quiet_frameworks() -> None:
    """Hide the frameworks' start-up chatter (TensorFlow's C++ and absl logs, XLA's), unless
    the user set those levels already or passed --verbose."""
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    os.environ.setdefault("GLOG_minloglevel", "3")


def _opset(text: str) -> int:
    """An ONNX opset the installed onnx knows (7 up to its newest): checked before any export."""
    from onnx.defs import onnx_opset_version

    newest = onnx_opset_version()
    if not text.isdigit() or not 7 <= int(text) <= newest:
        raise argparse.ArgumentTypeError(
            f"expected an ONNX opset from 7 to {newest} (the installed onnx's newest), got {text!r}"
        )
    return int(text)


def _named_axis(text: str) -> tuple[int, str]:
    axis, _, name = text.partition("=")
    if not axis.strip().lstrip("-").isdigit() or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"expected AXIS=NAME such as 1=seq, got {text!r}")
    return int(axis), name


def _sized_dimension(text: str) -> tuple[str, int]:
    name, _, size = text.partition("=")
    if not name.isidentifier() or not size.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected NAME=SIZE such as seq=128, got {text!r}")
    return name, int(size)


def _precision(text: str) -> str:
    names = {
        "float32": "float32",
        "fp32": "float32",
        "bfloat16": "bfloat16",
        "bf16": "bfloat16",
        "float16": "float16",
        "fp16": "float16",
    }
    if text not in names:
        raise argparse.ArgumentTypeError(f"expected float32, bfloat16 (bf16) or float16 (fp16), got {text!r}")
    return names[text]


def _mesh(text: str) -> dict[str, int]:
    """``data=2,model=2`` as ``{"data": 2, "model": 2}`` (the names are checked where it is used).

    >>> _mesh("data=2,model=2"), _mesh("model=4")
    ({'data': 2, 'model': 2}, {'model': 4})
    """
    try:
        return {name.strip(): int(size) for name, size in (part.split("=") for part in text.split(","))}
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a mesh: write it as data=2,model=2") from None


def _estimate_memory(args: argparse.Namespace) -> int:
    from xdevice.training.memory import estimate_memory

    step(f"estimating {args.model} at batch {args.batch} on {args.backend}")
    estimate = estimate_memory(
        args.model,
        batch=args.batch,
        optimizer=args.optimizer,
        precision=args.precision,
        backend=args.backend,
        device=args.device,
        strategy=args.strategy,
        devices=args.devices,
        mesh=args.mesh,
        **({"remat": True} if args.remat else {}),  # a spec field: only the real-scale models take it
    )
    print(json.dumps(estimate.as_dict(), indent=2) if args.json else estimate)
    return 0 if estimate.fits is not False else 1


def _export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from xdevice import models
    from xdevice.converters import export

    if args.model.endswith(".safetensors"):
        model, stem = models.load(args.model, backend=args.backend), Path(args.model).stem
    else:
        model, stem = models.build(args.model, backend=args.backend), args.model
    step(f"exporting {model.name} from {args.backend} and verifying it in ONNX Runtime")
    result = export(
        model,
        args.output or f"{stem}.onnx",
        example_inputs=model.example_input(args.batch),
        opset=args.opset,
        dynamic_batch=not args.static_batch,
        dynamic_axes=dict(args.dynamic_axis),
        verify=not args.no_verify,
    )
    print(f"{model.name}: {result}")
    return 0


def _convert(args: argparse.Namespace) -> int:
    from xdevice.converters.formats import convert_model

    step(f"converting {args.model} to {args.to}'s own format")
    result = convert_model(args.model, args.to, args.output, fixed=dict(args.fixed))
    batch = "dynamic batch" if result.dynamic_batch else "fixed batch"
    print(f"wrote {result.path} ({args.to}, {batch}, {result.seconds:.1f} s)")
    for name, dtype, shape in result.inputs:
        print(f"  input {name}: {dtype} {['?' if d is None else d for d in shape]}")
    if result.note:
        print(f"  note: {result.note}")
    return 0


def _conformance(args: argparse.Namespace) -> int:
    import subprocess

    names = args.backend or _registry.backends()
    if len(names) > 1:  # one process per backend: JAX's suite needs 64-bit types process-wide
        status = 0
        for name in progress(names, "conformance"):
            command = [sys.executable, "-m", "xdevice", "conformance", "--backend", name]
            command += (
                (["--pattern", args.pattern] if args.pattern else [])
                + (["--modules", *args.modules] if args.modules else [])
                + (["--failures"] if args.failures else [])
                + (["--json"] if args.json else [])
            )
            status |= subprocess.run(command).returncode
        return status
    from xdevice.converters.conformance import run_suite

    _registry.backend(names[0])
    outcome = run_suite(names[0], pattern=args.pattern, modules=args.modules)
    if args.json:
        print(
            json.dumps(
                {
                    "backend": outcome.backend,
                    "counts": outcome.counts,
                    "seconds": outcome.seconds,
                    "status": outcome.status,
                    "reason": outcome.reason,
                }
            )
        )
        return 0
    print(outcome.summary())
    if args.failures:
        for test, state in sorted(outcome.status.items()):
            if state != "pass":
                print(f"  {state:<5} {test}: {outcome.reason.get(test, '')}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT (exit 0 once drained); a port in use: one line, exit 2."""
    import logging

    from xdevice.serving.server import PortTaken, serve

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.memory_limit is not None:
        import xdevice

        xdevice.configure(memory_limit=args.memory_limit)  # ORT sessions read it (gpu_mem_limit)
    try:
        serve(
            args.repository,
            device=args.device,
            host=args.host,
            port=args.port,
            grpc_port=args.grpc_port,
            threads=args.threads,
            exit_on_error=args.exit_on_error,
            strict_readiness=args.strict_readiness,
            access_log=args.access_log,
            header_timeout=args.header_timeout,
            log_level=args.log_level,
            shutdown_timeout=args.shutdown_timeout,
        )
    except PortTaken as taken:
        print(f"xdevice serve: {taken}", file=sys.stderr)
        return 2
    return 0


def _launch(args: argparse.Namespace) -> int:
    from xdevice.training.launch import launch, with_cluster

    given = {
        name: getattr(args, name)
        for name in ("nproc_per_node", "nnodes", "node_rank", "master_addr", "master_port", "rdzv_backend")
    }
    options, job = with_cluster(given)  # the cluster job's settings where no flag was given
    if job is not None:
        print(f"xdevice launch: joined {job.describe()}", file=sys.stderr, flush=True)
    nproc_per_node = options.pop("nproc_per_node")
    return launch(
        args.script,
        args.script_args,
        nproc_per_node,
        **options,
        max_restarts=args.max_restarts,
        rdzv_id=args.rdzv_id,
        log_dir=args.log_dir,
    )


def _doctor(args: argparse.Namespace) -> int:
    from xdevice._doctor import doctor

    report = doctor()
    print(report.to_json() if args.json else report)
    return 0 if report.healthy else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
