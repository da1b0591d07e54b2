"""The ``xdevice`` command: ``devices``, ``doctor``; each subcommand is one small function.

>>> main(["devices", "--machine", "--json"])  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import json
import sys

from xdevice import _registry
from xdevice._device import Device
from xdevice._discovery import devices, machine_devices
from xdevice._errors import XDeviceError
from xdevice._types import format_bytes

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="xdevice", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    listing = commands.add_parser("devices", help="one table of devices and which framework sees each")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.add_argument("--machine", action="store_true",
                         help="only what the OS and NVML report (starts no framework)")
    listing.set_defaults(run=_devices)

    checkup = commands.add_parser("doctor", help="check frameworks, devices, ONNX Runtime, CUDA")
    checkup.add_argument("--json", action="store_true", help="print JSON instead of text")
    checkup.set_defaults(run=_doctor)

    check = commands.add_parser("parity", help="run the zoo on every backend against the numpy reference")
    check.add_argument("--models", nargs="+", default=None, metavar="NAME", help="zoo models (default: all)")
    check.add_argument("--backends", nargs="+", default=None, metavar="NAME",
                       help="backends to check (default: every installed one)")
    check.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    check.add_argument("--grads", action=argparse.BooleanOptionalAction, default=None,
                       help="compare every parameter's gradient too (default: in float32 only)")
    check.add_argument("--batch", type=int, default=4)
    form = check.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="print JSON")
    form.add_argument("--markdown", action="store_true", help="print a Markdown table")
    check.set_defaults(run=_parity)

    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except XDeviceError as error:
        print(f"xdevice {args.command}: {type(error).__name__}: {error}", file=sys.stderr)
        return 2


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
    return {"device": str(d), "kind": d.kind, "index": d.index, "name": d.name, "vendor": d.vendor,
            "memory_total": d.memory_total, "memory_free": d.memory_free,
            "compute_capability": list(d.compute_capability) if d.compute_capability else None,
            "backends": list(d.backends)}


def _parity(args: argparse.Namespace) -> int:
    from xdevice import models
    from xdevice._parity import ParityReport, parity

    names = args.models or list(models.NAMES)
    for name in names:
        models.definition(name)  # an unknown name fails before any work
    for name in args.backends or []:
        _registry.backend(name)
    report = ParityReport(dtype=args.dtype)
    for name in names:
        report += parity(name, backends=args.backends, grads=args.grads, dtype=args.dtype,
                         batch=args.batch)
    print(report.to_json() if args.json else report.to_markdown() if args.markdown else report)
    return 0 if report.ok else 1


def _doctor(args: argparse.Namespace) -> int:
    from xdevice._doctor import doctor

    report = doctor()
    print(report.to_json() if args.json else report)
    return 0 if report.healthy else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
