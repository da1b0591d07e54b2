"""Triton's logging and trace-settings extensions, over Python's ``logging``.

:class:`LogSettings` maps Triton's fields onto the ``xdevice.serving`` logger: ``log_info``,
``log_warning`` and ``log_error`` let that level's records through or drop them,
``log_verbose_level`` > 0 lets DEBUG records through, ``log_format`` (``"default"`` or
``"ISO8601"``) sets how the handlers' formatters write the time; ``log_file`` is reported, and,
as in Triton, a client may not move it (a request must not choose a file the server writes).
:class:`TraceSettings` accepts, checks, stores and reports Triton's trace settings, server-wide
and per model; xdevice writes no traces.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from xdevice._errors import message
from xdevice.serving.protocol import BadRequest

__all__ = ["LogSettings", "TraceSettings"]


class LogSettings(logging.Filter):
    """Triton's log settings, applied to ``logger`` as a filter and its level.

    >>> settings = LogSettings(logging.getLogger("xdevice.doctest"))
    >>> settings.update({"log_info": False})["log_info"]
    False
    """

    _FLAGS = {"log_info": logging.INFO, "log_warning": logging.WARNING, "log_error": logging.ERROR}
    FORMATS = ("default", "ISO8601")

    def __init__(self, logger: logging.Logger):
        super().__init__()
        self.logger = logger
        self.settings: dict[str, Any] = {
            "log_file": "",
            "log_info": True,
            "log_warning": True,
            "log_error": True,
            "log_verbose_level": 0,
            "log_format": "default",
        }
        logger.addFilter(self)

    def get(self) -> dict[str, Any]:
        return dict(self.settings)

    def update(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Apply ``changes`` (any of the fields; each checked before any applies); the settings now."""
        for key, value in changes.items():
            self._check(key, value)
        self.settings.update(changes)
        self.logger.setLevel(logging.DEBUG if self.settings["log_verbose_level"] > 0 else logging.NOTSET)
        self._format(self.settings["log_format"] == "ISO8601")
        return self.get()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.INFO:
            return self.settings["log_verbose_level"] > 0
        level = max((lv for lv in self._FLAGS.values() if lv <= record.levelno), default=logging.INFO)
        flag = next(key for key, lv in self._FLAGS.items() if lv == level)
        return bool(self.settings[flag])

    def close(self) -> None:
        self.logger.removeFilter(self)
        self.logger.setLevel(logging.NOTSET)
        self._format(False)

    def _check(self, key: str, value: Any) -> None:
        if key == "log_file":
            if value != self.settings["log_file"]:
                raise BadRequest(
                    message(
                        "log_file cannot be changed through the protocol (as in Triton)",
                        received=value,
                        fix="send the server's log where it starts (its logging configuration or the shell)",
                    )
                )
        elif key in self._FLAGS:
            if not isinstance(value, bool):
                raise BadRequest(message(f"{key} is true or false", received=value))
        elif key == "log_verbose_level":
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise BadRequest(message("log_verbose_level is a whole number >= 0", received=value))
        elif key == "log_format":
            if value not in self.FORMATS:
                raise BadRequest(message("Unknown log_format", received=value, choices=list(self.FORMATS)))
        else:
            raise BadRequest(message("Unknown log setting", received=key, choices=list(self.settings)))

    def _format(self, iso8601: bool) -> None:
        """Triton's ISO8601 time (UTC, ``2026-01-31T12:00:00Z``) or the default on the
        formatters of the handlers this logger's records reach."""
        logger: logging.Logger | None = self.logger
        while logger is not None:
            for handler in logger.handlers:
                formatter = handler.formatter
                if formatter is None:
                    continue
                for attribute in ("default_time_format", "default_msec_format", "converter"):
                    formatter.__dict__.pop(attribute, None)  # back to the class's defaults
                if iso8601:
                    formatter.default_time_format = "%Y-%m-%dT%H:%M:%S"
                    formatter.default_msec_format = "%s.%03dZ"
                    formatter.converter = time.gmtime  # the documented hook for the time zone
            logger = logger.parent if logger.propagate else None


class TraceSettings:
    """Triton's trace settings, server-wide and per model: checked, stored, reported.

    >>> traces = TraceSettings()
    >>> traces.update({"trace_rate": "10"}, model="cnn")["trace_rate"], traces.get()["trace_rate"]
    ('10', '1000')
    """

    DEFAULTS: dict[str, Any] = {
        "trace_file": "",
        "trace_level": ["OFF"],
        "trace_rate": "1000",
        "trace_count": "-1",
        "log_frequency": "0",
        "trace_mode": "triton",
    }
    LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")

    def __init__(self) -> None:
        self.server = dict(self.DEFAULTS)
        self.models: dict[str, dict[str, Any]] = {}

    def get(self, model: str | None = None) -> dict[str, Any]:
        """The settings in force: the server's, overlaid with ``model``'s own."""
        return {**self.server, **self.models.get(model or "", {})}

    def update(self, changes: dict[str, Any], model: str | None = None) -> dict[str, Any]:
        """Set each setting (None: back to the server's, or for the server to the default)."""
        for key, value in changes.items():
            self._check(key, value)
        target = self.models.setdefault(model, {}) if model else self.server
        for key, value in changes.items():
            if value is None:
                if model:
                    target.pop(key, None)
                else:
                    target[key] = self.DEFAULTS[key]
            else:
                target[key] = [value] if key == "trace_level" and isinstance(value, str) else value
        return self.get(model)

    def _check(self, key: str, value: Any) -> None:
        if key not in self.DEFAULTS:
            raise BadRequest(message("Unknown trace setting", received=key, choices=list(self.DEFAULTS)))
        if value is None:
            return
        if key == "trace_level":
            levels = [value] if isinstance(value, str) else value
            if not isinstance(levels, list) or not levels or any(v not in self.LEVELS for v in levels):
                raise BadRequest(message("Bad trace_level", expected=f"a list of {self.LEVELS}", received=value))
        elif key in ("trace_rate", "trace_count", "log_frequency"):
            if not isinstance(value, str) or not value.lstrip("-").isdigit():
                raise BadRequest(message(f"{key} is a whole number, as a string", received=value))
        elif key == "trace_mode" and value not in ("triton", "opentelemetry"):
            raise BadRequest(message("Unknown trace_mode", received=value, choices=["triton", "opentelemetry"]))
        elif not isinstance(value, str):
            raise BadRequest(message(f"{key} is a string", received=value))
