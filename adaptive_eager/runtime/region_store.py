"""Compiled regions on disk: the key of a region across processes, and its artifact's bytes.

A region's in-process key (``fusion.signature.region_key``) is a tuple of ops, specs and
constants, hashed with Python's per-process string hashing. On disk it is spelled out as
text (:func:`stable_text`) and hashed with SHA-256 together with everything else that
shapes the artifact (:func:`environment`): torch and Python versions, the backend and its
options, the device, the intra-op thread count baked into CPU kernels, the CPU's ISA, and
this runtime's lowering code. A region whose key holds anything without a stable
spelling (an object whose repr is an address) is not cached on disk.

Example::

    >>> import tempfile, torch
    >>> from adaptive_eager.runtime.disk_cache import DiskCache
    >>> from adaptive_eager.fusion.signature import Key
    >>> folder = tempfile.TemporaryDirectory()  # removed with the object
    >>> store = RegionStore(DiskCache(folder.name), "inductor", "cpu", codec=None)
    >>> stable_text((torch.ops.aten.add.Tensor, ("v", 0), 2.5, torch.float32))
    '(Oaten::add.Tensor,(s1:v,i0),f0x1.4000000000000p+1,Dtorch.float32)'
    >>> k = store.key(Key(((torch.ops.aten.sin.default,),)), threads=2)
    >>> len(k), k == store.key(Key(((torch.ops.aten.sin.default,),)), threads=1)
    (64, False)
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import sys
from typing import Any, Callable

import torch

from ..fusion.scalars import LIFTED
from ..fusion.signature import Key
from .backends import ArtifactCodec, artifact_codec
from .disk_cache import DiskCache, open_cache, resolve_dir

# Bumped when what a key means changes (the calling convention of a region's artifact).
KEY_FORMAT = "adaptive_eager region 1"

_TYPE_TAGS = {float: "float", int: "int", bool: "bool", complex: "complex", tuple: "tuple",
              list: "list", str: "str", type(None): "None"}


def stable_text(x: Any) -> str | None:
    """``x`` (a region key's parts) spelled the same in every process, or None when some
    part has no such spelling (then the region is not cached on disk)."""
    out: list[str] = []
    return "".join(out) if _spell(x, out) else None


def _spell(x: Any, out: list[str]) -> bool:  # noqa: C901, PLR0911 - one case per kind of part
    t = type(x)
    if x is None:
        out.append("N")
    elif t is bool:
        out.append("b1" if x else "b0")
    elif t is int:
        out.append(f"i{x}")
    elif t is float:
        out.append(f"f{x.hex()}")  # exact; NaN and zeros reach here as bytes (signature.py)
    elif t is complex:
        out.append(f"c{x.real.hex()},{x.imag.hex()}")
    elif t is str:
        out.append(f"s{len(x)}:{x}")
    elif t is bytes:
        out.append(f"y{x.hex()}")
    elif isinstance(x, (tuple, list)):  # torch.Size and named tuples too
        out.append("(" if isinstance(x, tuple) else "[")
        for i, a in enumerate(x):
            if i:
                out.append(",")
            if not _spell(a, out):
                return False
        out.append(")" if isinstance(x, tuple) else "]")
    elif isinstance(x, torch._ops.OpOverload):
        out.append(f"O{x.name()}")
    elif t in (torch.dtype, torch.device, torch.layout, torch.memory_format):
        out.append(f"D{x}")
    elif t is type and x in _TYPE_TAGS:
        out.append(f"T{_TYPE_TAGS[x]}")
    elif t is Key:
        return _spell(x.parts, out)
    elif x is LIFTED:  # a lifted scalar's slot (Note [Scalar lifting])
        out.append("L")
    else:
        return False
    return True


def _cpu_flags() -> str:
    """The CPU's feature flags (Linux), which decide the ISA Inductor compiles for."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features", "features")):
                    return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return ""


def _source_digest() -> str:
    """The lowering code's own digest: a region's artifact is called with the arguments
    ``fusion/fxgraph.py`` and ``fusion/scalars.py`` lay out."""
    h = hashlib.sha256()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for rel in ("fusion/fxgraph.py", "fusion/scalars.py"):
        try:
            with open(os.path.join(here, rel), "rb") as f:
                h.update(f.read())
        except OSError:
            h.update(rel.encode())
    return h.hexdigest()[:16]


@functools.cache
def environment() -> str:
    """What besides the region shapes its artifact in this process (see the module
    docstring); the same in every process of one installation on one machine."""
    inductor_env = sorted((k, v) for k, v in os.environ.items()
                          if k.startswith("TORCHINDUCTOR_")
                          and k not in ("TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_COMPILE_THREADS"))
    parts = [KEY_FORMAT, _source_digest(), sys.version, torch.__version__,
             str(torch.version.git_version), platform.machine(),
             torch.backends.cpu.get_cpu_capability(), _cpu_flags(), os.environ.get("CXX", ""),
             repr(inductor_env)]
    return "\n".join(parts)


# Note [The vector ISA probe is remembered]
# Before its first CPU kernel in a process, Inductor probes each vector ISA the CPU's flags
# allow: it compiles a test library per ISA (once per machine: 9.7 s cold on this 2-core
# machine) and loads each in a fresh Python subprocess (every process: 15 subprocesses,
# 1.4-3.4 s, measured in CompiledArtifact.load). When a process saw the ISA Inductor picks
# pass its probe (Note [Only the picked vector ISA is probed], inductor_setup.py; every
# allowed ISA, when Inductor probed them all), it records so in the disk cache (keyed by
# environment(): CPU flags, torch, compiler), and later processes, the compile worker and
# the loads here, tell Inductor so (``cpp.vec_isa_ok``), which then picks the same ISA
# without probing. A user's own TORCHINDUCTOR_VEC_ISA_OK wins. A CPU where the picked ISA
# failed its probe keeps probing. (The record's text changed on 2026-12-02 with its
# meaning: records written before are not read, and the next process probes once.)
_ISA_RECORD = b"the vector ISA Inductor picks passed its probe"

# Note [A region checked once is trusted by the next process]
# A compiled region's first call is checked (Note [The first compiled call runs on
# copies], runtime/first_call.py): with verify_compiled, the default, an eager run beside
# the compiled one and a comparison. A region loaded from the disk cache was checked again
# in every process: on the demo's second run (17.9M-parameter MLP, AdamW, kept caches)
# its optimizer-step windows' first calls took 0.6-0.7 s each (copies of every input the
# region writes, the compiled and the eager run, the comparison) against a 90 ms step:
# two steps of 687 and 601 ms, the run's slowest. The check's verdict is a fact about the
# artifact's bytes, and a later process runs those bytes on inputs of the same specs
# (the key holds them, the environment, the backend and the thread count): so once a
# region's first call passes its check, the store records the digest of its artifact
# beside it (``<key> checked``), and a later process that loads the same bytes (their
# digest matching) binds the region as checked; its first call is an ordinary one, as
# the checking process's second call was. A record whose artifact was replaced (another
# digest) or deleted (discard deletes both) trusts nothing. A compiled optimizer step's
# check (Note [The first compiled step is checked beside the program]) is recorded the
# same way: the kept demo's steps 12-13 were its AdamW step's check (237 and 251 ms
# against a 90 ms step) in every process, and a step loaded with a record runs compiled
# from its first call.
_CHECKED = " checked"
_SLOW = " slower than eager"


class RegionStore:
    """Compiled regions of one backend and device in a :class:`DiskCache`.

    ``codec``: the backend's :class:`~adaptive_eager.runtime.backends.ArtifactCodec`; with
    None nothing is stored or loaded (the backend's artifacts cannot be saved).
    """

    def __init__(self, cache: DiskCache, backend: str, device: str, codec: ArtifactCodec | None):
        self.cache = cache
        self.backend = backend
        self.device = device
        self.codec = codec
        self._isa_ok: bool | None = None  # the record, read once

    @property
    def usable(self) -> bool:
        return self.codec is not None

    def key(self, region_key: Any, threads: int) -> str | None:
        """The disk key of a region compiled for ``threads`` intra-op threads, or None."""
        text = stable_text(region_key)
        if text is None:
            return None
        h = hashlib.sha256()
        for part in (environment(), f"backend {self.backend}", f"device {self.device}",
                     f"threads {threads}", text):
            h.update(part.encode("utf-8"))
            h.update(b"\0")
        return h.hexdigest()

    def get(self, key: str) -> bytes | None:
        return self.cache.get(key) if self.codec is not None else None

    def load(self, data: bytes) -> Callable[..., Any]:
        """The callable saved as ``data`` (raises when it cannot be loaded)."""
        assert self.codec is not None
        if self.backend != "inductor":
            return self.codec.load(data)
        from .compile_worker import isa_probed, probe_picked_isa, trusted_vec_isa  # noqa: PLC0415

        told = self.isa_ok()
        picked = None if told else probe_picked_isa()  # Note [Only the picked vector ISA is probed]
        with trusted_vec_isa(told or picked is True):
            fn = self.codec.load(data)
        if not told:
            self.note_isa(True if picked else isa_probed())
        return fn

    def _isa_key(self) -> str:
        return "vec-isa " + hashlib.sha256(environment().encode("utf-8")).hexdigest()

    def isa_ok(self) -> bool:
        """Whether an earlier process saw the vector ISA Inductor picks pass its probe (Note
        [The vector ISA probe is remembered])."""
        if self._isa_ok is None:
            self._isa_ok = self.cache.get(self._isa_key()) == _ISA_RECORD
        return self._isa_ok

    def note_isa(self, probed: bool | None) -> None:
        """Record a probe's verdict (``compile_worker.probe_picked_isa`` or ``isa_probed``)
        when it passed."""
        if probed is True and not self.isa_ok():
            self._isa_ok = self.cache.put(self._isa_key(), _ISA_RECORD)

    def _bytes(self, fn: Any) -> bytes | None:
        """``fn``'s artifact as the backend saves it; None when it has none."""
        return self.codec.dump(fn) if self.codec is not None else None

    def save(self, key: str, fn: Any) -> bool:
        """Store ``fn``'s artifact under ``key``; False when it has no bytes to save."""
        data = self._bytes(fn)
        return data is not None and self.cache.put(key, data)

    # Note [A step found slower than eager stays eager in the next process] (dispatch/optim_speed.py)
    def note_slow(self, key: str, compiled_ns: float) -> bool:
        """Record that the optimizer step compiled under ``key`` took ``compiled_ns`` a call,
        no faster than eager's step."""
        return self.cache.put(key + _SLOW, b"%d" % int(compiled_ns))

    def slow_ns(self, key: str) -> float | None:
        """What a step compiled under ``key`` took a call when an earlier process found it
        no faster than eager's (:meth:`note_slow`); None when none did."""
        data = self.cache.get(key + _SLOW)
        return float(data) if data and data.isdigit() else None

    def discard(self, key: str) -> None:
        """Delete ``key``'s artifact and the record of its check."""
        self.cache.discard(key)
        self.cache.discard(key + _CHECKED)

    # Note [A region checked once is trusted by the next process]
    def note_checked(self, key: str, fn: Any) -> bool:
        """Record that ``fn``'s artifact, stored under ``key``, passed its first call's
        check; False when it has no bytes (nothing a later process could load)."""
        data = self._bytes(fn)
        return data is not None and self.cache.put(key + _CHECKED, hashlib.sha256(data).digest())

    def was_checked(self, key: str, data: bytes) -> bool:
        """Whether the artifact ``data``, loaded from ``key``, passed its first call's
        check in an earlier process: these very bytes (their digest), not an artifact
        stored under the key before them."""
        return self.cache.get(key + _CHECKED) == hashlib.sha256(data).digest()


def open_store(options: Any) -> RegionStore | None:
    """The disk store ``options`` ask for (``cache_dir``, ``cache_max_mb``), or None: the
    cache is off, or the backend's artifacts cannot be saved (eager, aot_eager, a
    callable). Nothing is read or created on disk until a region asks."""
    path = resolve_dir(options.cache_dir)
    if path is None or not isinstance(options.backend, str):
        return None
    codec = artifact_codec(options.backend, options.device)
    if codec is None:
        return None
    return RegionStore(open_cache(path, options.cache_max_mb << 20), options.backend,
                       options.device, codec)


__all__ = ["RegionStore", "open_store", "stable_text", "environment", "KEY_FORMAT"]
