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
recorded, so they need nothing. These setters are Python-level calls that the dispatch
mode does not see; while a runtime exists they are wrapped (once, with the first
session, through the hooks registry: Note [The hooks registry], hooks.py;
``functools.wraps`` keeps their names and docs): before the setting changes, every pending window runs (flush reason
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
from typing import Any, Callable

import torch

from ..hooks import HOOKS, Patch

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

def _wrap(name: str, fn: Callable, dtype: bool, on_change: Callable[[str, bool], None]) -> Callable:
    @functools.wraps(fn)
    def setter(*args: Any, **kwargs: Any) -> Any:
        on_change(name, dtype)
        return fn(*args, **kwargs)

    return setter


def _wrap_property(prop: Any, on_change: Callable[[str, bool], None]) -> property | None:
    if not isinstance(prop, property) or prop.fset is None:
        return None
    return property(prop.fget, _wrap("fill_uninitialized_memory", prop.fset, False, on_change),
                    prop.fdel, prop.__doc__)


def rows(on_change: Callable[[str, bool], None]) -> tuple[Patch, ...]:
    """The setters' rows of the hooks registry (Note [The hooks registry], hooks.py)."""
    out = [Patch("setters", module, attr, functools.partial(_wrap_setter, attr, dtype, on_change))
           for module, attr, dtype in _SETTERS]
    out.append(Patch("setters", "type(torch.utils.deterministic)", "fill_uninitialized_memory",
                     functools.partial(_wrap_property, on_change=on_change), own_only=True,
                     find=lambda: type(torch.utils.deterministic)))
    return tuple(out)


def _wrap_setter(attr: str, dtype: bool, on_change: Callable[[str, bool], None], fn: Callable) -> Callable:
    return _wrap(attr, fn, dtype, on_change)


def install(on_change: Callable[[str, bool], None]) -> None:
    """Wrap the setters so that ``on_change(name, changes_default_dtype)`` runs first
    (once per process: later calls keep the first ``on_change``)."""
    HOOKS.install(rows(on_change))


def uninstall() -> None:
    """Put the original setters back (tests; the runtime leaves them installed)."""
    HOOKS.uninstall("setters")


__all__ = ["install", "uninstall"]
