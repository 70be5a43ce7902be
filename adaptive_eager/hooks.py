"""The process-wide hooks: one registry for every patch the runtime makes outside itself.

Note [The hooks registry]
The runtime changes objects that are not its own: methods and attributes of torch and
of the standard library, the SIGINT handler, torch's global optimizer and module hooks,
a fork hook. Each such change is a row here: a :class:`Patch` (``owner.attr`` replaced
by a wrapper made from the original) or a :class:`Hook` (a registration with an undo),
declared by the module whose behaviour it adds, and installed and undone only through
:data:`HOOKS`. The registry keeps, for each patched attribute, the original and whether
the owner had it in its own ``__dict__`` (``torch.Tensor.item`` is ``TensorBase``'s), so
that undoing puts back exactly what was there (the attribute ``is`` the original again;
an inherited one is deleted, not shadowed). A wrapper function carries one marker,
``__ae_wrapped__`` (its original), set here. Installing is idempotent and thread-safe (one
lock, renewed in a forked child); the wrappers themselves are plain closures set on their owners, so a patched call
pays nothing for the registry (the Tensor read methods are hot). Rows are kept per
attribute: when two groups patch the same attribute (``set_rng_state``: the opaque call of
dispatch/opaque.py and the compile-thread guard of runtime/compiler.py), the row that
``covers`` the other is the one wrapper installed, so the attribute is wrapped once; undoing
it brings the other back if that is still wanted.

The rows, by group (``what``: where they are declared; when installed; how undone):

+---------------+--------------------------------------------+------------------+---------------------+
| group         | what (declared in)                         | installed        | undone              |
+===============+============================================+==================+=====================+
| reads         | ``Tensor`` read methods (repr, numpy,      | first block      | ``uninstall()``     |
|               | tolist, item, ...), ``Tensor.backward``,   | (Observer)       | (tests)             |
|               | ``Tensor.data``, ``torch.tensor``/         |                  |                     |
|               | ``as_tensor``/``asarray``/``from_numpy``/  |                  |                     |
|               | ``frombuffer`` (dispatch/observe.py)       |                  |                     |
| opaque        | C++ entry points: DDP init, set_rng_state, | first session    | ``uninstall()``     |
|               | to_dlpack, share_memory, save/load,        |                  | (tests)             |
|               | unpickling; ``queue.Queue.put``,           |                  |                     |
|               | ``ThreadPoolExecutor.submit``              |                  |                     |
|               | (dispatch/opaque.py)                       |                  |                     |
| fork          | ``os.register_at_fork(before=)``           | first session    | never (os has no    |
|               | (dispatch/opaque.py)                       |                  | undo; a no-op when  |
|               |                                            |                  | nothing is pending) |
| setters       | eight torch setters and                    | first session    | ``uninstall()``     |
|               | ``fill_uninitialized_memory``              |                  | (tests)             |
|               | (dispatch/kernel_state.py)                 |                  |                     |
| rng-guard     | ``set_rng_state`` of torch, torch.random,  | first compile    | ``uninstall()``     |
|               | cuda, xpu, mps (runtime/compiler.py);      | thread           | (tests)             |
|               | torch's two are covered by opaque's rows   |                  |                     |
| optim-steps   | torch.optim global step pre/post hooks     | first session    | ``uninstall()``     |
|               | (dispatch/parking.py)                      |                  | (handles removed)   |
| module-calls  | global module forward pre-hook             | while a mode     | when none needs it  |
|               | (dispatch/parking.py)                      | measures         |                     |
| sigint        | the SIGINT handler                         | main thread's    | its last block      |
|               | (dispatch/interrupts.py)                   | first block      | (unless replaced)   |
| thread-start  | ``threading.Thread.start`` (process.py)    | ``enable()``     | ``disable()``       |
| vec-isa       | Inductor's ``cpu_vec_isa.``                | first trusted    | ``uninstall()``     |
|               | ``valid_vec_isa_list`` (runtime/           | ISA block (a     | (tests)             |
|               | inductor_setup.py: the picked ISA alone    | load, a compile) |                     |
|               | inside ``trusted_vec_isa``)                |                  |                     |
| paced         | a ``sys.meta_path`` finder and Inductor's  | the artifact     | after it            |
|               | ``codecache.build_code_hash``, pausing the | loader's warm-up |                     |
|               | thread being paced (runtime/pacing.py)     | (once a process) |                     |
| neuron-sim    | storage allocation of the emulated device: | enabling the     | ``uninstall()``     |
|               | ``_StorageBase.clone``/``.neuron``,        | emulated device  | (tests; the device  |
|               | ``UntypedStorage.__new__``                 |                  | has no disable)     |
|               | (neuron_sim/_storage.py)                   |                  |                     |
+---------------+--------------------------------------------+------------------+---------------------+

Not rows (registrations that are not patches of shared objects, or that must stay
import-light): ``atexit`` functions (exit_report.py, runtime/compile_worker.py), the
one-shot import hook of ``ADAPTIVE_EAGER=1`` (autoload.py: it removes itself once it
fired, and runs inside ``import torch``), the emulated device's kernels (torch.library
registrations, like a PrivateUse1 backend's), and the SIGINT handler held while the
package's lazy imports run (``adaptive_eager.__init__``: set and put back around one
import).

Example::

    >>> import torch
    >>> from adaptive_eager.hooks import HOOKS, Patch
    >>> row = Patch("example", "torch", "get_num_threads", lambda f: (lambda: f()))
    >>> original = torch.get_num_threads
    >>> HOOKS.install([row]); HOOKS.install([row])  # the second is a no-op
    >>> torch.get_num_threads.__ae_wrapped__ is original
    True
    >>> HOOKS.uninstall("example"); torch.get_num_threads is original
    True
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable

_log = logging.getLogger("adaptive_eager.hooks")

MARK = "__ae_wrapped__"  # the one marker: a wrapper's original
_MISSING = object()


@dataclass(frozen=True)
class Patch:
    """``owner.attr`` replaced by ``make(original)`` (None from ``make``: nothing to wrap).

    ``owner`` is a dotted path (``"torch.Tensor"``, ``"queue.Queue"``) unless ``find``
    returns the object; ``own_only``: patch a class attribute only if the class defines it
    itself; ``covers``: groups whose patch of the same attribute this one includes;
    ``adds``: the attribute may be absent (``make(None)`` then adds it; undoing deletes it)."""

    group: str
    owner: str
    attr: str
    make: Callable[[Any], Any]
    own_only: bool = False
    covers: tuple[str, ...] = ()
    find: Callable[[], Any] | None = None
    adds: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.owner, self.attr)


@dataclass(frozen=True)
class Hook:
    """A registration that is not an attribute: ``add()`` returns a token (None: nothing
    was registered), ``remove(token)`` undoes it (None: it cannot be undone)."""

    group: str
    what: str
    add: Callable[[], Any]
    remove: Callable[[Any], None] | None = None

    @property
    def key(self) -> tuple[str, str]:
        return ("hook", f"{self.group}:{self.what}")


def _locate(row: Patch) -> Any:
    if row.find is not None:
        return row.find()
    parts = row.owner.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(row.owner)


@dataclass(frozen=True)
class _Applied:
    row: Patch
    obj: Any
    raw: Any            # what obj's own __dict__ held (_MISSING: inherited or absent)
    original: Any       # what the wrapper was made from
    replacement: Any


class Registry:
    """Every process-wide patch and hook, installed and undone in one place.

    One instance per process (:data:`HOOKS`), the documented registry of this module."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._wanted: dict[tuple[str, str], list[Patch]] = {}
        self._applied: dict[tuple[str, str], _Applied] = {}
        self._hooks: dict[tuple[str, str], tuple[Hook, Any]] = {}
        self._forks = False  # the lock is renewed in a forked child

    def _renew_lock(self) -> None:
        # A fork from one thread while another held the lock would leave it held for good
        # in the child (only the forking thread exists there): threading renews its own
        # locks the same way.
        self._lock = threading.RLock()

    # -- installing ----------------------------------------------------------------------
    def install(self, rows: Iterable[Patch | Hook]) -> None:
        """Install ``rows`` (each once: a group's second row for the same attribute, or
        the same hook again, is a no-op)."""
        with self._lock:
            if not self._forks and hasattr(os, "register_at_fork"):
                os.register_at_fork(after_in_child=self._renew_lock)
                self._forks = True
            for row in rows:
                if isinstance(row, Hook):
                    self._add_hook(row)
                    continue
                wanted = self._wanted.setdefault(row.key, [])
                if all(r.group != row.group for r in wanted):  # one row per group and attribute
                    wanted.append(row)
                    self._resolve(row.key)

    def _add_hook(self, row: Hook) -> None:
        if row.key in self._hooks:
            return
        token = row.add()
        if token is not None:
            self._hooks[row.key] = (row, token)

    def _winner(self, key: tuple[str, str]) -> Patch | None:
        wanted = self._wanted.get(key)
        if not wanted:
            return None
        for row in wanted:
            if all(o is row or o.group in row.covers for o in wanted):
                return row
        return wanted[0]

    def _resolve(self, key: tuple[str, str]) -> None:
        """Make the attribute hold the wanted row's wrapper (or the original)."""
        winner = self._winner(key)
        applied = self._applied.get(key)
        if applied is not None and applied.row is winner:
            return
        if applied is not None:
            self._restore(key, applied)
        if winner is not None:
            self._apply(key, winner)

    def _apply(self, key: tuple[str, str], row: Patch) -> None:
        try:
            obj = _locate(row)
        except (ImportError, AttributeError):
            return  # not in this torch build (distributed off, an older torch)
        raw = vars(obj).get(row.attr, _MISSING) if isinstance(obj, type) else getattr(obj, row.attr, _MISSING)
        if raw is _MISSING and row.own_only:
            return
        original = raw if raw is not _MISSING else getattr(obj, row.attr, None)
        if original is None and not row.adds:
            return
        replacement = row.make(original)
        if replacement is None:
            return
        try:
            if original is not None:
                setattr(replacement, MARK, original)
        except (AttributeError, TypeError):  # a property: the registry remembers
            pass
        setattr(obj, row.attr, replacement)
        self._applied[key] = _Applied(row, obj, raw, original, replacement)

    def _restore(self, key: tuple[str, str], applied: _Applied) -> None:
        del self._applied[key]
        obj, attr = applied.obj, applied.row.attr
        current = vars(obj).get(attr, _MISSING) if isinstance(obj, type) else getattr(obj, attr, _MISSING)
        if current is not applied.replacement:
            # The program patched over ours: its patch stays (ours, inside it, acts only
            # while a runtime exists).
            _log.debug("not undoing %s.%s: replaced since", applied.row.owner, attr)
            return
        if applied.raw is _MISSING:
            delattr(obj, attr)
        else:
            setattr(obj, attr, applied.raw)

    # -- undoing -------------------------------------------------------------------------
    def uninstall(self, group: str | Patch | Hook | None = None) -> None:
        """Undo one row, every row of a group, or everything (None) that can be undone.

        Rows with no undo (the fork hook) stay. An attribute another group still wants
        gets that group's wrapper back."""
        with self._lock:
            if isinstance(group, Hook):
                self._remove_hook(group.key)
                return
            if isinstance(group, Patch):
                self._unwant(group.key, lambda row: row == group)
                return
            for key, (row, _) in list(self._hooks.items()):
                if group is None or row.group == group:
                    self._remove_hook(key)
            for key in list(self._wanted):
                self._unwant(key, lambda row: group is None or row.group == group)

    def _remove_hook(self, key: tuple[str, str]) -> None:
        entry = self._hooks.get(key)
        if entry is not None and entry[0].remove is not None:
            del self._hooks[key]
            entry[0].remove(entry[1])

    def _unwant(self, key: tuple[str, str], chosen: Callable[[Patch], bool]) -> None:
        wanted = self._wanted.get(key, [])
        kept = [r for r in wanted if not chosen(r)]
        if len(kept) != len(wanted):
            self._wanted[key] = kept
            self._resolve(key)
            if not kept:
                del self._wanted[key]

    # -- questions -----------------------------------------------------------------------
    def installed(self, row: Patch | Hook) -> bool:
        """Whether ``row`` is in effect now (a patch: its wrapper is the one installed)."""
        with self._lock:
            if isinstance(row, Hook):
                return row.key in self._hooks
            applied = self._applied.get(row.key)
            return applied is not None and applied.row == row

    def original(self, owner: str, attr: str) -> Any:
        """What ``owner.attr`` was before the runtime patched it (None: not patched)."""
        with self._lock:
            applied = self._applied.get((owner, attr))
            return None if applied is None else applied.original

    def rows(self) -> list[Patch | Hook]:
        """Every row in effect now, patches first."""
        with self._lock:
            return [a.row for a in self._applied.values()] + [r for r, _ in self._hooks.values()]


HOOKS = Registry()


# Note [The compile thread's random stream]
# The thread-local flag the set_rng_state rows read (runtime/compiler.py sets it in
# its compile thread: Note [Compiles never rewind the program's random stream]); here,
# beside the rows, so that dispatch/opaque.py's wrapper of the same function reads it
# too without importing the compile service.
_RNG = threading.local()


def skip_rng_setters_in_this_thread() -> None:
    """From now on, in the calling thread, torch's ``set_rng_state`` rows do nothing."""
    _RNG.skip = True


def rng_setters_skipped() -> bool:
    """Whether ``set_rng_state`` does nothing in the calling thread."""
    return getattr(_RNG, "skip", False)


__all__ = ["HOOKS", "Registry", "Patch", "Hook", "MARK", "skip_rng_setters_in_this_thread",
           "rng_setters_skipped"]
