"""The ONNX node conformance suite (``onnx.backend.test.BackendTest``) on an xdevice backend.

The suite's node tests are built by onnx itself (1,884 in onnx 1.23) and compared with
its own ``assert_similar_outputs``, which also requires the exact output dtypes. JAX
therefore runs with 64-bit types enabled (``Backend.enable_float64``: ``jax_enable_x64``), as ONNX's int64 and double
tests need; that is process-wide, so the JAX suite belongs in its own process (the CLI).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import time
import unittest
import warnings

__all__ = ["Outcome", "run_suite"]


@dataclasses.dataclass
class Outcome:
    """Results of one run: ``status[test] in {pass, fail, error, skip}`` and the reasons."""

    backend: str
    status: dict[str, str]
    reason: dict[str, str]
    seconds: float

    @property
    def counts(self) -> dict[str, int]:
        return dict(collections.Counter(self.status.values()))

    def summary(self) -> str:
        counts = self.counts
        return (
            f"{self.backend}: {counts.get('pass', 0)} passed, {counts.get('fail', 0)} failed, "
            f"{counts.get('error', 0)} errors, {counts.get('skip', 0)} skipped "
            f"of {len(self.status)} node tests ({self.seconds:.0f} s)"
        )


def run_suite(backend: str, pattern: str | None = None, modules: list[str] | None = None) -> Outcome:
    """Run ONNX's node tests (all, or those matching ``pattern``) on ``backend``.

    ONNX builds its node tests when their modules are imported, by running its reference
    implementation: a minute or more for all of them. ``modules`` (names of the files in
    ``onnx/backend/test/case/node``, such as ``conv``) builds only those.

    An ``UnsupportedOp`` counts as an error (the op is not covered); a wrong value, shape
    or dtype counts as a failure.
    """
    from xdevice import _registry

    _registry.backend(backend).enable_float64()  # ONNX's tests use int64 and double throughout
    import numpy as np
    import onnx.backend.test

    from xdevice.converters.onnx_backend import onnx_backend

    suite_backend = onnx_backend(backend)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        # building the cases runs ONNX's reference code, whose overflows and infs are meant
        warnings.simplefilter("ignore", RuntimeWarning)
        with _only_node_modules(modules):
            runner = onnx.backend.test.BackendTest(suite_backend, __name__)
    if pattern:
        runner.include(pattern)
    else:
        runner.include(r"_cpu$")
    cases = runner.test_cases["OnnxBackendNodeModelTest"]
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(cases)
    result = _Collect()
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the suite's own generators warn about overflow they mean
        suite.run(result)
    return Outcome(backend, result.status, result.reason, time.perf_counter() - start)


def node_tests_by_module(modules: list[str]) -> dict[str, list[str]]:
    """The node test names each of ONNX's test-case ``modules`` defines (without ``_cpu``)."""
    import importlib

    from onnx.backend.test.case import node

    found = {}
    for module in modules:
        before = len(node._NodeTestCases)  # a module adds its cases when first imported
        importlib.import_module(f"onnx.backend.test.case.node.{module}")
        found[module] = [case.name for case in node._NodeTestCases[before:]]
    return found


@contextlib.contextmanager
def _only_node_modules(modules: list[str] | None):
    """Make ``BackendTest`` see only the node tests of ``modules`` (all when None).

    ``BackendTest.__init__`` imports every test-case module through the runner's
    ``load_model_tests``; this swaps that one function for the duration of the call.
    """
    if modules is None:
        yield
        return
    import onnx.backend.test.runner as runner_module
    from onnx.backend.test.case import node

    wanted = {name for names in node_tests_by_module(modules).values() for name in names}
    own = runner_module.load_model_tests

    def load(data_dir=None, kind=None):
        if kind == "node":
            return [case for case in node._NodeTestCases if case.name in wanted]
        return own(kind=kind) if data_dir is None else own(data_dir, kind)

    runner_module.load_model_tests = load
    try:
        yield
    finally:
        runner_module.load_model_tests = own


class _Collect(unittest.TestResult):
    """Each CPU test's status; the suite's CUDA twins of every test are not counted."""

    def __init__(self):
        super().__init__()
        self.status: dict[str, str] = {}
        self.reason: dict[str, str] = {}

    def _record(self, test, status: str, reason: str | None = None) -> None:
        name = test.id().rsplit(".", 1)[-1]
        if name.endswith("_cpu"):
            self.status[name.removesuffix("_cpu")] = status
            if reason:
                self.reason[name.removesuffix("_cpu")] = reason

    def addSuccess(self, test):
        self._record(test, "pass")

    def addFailure(self, test, err):
        self._record(test, "fail", _last_line(err))

    def addError(self, test, err):
        self._record(test, "error", _last_line(err))

    def addSkip(self, test, reason):
        if reason != "no matched include pattern":  # not selected: not part of this run
            self._record(test, "skip", reason)


def _last_line(err) -> str:
    kind, value, _ = err
    text = str(value).strip().splitlines()
    return f"{kind.__name__}: {text[0] if text else ''}"[:300]
