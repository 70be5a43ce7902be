"""Opt-in with no code change: ``ADAPTIVE_EAGER=1 python train.py``.

PyTorch calls every entry point of the ``torch.backends`` group on ``import torch``
(``torch/__init__.py``, ``_import_device_backends``; off with
``TORCH_DEVICE_BACKEND_AUTOLOAD=0``). Ours is :func:`autoload`.

# Note [Autoload runs inside import torch]
The entry point runs near the end of ``torch/__init__.py``: torch is not fully
imported yet, and an exception here breaks ``import torch`` for the user. So:

- when ``ADAPTIVE_EAGER`` (and ``ADAPTIVE_EAGER_NEURON_SIM``) are unset it returns
  at once, having imported nothing (this module and the package's empty
  ``__init__``);
- it never raises: a bad option is logged (WARNING) and the runtime stays off;
- it does not enable anything during the import. It arranges for
  :func:`_enable_from_env` to run the moment ``import torch`` completes, by hooking
  the module spec's ``_initializing`` flag, which importlib clears when the module
  finished executing (see :func:`when_imported`). Enabling then enters the runtime in
  the importing thread (usually the main thread) and in threads started later.

It also attaches this package's context manager to ``torch_neuronx`` as
``torch_neuronx.adaptive_eager`` when torch_neuronx is imported (never replacing
one it already has); that costs one entry in ``sys.meta_path`` which only reacts to
the name ``torch_neuronx``.

Example (a shell)::

    $ ADAPTIVE_EAGER=1 ADAPTIVE_EAGER_REPORT=stderr python train.py
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

from ._env import OFF_WORDS as _OFF  # a leaf: imports nothing
from ._env import ON_WORDS as _ON

ENV_VAR = "ADAPTIVE_EAGER"
NEURON_SIM_ENV_VAR = "ADAPTIVE_EAGER_NEURON_SIM"


def _log() -> Any:
    import logging

    return logging.getLogger("adaptive_eager")


def autoload() -> None:
    """The ``torch.backends`` entry point. Cheap when unset; never raises."""
    try:
        torch_logs = os.environ.get("TORCH_LOGS", "")
        if torch_logs:
            # Our artifact names must be known before torch parses TORCH_LOGS, which it
            # does just after calling this entry point (torch/__init__.py, _init_logs).
            from ._logging import mentions_ours, register_with_torch

            if mentions_ours(torch_logs):
                register_with_torch()
        when_imported("torch_neuronx", _attach_to_torch_neuronx)
        on = os.environ.get(ENV_VAR, "").strip().lower()
        sim = os.environ.get(NEURON_SIM_ENV_VAR, "").strip().lower()
        if on in _OFF and sim in _OFF:
            return
        if on not in _OFF and on not in _ON:
            from ._logging import bad_switch_key, warn_once  # a leaf module

            warn_once(bad_switch_key(ENV_VAR, on), "adaptive_eager: %s=%r not understood (use 1 or 0); "
                      "staying off", ENV_VAR, on)
        when_imported("torch", _enable_from_env)
    except Exception as e:  # never break `import torch`
        _log().warning("adaptive_eager: autoload failed, staying off: %s: %s", type(e).__name__, e)


def _enable_from_env(_torch: Any) -> None:
    from ._logging import configure_from_env

    configure_from_env()
    if os.environ.get(NEURON_SIM_ENV_VAR, "").strip().lower() not in _OFF:
        try:
            from . import neuron_sim

            maybe_enable = getattr(neuron_sim, "maybe_enable_from_env", None)
            if maybe_enable is None:
                _log().warning("adaptive_eager: %s is set but adaptive_eager.neuron_sim has no "
                               "maybe_enable_from_env(); the emulated device stays off",
                               NEURON_SIM_ENV_VAR)
            else:
                maybe_enable()
        except Exception as e:
            _log().warning("adaptive_eager: emulated neuron device not enabled: %s: %s",
                           type(e).__name__, e)
    if os.environ.get(ENV_VAR, "").strip().lower() in _ON:
        _after_package_imports(_enable_now)


def _enable_now() -> None:
    try:
        from .process import enable

        enable()
    except Exception as e:  # ConfigError from a bad ADAPTIVE_EAGER_* value, typically
        _log().warning("adaptive_eager: %s=1 ignored, running plain eager: %s: %s",
                       ENV_VAR, type(e).__name__, e)


def _after_package_imports(callback: Callable[[], None]) -> None:
    """Run ``callback`` once no module of this package is half-imported.

    When the program's own ``from adaptive_eager import ...`` is what imported torch,
    that module (e.g. ``adaptive_eager.session``) is still executing when torch
    finishes; enabling must wait for it, or it would import a half-made module.
    """
    package = __name__.split(".")[0]
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] != package:
            continue
        if getattr(getattr(module, "__spec__", None), "_initializing", False):
            when_imported(name, lambda _m: _after_package_imports(callback))
            return
    callback()


def _attach_to_torch_neuronx(module: Any) -> None:
    if hasattr(module, "adaptive_eager"):
        return
    torch_mod = sys.modules.get("torch")
    spec = getattr(torch_mod, "__spec__", None)
    if torch_mod is None or getattr(spec, "_initializing", False):
        # torch_neuronx finished before torch did (it was autoloaded itself): wait.
        when_imported("torch", lambda _t: _attach_to_torch_neuronx(module))
        return
    from .session import adaptive_eager

    module.adaptive_eager = adaptive_eager


# Note [Post-import hooks]
# when_imported(name, fn) calls fn(module) once `name` has finished importing:
# - already imported: now;
# - being imported (its spec's _initializing flag is set): when importlib clears the
#   flag, by switching that spec object's class to a subclass whose __setattr__
#   watches the flag (and switching it back);
# - not imported yet: a sys.meta_path finder that reacts only to `name` finds the
#   spec through the other finders and hooks it as above.
_HOOKS_ATTR = "_adaptive_eager_on_loaded"
_BASE_ATTR = "_adaptive_eager_base_class"


def when_imported(name: str, callback: Callable[[Any], None]) -> None:
    """Call ``callback(module)`` once module ``name`` has finished importing.

    Hand-written rather than wrapt's post-import hooks: this runs inside every ``import
    torch`` and must import nothing (wrapt would be a dependency loaded there), and it
    must fire when torch *finishes* importing, from within torch's own import."""
    module = sys.modules.get(name)
    if module is not None:
        spec = getattr(module, "__spec__", None)
        if spec is not None and getattr(spec, "_initializing", False):
            _hook_spec(spec, callback)
        else:
            _call_safely(callback, module)
        return
    for finder in sys.meta_path:
        if isinstance(finder, _PostImportFinder) and finder.name == name:
            finder.callbacks.append(callback)
            return
    sys.meta_path.insert(0, _PostImportFinder(name, callback))


def _call_safely(callback: Callable[[Any], None], module: Any) -> None:
    try:
        callback(module)
    except Exception as e:
        _log().warning("adaptive_eager: post-import hook %s failed: %s: %s",
                       getattr(callback, "__name__", callback), type(e).__name__, e)


def _spec_setattr(self: Any, key: str, value: Any) -> None:
    object.__setattr__(self, key, value)
    if key == "_initializing" and not value:
        callbacks = self.__dict__.pop(_HOOKS_ATTR, [])
        self.__class__ = self.__dict__.pop(_BASE_ATTR)
        module = sys.modules.get(self.name)
        if module is not None:
            for callback in callbacks:
                _call_safely(callback, module)


def _hook_spec(spec: Any, callback: Callable[[Any], None]) -> None:
    hooks = spec.__dict__.get(_HOOKS_ATTR)
    if hooks is not None:
        hooks.append(callback)
        return
    base = type(spec)
    hooked = type(f"_AdaptiveEagerHooked{base.__name__}", (base,), {"__setattr__": _spec_setattr})
    spec.__dict__[_HOOKS_ATTR] = [callback]
    spec.__dict__[_BASE_ATTR] = base
    spec.__class__ = hooked


class _PostImportFinder:
    """A meta path finder that only hooks the spec of one module name."""

    def __init__(self, name: str, callback: Callable[[Any], None]):
        self.name = name
        self.callbacks = [callback]

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if self in sys.meta_path:
                    sys.meta_path.remove(self)
                for callback in self.callbacks:
                    _hook_spec(spec, callback)
                return spec
        return None


__all__ = ["autoload", "when_imported", "ENV_VAR", "NEURON_SIM_ENV_VAR"]
