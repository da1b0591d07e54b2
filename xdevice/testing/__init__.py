"""Testing helpers for users' own CI, and the pytest plugin (``xdevice.testing.pytest_plugin``)."""
