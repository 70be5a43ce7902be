"""Logging: the ``adaptive_eager`` logger, one-time warnings, and ``ADAPTIVE_EAGER_LOG``.

The runtime logs through the standard :mod:`logging` module, under the logger named
``"adaptive_eager"``: flush, compile, fallback and demotion events at DEBUG, things a
user should act on at WARNING (each at most once per process, see :func:`warn_once`).
Nothing is printed unless the program configures logging, or sets
``ADAPTIVE_EAGER_LOG=debug`` (or ``info``, ``warning``, ``error``), which adds one
stderr handler to that logger.

Example::

    >>> import logging
    >>> logging.getLogger("adaptive_eager").setLevel(logging.DEBUG)  # or ADAPTIVE_EAGER_LOG=debug
    >>> warn_once("demo", "shown once")
    >>> warn_once("demo", "shown once")  # silent: same key
"""

from __future__ import annotations

import logging
import os
import threading

LOGGER_NAME = "adaptive_eager"
ENV_VAR = "ADAPTIVE_EAGER_LOG"
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "warn": logging.WARNING, "error": logging.ERROR}
LEVEL_NAMES = tuple(_LEVELS)

log = logging.getLogger(LOGGER_NAME)

# Note [Logging registries]
# _WARNED (keys already warned about) and _HANDLER (the handler added for
# ADAPTIVE_EAGER_LOG) are this module's only state: a set that only grows, and at
# most one handler, so configuring twice never doubles the output.
_WARNED: set[str] = set()
_WARNED_LOCK = threading.Lock()
_HANDLER: logging.Handler | None = None


def warn_once(key: str, message: str, *args: object) -> None:
    """Log ``message`` at WARNING the first time ``key`` is seen in this process."""
    with _WARNED_LOCK:
        if key in _WARNED:
            return
        _WARNED.add(key)
    log.warning(message, *args)


def configure_from_env(environ: os._Environ | dict | None = None) -> None:
    """Add a stderr handler at the level named by ``ADAPTIVE_EAGER_LOG`` (once).

    Unset or empty: nothing changes. An unknown level name is reported once and ignored
    (logging must never stop a program).
    """
    global _HANDLER
    environ = os.environ if environ is None else environ
    value = environ.get(ENV_VAR, "").strip().lower()
    if not value or value in ("0", "off", "none"):
        return
    level = _LEVELS.get(value)
    if level is None:
        warn_once("bad-log-level", "adaptive_eager: %s=%r is not a level; use one of %s",
                  ENV_VAR, value, ", ".join(sorted(_LEVELS)))
        return
    log.setLevel(level)
    if _HANDLER is None:
        _HANDLER = logging.StreamHandler()
        _HANDLER.setFormatter(logging.Formatter("[adaptive_eager %(levelname)s] %(message)s"))
        log.addHandler(_HANDLER)
    _HANDLER.setLevel(level)


__all__ = ["LOGGER_NAME", "ENV_VAR", "LEVEL_NAMES", "log", "warn_once", "configure_from_env"]
