"""Global settings that kernels read: pending work runs before they change.

Note [Global state that kernels read]
A deferred op runs at the flush, and its kernel reads process-wide settings then,
not when the program issued it. Measured (issue 15, items 4 and 5): ``torch.ones(64)``
pending across ``torch.set_default_dtype(torch.float64)`` came out float64 (eager:
float32); ``torch.empty`` recorded under ``use_deterministic_algorithms(True)`` and
read after it was turned off was not NaN-filled. The settings, from torch/_C:

+--------------------------------------------+------------------------------------------+
| setting (setter wrapped here)              | what reads it                            |
+============================================+==========================================+
| default dtype (``set_default_dtype``,      | factories without ``dtype``, and type    |
| ``set_default_tensor_type``)               | promotion (``int_tensor * 0.5``,         |
|                                            | ``sin(int_tensor)``), in meta and kernels|
| deterministic algorithms                   | ``empty`` & co fill NaN; ops that have   |
| (``use_deterministic_algorithms``,         | no deterministic kernel raise            |
| ``set_deterministic_debug_mode``,          |                                          |
| ``utils.deterministic.                     |                                          |
| fill_uninitialized_memory``)               |                                          |
| flush denormal (``set_flush_denormal``)    | every float kernel                       |
| float32 matmul precision                   | matmul kernels (mkldnn bf16 / tf32)      |
| (``set_float32_matmul_precision``)         |                                          |
| intra-op threads (``set_num_threads``)     | how reductions split (bitwise results)   |
| mkldnn flags (``backends.mkldnn.flags``)   | conv / matmul kernel choice              |
+--------------------------------------------+------------------------------------------+

Grad mode, autocast and the default device act above the dispatcher, when the op is
recorded, so they need nothing. These setters are Python-level calls that no
TorchFunctionMode sees; while a runtime exists they are wrapped (once, with the
first session; ``functools.wraps`` keeps their names and docs; ``__wrapped__`` is the
original): before the setting changes, every pending window runs (flush reason
``global_state``), so each op runs under the setting it was recorded under. A change
of the default dtype also forgets memoized metadata, and factories are recorded with
their dtype explicit and keyed by the default dtype (dispatch/recorder.py), so a
change the wrappers cannot see (``torch._C`` directly, a setter imported by name
before the first block) still gives factories the right dtype; for other ops the
flush finds the dtype it did not promise and says so (flush.py, ``_disagrees``).

Example::

    >>> import torch
    >>> setter = _wrap("set_flush_denormal", torch.set_flush_denormal, False,
    ...                lambda name, dtype_changed: print("flush before", name))
    >>> _ = setter(False)            # what install() puts in torch's place
    flush before set_flush_denormal
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Callable

import torch

# (module, attribute, whether it changes the default dtype)
_SETTERS = (
    ("torch", "set_default_dtype", True),
    ("torch", "set_default_tensor_type", True),
    ("torch", "use_deterministic_algorithms", False),
    ("torch", "set_deterministic_debug_mode", False),
    ("torch", "set_flush_denormal", False),
    ("torch", "set_float32_matmul_precision", False),
    ("torch", "set_num_threads", False),
    ("torch.backends.mkldnn", "set_flags", False),
)

# The one registry of this module: what install() replaced, to put back.
_INSTALLED: list[tuple[Any, str, Any]] = []


def _wrap(name: str, fn: Callable, dtype: bool, on_change: Callable[[str, bool], None]) -> Callable:
    @functools.wraps(fn)
    def setter(*args: Any, **kwargs: Any) -> Any:
        on_change(name, dtype)
        return fn(*args, **kwargs)

    setter.__adaptive_eager_setter__ = True  # type: ignore[attr-defined]
    return setter


def install(on_change: Callable[[str, bool], None]) -> None:
    """Wrap the setters so that ``on_change(name, changes_default_dtype)`` runs first."""
    if _INSTALLED:
        return
    for module_name, attr, dtype in _SETTERS:
        try:
            module = importlib.import_module(module_name)
            fn = getattr(module, attr)
        except (ImportError, AttributeError):  # an older or trimmed torch
            continue
        if getattr(fn, "__adaptive_eager_setter__", False):
            continue
        _INSTALLED.append((module, attr, fn))
        setattr(module, attr, _wrap(attr, fn, dtype, on_change))
    cls = type(torch.utils.deterministic)
    prop = cls.__dict__.get("fill_uninitialized_memory")
    if isinstance(prop, property) and prop.fset is not None:
        _INSTALLED.append((cls, "fill_uninitialized_memory", prop))
        setattr(cls, "fill_uninitialized_memory", property(
            prop.fget, _wrap("fill_uninitialized_memory", prop.fset, False, on_change), prop.fdel,
            prop.__doc__))


def uninstall() -> None:
    """Put the original setters back (tests; the runtime leaves them installed)."""
    while _INSTALLED:
        owner, attr, original = _INSTALLED.pop()
        setattr(owner, attr, original)


__all__ = ["install", "uninstall"]
