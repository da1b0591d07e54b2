"""Testing helpers for users' own CI: parity assertions, the tolerance table, the plugin.

``assert_parity(fn, inputs)`` runs a function written against the op set on every backend
and fails with the backend, tensor, worst index and both values. The pytest plugin
(``xdevice.testing.pytest_plugin``, loaded automatically) adds the ``backend`` and
``device`` fixtures and the ``gpu`` / ``multi_device`` / ``slow`` markers.
"""

from xdevice._tolerance import TOLERANCES, compare
from xdevice.testing._parity import ParityReport, assert_parity, parity

__all__ = ["TOLERANCES", "ParityReport", "assert_parity", "compare", "parity"]
