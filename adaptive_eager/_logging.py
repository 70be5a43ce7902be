"""Logging: the ``adaptive_eager`` logger, its torch artifacts, and ``ADAPTIVE_EAGER_LOG``.

The runtime logs through the standard :mod:`logging` module, under the logger named
``"adaptive_eager"``: events at DEBUG, things a user should act on at WARNING (each at
most once per process, see :func:`warn_once`). Events go to artifact loggers registered
with ``torch._logging`` (:data:`ARTIFACTS`), children of ``adaptive_eager``, so they are
switched on the PyTorch way or this package's way:

- ``TORCH_LOGS=+adaptive_eager`` (every event), ``TORCH_LOGS=ae_compiles,ae_parking``
  (some), or ``torch._logging.set_logs(ae_compiles=True)``;
- ``ADAPTIVE_EAGER_LOG=debug`` (or ``info``, ``warning``, ``error``), which adds one
  stderr handler to the ``adaptive_eager`` logger.

Artifact names in ``TORCH_LOGS`` must be registered before ``import torch`` parses it;
the installed package's ``torch.backends`` entry point does that (autoload.py).
Without it (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``, or not installed), use
``+adaptive_eager`` or ``set_logs``.

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

# Artifact name -> what it logs. Prefixed: torch owns "recompiles", "graph", ...
ARTIFACTS: dict[str, str] = {
    "ae_flushes": "adaptive_eager: each flushed window (reason, ops, the program's line)",
    "ae_compiles": "adaptive_eager: region compiles queued, started, finished, failed; demotions",
    "ae_parking": "adaptive_eager: capture parked / resumed (pass-through) with the reason; warm-up end",
    "ae_recompiles": "adaptive_eager: window plan cache misses with their cause (new op, shape, scalar)",
}


def mentions_ours(torch_logs: str) -> bool:
    """Whether a ``TORCH_LOGS`` value names one of this package's logs (cheap)."""
    return "ae_" in torch_logs or LOGGER_NAME in torch_logs


def register_with_torch() -> bool:
    """Register the ``adaptive_eager`` log and :data:`ARTIFACTS` with ``torch._logging``
    (once; imports ``torch._logging``). False when torch's API is not there."""
    global _REGISTERED
    if _REGISTERED:
        return True
    try:
        from torch._logging import _internal  # noqa: PLC0415 - only once torch is imported

        _internal.register_log(LOGGER_NAME, LOGGER_NAME)
        for name, description in ARTIFACTS.items():
            _internal.register_artifact(name, description, visible=True)
    except Exception:  # noqa: BLE001 - logging must never stop a program
        return False
    _REGISTERED = True
    return True


def artifact_logger(name: str) -> logging.Logger:
    """The logger of artifact ``name`` (registering first); the package logger when
    torch's API is not there. Guard hot call sites with ``isEnabledFor(logging.DEBUG)``."""
    if name in ARTIFACTS and register_with_torch():
        from torch._logging import getArtifactLogger  # noqa: PLC0415

        return getArtifactLogger(LOGGER_NAME, name)
    return log

# Note [Logging registries]
# _WARNED (keys already warned about), _HANDLER (the handler added for
# ADAPTIVE_EAGER_LOG) and _REGISTERED are this module's only state: a set that only
# grows, at most one handler (configuring twice never doubles the output), a flag.
_WARNED: set[str] = set()
_WARNED_LOCK = threading.Lock()
_HANDLER: logging.Handler | None = None
_REGISTERED = False  # register_with_torch() ran (torch's registry is process-wide too)


def warn_once(key: str, message: str, *args: object) -> None:
    """Log ``message`` at WARNING the first time ``key`` is seen in this process."""
    with _WARNED_LOCK:
        if key in _WARNED:
            return
        _WARNED.add(key)
    log.warning(message, *args)


def bad_switch_key(variable: str, value: str) -> str:
    """The :func:`warn_once` key of a bad ``value`` of environment switch ``variable``: one
    warning per process, whoever meets it first (Note [Switches that never stop a block]
    in config.py)."""
    return f"bad-switch:{variable}={value.strip().lower()}"


def configure_from_env(environ: os._Environ | dict | None = None) -> None:
    """Add a stderr handler at the level named by ``ADAPTIVE_EAGER_LOG`` (once).

    Unset or empty: nothing changes. An unknown level name is reported once and ignored
    (logging must never stop a program).
    """
    global _HANDLER
    environ = os.environ if environ is None else environ
    value = environ.get(ENV_VAR, "").strip().lower()
    from ._env import OFF_WORDS  # noqa: PLC0415 - a leaf module

    if value in OFF_WORDS or value == "none":
        return
    level = _LEVELS.get(value)
    if level is None:
        warn_once(bad_switch_key(ENV_VAR, value), "adaptive_eager: %s=%r is not a level; use one of %s",
                  ENV_VAR, value, ", ".join(sorted(_LEVELS)))
        return
    log.setLevel(level)
    if _HANDLER is None:
        _HANDLER = logging.StreamHandler()
        _HANDLER.setFormatter(logging.Formatter("[adaptive_eager %(levelname)s] %(message)s"))
        log.addHandler(_HANDLER)
    _HANDLER.setLevel(level)


__all__ = ["LOGGER_NAME", "ENV_VAR", "ARTIFACTS", "LEVEL_NAMES", "log", "warn_once", "bad_switch_key",
           "configure_from_env",
           "register_with_torch", "artifact_logger", "mentions_ours"]
