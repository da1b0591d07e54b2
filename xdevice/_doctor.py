"""``xdevice doctor``: is this install healthy, and if not, what is the fix?

Gathering facts (importing frameworks, opening ONNX Runtime sessions) is kept apart from
judging them (pure functions over those facts), so every judgement is testable with facts
this machine cannot produce, such as a broken CUDA install.

What it checks: each framework imports and which devices it sees; a GPU the machine has
but a GPU build of a framework does not see; ONNX Runtime providers that really load (ONNX
Runtime lists CUDA as available even when its libraries are missing, then runs on the CPU
with only a log line); ``onnxruntime`` and ``onnxruntime-gpu`` installed together (they
overwrite each other's files); the versions of the ONNX export tools (onnx, onnxscript,
tf2onnx, jax2onnx); the CUDA driver and cuDNN that frameworks will find; the float32 matmul
precision and determinism in effect in each framework, read back from its own getters, beside
each GPU's compute capability (TF32 exists from 8.0, Ampere, on).

The doctor starts every framework, and then ONNX Runtime's CUDA provider, in one process: before
the first one starts it sets the environment that lets them share one GPU
(``xdevice._sharing``: JAX and TensorFlow grow on demand instead of pre-allocating it), keeping
any value the user set. A CUDA session that still fails for want of GPU memory is reported as
out of memory, with ONNX Runtime's own text, not as missing libraries.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys

from xdevice import _onnxruntime, _registry, _sharing
from xdevice._device import Device
from xdevice._discovery import _distributions, devices, nvml_gpus

__all__ = [
    "Finding",
    "DoctorReport",
    "doctor",
    "onnxruntime_conflict",
    "provider_findings",
    "gpu_findings",
    "sharing_findings",
    "out_of_memory",
    "export_tools",
    "numerics_findings",
]

_ALWAYS_THERE = ("CPUExecutionProvider", "AzureExecutionProvider")


@dataclasses.dataclass(frozen=True)
class Finding:
    """One observation; ``ok=False`` makes it a problem, and a problem carries its fix."""

    topic: str
    ok: bool
    text: str
    fix: str | None = None


@dataclasses.dataclass
class DoctorReport:
    findings: list[Finding]

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if not f.ok]

    @property
    def healthy(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        lines, topic = [], None
        for finding in self.findings:
            if finding.topic != topic:
                topic = finding.topic
                lines.append(f"{topic}:")
            lines.append(f"  {'ok ' if finding.ok else 'BAD'}  {finding.text}")
            if finding.fix:
                lines.append(f"       fix: {finding.fix}")
        count = len(self.problems)
        lines.append("healthy" if not count else f"{count} problem{'s' * (count > 1)} found")
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(
            {"healthy": self.healthy, "findings": [dataclasses.asdict(f) for f in self.findings]}, indent=2
        )


def doctor() -> DoctorReport:
    """Check frameworks, devices, ONNX Runtime and CUDA; every problem comes with a fix.

    Imports every installed framework and starts their runtimes, which first share the GPU:
    see :mod:`xdevice._sharing` (the environment variables are set in this process).
    """
    shared = _sharing.apply_sharing_defaults(started=_started_runtimes())
    _distributions.cache_clear()  # the doctor reads what is installed now
    dists = _distributions()
    gpus = nvml_gpus()
    findings: list[Finding] = []
    seen: dict[str, int] = {}
    numerics: dict[str, dict[str, object]] = {}
    for name in _registry.backends(all=True):
        if not _registry.is_installed(name):
            findings.append(
                Finding("frameworks", True, f"{name}: not installed (optional: {_registry.pip_line(name)})")
            )
            continue
        try:
            backend = _registry.backend(name)
            found = devices(backend=name)
        except Exception as error:  # noqa: BLE001 - a broken install must not stop the other checks
            findings.append(
                Finding(
                    "frameworks", False, f"{name}: fails to load: {error}", f"reinstall it: {_registry.pip_line(name)}"
                )
            )
            continue
        if backend.supports_gpu:
            seen[name] = sum(d.kind == "gpu" for d in found)
        numerics[name] = backend.numerics()
        findings.append(
            Finding("frameworks", True, f"{name} {backend.version()}: sees " + ", ".join(str(d) for d in found))
        )
    findings += gpu_findings(len(gpus), seen, {name: _registry.gpu_build(name) for name in seen})
    findings += sharing_findings(shared, len(gpus))
    findings += numerics_findings(numerics, gpus)
    findings += onnxruntime_conflict(dists)
    findings += _onnxruntime_providers()
    findings += export_tools(dists)
    findings += _cuda(gpus)
    return DoctorReport(findings)


# -- judgements: pure functions of facts ------------------------------------------------------


def gpu_findings(machine_gpus: int, seen: dict[str, int], gpu_build: dict[str, bool]) -> list[Finding]:
    """GPUs the machine has against those each framework sees."""
    if not machine_gpus:
        return [Finding("devices", True, "no NVIDIA GPU on this machine: everything runs on the CPU")]
    findings = []
    for name, count in seen.items():
        if count:
            findings.append(Finding("devices", True, f"{name} sees {count} of {machine_gpus} GPUs"))
        elif gpu_build.get(name):
            findings.append(
                Finding(
                    "devices",
                    False,
                    f"{name} is a GPU build but sees none of the {machine_gpus} GPUs",
                    "check CUDA_VISIBLE_DEVICES and that the CUDA libraries this build needs are installed",
                )
            )
        else:
            findings.append(
                Finding(
                    "devices",
                    False,
                    f"{name} is a CPU-only build on a machine with {machine_gpus} GPUs",
                    "install its CUDA build (`make` does this on a GPU machine)",
                )
            )
    return findings


def sharing_findings(shared: dict[str, str], machine_gpus: int) -> list[Finding]:
    """What the doctor set so that the frameworks it starts share the GPU (nothing without one).

    >>> sharing_findings({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, 1)[0].text
    'the frameworks checked here share the GPU: the doctor set XLA_PYTHON_CLIENT_PREALLOCATE=false'
    """
    if not (shared and machine_gpus):
        return []
    settings = ", ".join(f"{name}={value}" for name, value in shared.items())
    return [Finding("devices", True, f"the frameworks checked here share the GPU: the doctor set {settings}")]


def numerics_findings(numerics: dict[str, dict[str, object]], gpus: list[Device]) -> list[Finding]:
    """The precision and determinism each framework reports (``Backend.numerics``), and each
    GPU's compute capability: TF32, which "high" and "medium" allow, exists from 8.0 on.

    >>> numerics_findings({"jax": {"matmul_precision": "highest", "deterministic": False}}, [])[0].text
    'jax: matmul precision highest, deterministic off'
    """
    findings = []
    for name, found in numerics.items():
        extra = ", ".join(f"{k} {v}" for k, v in found.items() if k not in ("matmul_precision", "deterministic"))
        text = f"{name}: matmul precision {found.get('matmul_precision')}, deterministic "
        text += "on" if found.get("deterministic") else "off"
        findings.append(Finding("numerics", True, text + (f" ({extra})" if extra else "")))
    for gpu in gpus:
        capability = gpu.compute_capability
        if capability is None:
            tf32 = "compute capability unknown"
        else:
            tf32 = f"compute capability {capability[0]}.{capability[1]}: " + (
                "TF32 available, so 'high' and 'medium' change float32 products"
                if capability >= (8, 0)
                else "no TF32, float32 products stay IEEE float32 at every precision"
            )
        findings.append(Finding("numerics", True, f"{gpu} {gpu.name or ''}".rstrip() + f": {tf32}"))
    return findings


def onnxruntime_conflict(dists: dict[str, str]) -> list[Finding]:
    """``onnxruntime`` and ``onnxruntime-gpu`` share one import package; both at once break it.

    >>> onnxruntime_conflict({"onnxruntime": "1.31.1", "onnxruntime-gpu": "1.31.1"})[0].ok
    False
    """
    present = [d for d in ("onnxruntime", "onnxruntime-gpu") if d in dists]
    if len(present) == 2:
        return [
            Finding(
                "onnxruntime",
                False,
                f"both onnxruntime {dists['onnxruntime']} and onnxruntime-gpu {dists['onnxruntime-gpu']} "
                "are installed; they overwrite each other's files (jax2onnx pulls in onnxruntime)",
                "pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime-gpu",
            )
        ]
    if present:
        return [Finding("onnxruntime", True, f"{present[0]} {dists[present[0]]} installed")]
    return [Finding("onnxruntime", True, "not installed (optional: pip install 'xdevice[onnx]')")]


#: the ONNX tools export needs, and what each one does there
_EXPORT_TOOLS = {
    "onnx": "the format, checker and shape inference",
    "onnxscript": "PyTorch's exporter",
    "tf2onnx": "TensorFlow's exporter",
    "jax2onnx": "JAX's exporter",
}


def export_tools(dists: dict[str, str]) -> list[Finding]:
    """The versions of the ONNX export tools, from package metadata (none is imported).

    >>> export_tools({"onnx": "1.23.0"})[0].text
    'onnx 1.23.0: the format, checker and shape inference'
    """
    return [
        Finding(
            "onnx export",
            True,
            f"{name} {dists[name]}: {role}"
            if name in dists
            else f"{name}: not installed, needed for {role} (pip install 'xdevice[export]')",
        )
        for name, role in _EXPORT_TOOLS.items()
    ]


#: how the CUDA runtime, cuBLAS, cuDNN and ONNX Runtime's arena say that GPU memory ran out
_OUT_OF_MEMORY = re.compile(
    r"out of memory|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|STATUS_ALLOC_FAILED|Failed to allocate",
    re.IGNORECASE,
)


def out_of_memory(error: str) -> bool:
    """Whether an error's text says the GPU ran out of memory.

    >>> out_of_memory("CUDA failure 2: out of memory ; GPU=0 ; expr=cudaMalloc(&p, bytes)")
    True
    >>> out_of_memory("Failed to load library libonnxruntime_providers_cuda.so")
    False
    """
    return _OUT_OF_MEMORY.search(error) is not None


def provider_findings(
    listed: list[str], in_use: dict[str, list[str]], errors: dict[str, str] | None = None
) -> list[Finding]:
    """Providers ONNX Runtime lists against those a real session actually used.

    Args:
        listed: ``onnxruntime.get_available_providers()``.
        in_use: for each provider tried, ``session.get_providers()`` of a session asked for it.
        errors: for each provider whose session could not be created, the error's text.

    >>> provider_findings(["CUDAExecutionProvider", "CPUExecutionProvider"],
    ...                   {"CUDAExecutionProvider": ["CPUExecutionProvider"]})[0].ok
    False
    >>> provider_findings(["CUDAExecutionProvider"], {"CUDAExecutionProvider": []},
    ...                   {"CUDAExecutionProvider": "CUDA failure 2: out of memory"})[0].text
    'CUDAExecutionProvider could not start a session: the GPU is out of memory (CUDA failure 2: out of memory)'
    """
    errors = errors or {}
    findings = []
    for provider in listed:
        if provider in _ALWAYS_THERE:
            continue
        used = in_use.get(provider, [])
        error = errors.get(provider)
        if provider in used:
            findings.append(Finding("onnxruntime", True, f"{provider} loads and runs"))
        elif error is not None and out_of_memory(error):
            findings.append(
                Finding(
                    "onnxruntime",
                    False,
                    f"{provider} could not start a session: the GPU is out of memory ({error})",
                    "free GPU memory: other processes (nvidia-smi lists them), or frameworks in the same process "
                    "that pre-allocate it (JAX takes 75% as it starts, TensorFlow the rest): let them grow on "
                    "demand with xdevice.configure(memory_growth=True) before they start",
                )
            )
        elif error is not None:
            findings.append(
                Finding(
                    "onnxruntime",
                    False,
                    f"{provider} could not start a session: {error}",
                    "install the CUDA and cuDNN versions this onnxruntime-gpu needs "
                    "(see `pip show onnxruntime-gpu`), e.g. pip install 'onnxruntime-gpu[cuda,cudnn]'",
                )
            )
        else:
            findings.append(
                Finding(
                    "onnxruntime",
                    False,
                    f"{provider} is listed as available but a session asked for it ran on "
                    f"{', '.join(used) or 'nothing'}: its libraries (CUDA, cuDNN) did not load",
                    "install the CUDA and cuDNN versions this onnxruntime-gpu needs "
                    "(see `pip show onnxruntime-gpu`), e.g. pip install 'onnxruntime-gpu[cuda,cudnn]'",
                )
            )
    if "CPUExecutionProvider" in in_use:
        findings.insert(
            0,
            Finding(
                "onnxruntime",
                "CPUExecutionProvider" in in_use["CPUExecutionProvider"],
                "CPUExecutionProvider loads and runs",
            ),
        )
    return findings


# -- facts that need the real thing ---------------------------------------------------------


def _onnxruntime_providers() -> list[Finding]:
    if not (_registry.is_installed("onnxruntime") and _registry.is_installed("onnx")):
        return []
    import onnxruntime

    listed = onnxruntime.get_available_providers()
    model = _identity_model()
    in_use, errors = {}, {}
    # as xdevice's own sessions do: the CUDA and cuDNN libraries pip installed are found only
    # once preloaded, so a provider that serving would load is not reported as broken
    _onnxruntime.preload_dlls(Device("gpu", 0), ort=onnxruntime)
    for provider in listed:
        if provider == "AzureExecutionProvider":
            continue
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 4  # the fallback is reported here, not as log noise
        try:
            wanted = list(dict.fromkeys([provider, "CPUExecutionProvider"]))
            # no retry on the CPU (ORT prints it to stdout): the failure is what is reported
            session = onnxruntime.InferenceSession(model, options, providers=wanted, enable_fallback=0)
            in_use[provider] = session.get_providers()
        except Exception as error:  # noqa: BLE001 - a provider that cannot start is what we look for
            in_use[provider] = []
            errors[provider] = " ".join(str(error).split())
    return provider_findings(listed, in_use, errors)


def _started_runtimes() -> list[str]:
    """Frameworks whose runtime already started in this process (the doctor called from a
    program, not the command); one never imported has not started."""
    started = []
    for name in _registry.backends():
        if name in sys.modules:
            try:
                if _registry.backend(name).runtime_started():
                    started.append(name)
            except Exception:  # noqa: BLE001 - the framework checks report a broken install
                continue
    return started


def _identity_model() -> bytes:
    from onnx import TensorProto, helper

    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "doctor", [value], [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def _cuda(gpus: list[Device]) -> list[Finding]:
    if not gpus:
        return []
    findings = []
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetCudaDriverVersion()
        findings.append(Finding("cuda", True, f"CUDA driver supports CUDA {driver // 1000}.{driver % 1000 // 10}"))
        pynvml.nvmlShutdown()
    except Exception as error:  # noqa: BLE001 - any NVML failure is reported, not raised
        findings.append(
            Finding("cuda", False, f"NVML could not report the CUDA driver: {error}", "install the NVIDIA driver")
        )
    cudnn = [f"{d} {v}" for d, v in _distributions().items() if d.startswith("nvidia-cudnn")]
    if cudnn:
        findings.append(Finding("cuda", True, "cuDNN from pip: " + ", ".join(cudnn)))
    else:
        with_version = _cudnn_through_frameworks()
        findings.append(
            Finding(
                "cuda",
                with_version is not None,
                f"cuDNN: {with_version or 'not found'}",
                None if with_version else "pip install nvidia-cudnn-cu12 (or -cu13)",
            )
        )
    return findings


def _cudnn_through_frameworks() -> str | None:
    """cuDNN as a framework already loaded by the doctor found it (``Backend.gpu_libraries``)."""
    for backend in _registry.loaded_backends():
        version = backend.gpu_libraries().get("cudnn")
        if version:
            return f"{version} (through {backend.name})"
    return None
