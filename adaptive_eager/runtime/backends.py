"""Backend registry: name -> compile function ``(GraphModule, example_inputs) -> callable``.

A backend also describes, as data, which ops it can compile (:class:`OpSupport`), so the
partitioner can ask without knowing which backend it serves. Optional compilers are
imported lazily, inside the compile function: importing the runtime never imports them.

+-----------+------------------------------------------------------------------------+
| name      | what it does                                                           |
+===========+========================================================================+
| inductor  | ``torch._inductor.compile_fx.compile_fx`` on the ATen graph (no Dynamo, |
|           | no guards), under ``no_grad``: an inference graph, mutations written back|
| aot_eager | AOTAutograd functionalization, then the functional graph run eagerly   |
| eager     | the GraphModule itself (debugging the pipeline without a compiler)     |
| neuron    | ``torch.compile(gm, backend="neuron")``; needs torch_neuronx           |
| callable  | any ``(GraphModule, example_inputs) -> callable``                        |
+-----------+------------------------------------------------------------------------+

Example::

    >>> fn = get_backend("eager")
    >>> import torch.fx as fx, torch
    >>> gm = fx.symbolic_trace(lambda x: (x + 1,))
    >>> fn(gm, [torch.zeros(1)])(torch.zeros(1))
    (tensor([1.]),)
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx as fx

from ..config import BUILTIN_BACKENDS
from .compile_worker import ARTIFACT_BYTES
from ..fusion.policy import OpSupport

log = logging.getLogger("adaptive_eager")

CompileFn = Callable[[fx.GraphModule, list], Callable[..., Any]]


class BackendUnavailable(RuntimeError):
    """The backend cannot run in this process (e.g. torch_neuronx missing)."""


@dataclass(frozen=True)
class ArtifactCodec:
    """How a backend's compiled artifacts go to disk and come back (the disk cache).

    ``dump(fn)``: the bytes of ``fn`` (None: this one cannot be saved); ``load(data)``: a
    callable equal to the one dumped. A backend without a codec is never cached on disk.
    """

    dump: Callable[[Any], bytes | None]
    load: Callable[[bytes], Callable[..., Any]]


def _dump_attached(fn: Any) -> bytes | None:
    data = getattr(fn, ARTIFACT_BYTES, None)
    return data if isinstance(data, bytes) else None


def _load_inductor(data: bytes) -> Callable[..., Any]:
    from .compile_worker import load_artifact  # noqa: PLC0415 - imports Inductor

    return load_artifact(data)


def _inductor(gm: fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
    from .compile_worker import THREADS_META, WorkerUnavailable, checked_config, compile_in_worker

    try:
        return compile_in_worker(gm, example_inputs)  # Note [Compile in a subprocess]
    except WorkerUnavailable as e:
        log.debug("compiling in-process: %s", e)
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx

    # Inductor writes a thread count into its CPU kernels: the program's, passed as
    # Inductor's option rather than set with torch.set_num_threads, which would change
    # the count every thread the program starts later inherits (Note [The program's
    # threads are its own], runtime/compiled.py).
    threads = gm.meta.get(THREADS_META) or torch.get_num_threads()
    with torch.no_grad(), inductor_config.patch({"cpp.threads": threads}), checked_config(gm):
        return compile_fx(gm, example_inputs)


def _aot_eager(gm: fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
    from torch._dynamo.backends.debugging import aot_eager

    with torch.no_grad():
        return aot_eager(gm, example_inputs)


def _eager(gm: fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
    return gm


def _neuron(gm: fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
    if importlib.util.find_spec("torch_neuronx") is None:
        raise BackendUnavailable(
            "backend 'neuron' needs torch_neuronx (pip install torch-neuronx on a Trainium "
            "host); regions run eagerly instead"
        )
    import torch_neuronx  # noqa: F401 - registers the "neuron" torch.compile backend

    return torch.compile(gm, backend="neuron", fullgraph=True, dynamic=False)


@dataclass(frozen=True)
class Backend:
    """One compile backend, as data.

    ``compile``: ``(GraphModule, example_inputs) -> callable``; ``support``: the ops it
    can compile (the partitioner's policy); ``debugging``: it exists to check the
    pipeline, and is never demoted for speed; ``codec``: how its artifacts go to the disk
    cache (None: never cached); ``native_devices``: the device types it compiles for
    itself, which are not adapted to CPU views (Note [Compiling for the emulated neuron
    device]).

    Example::

        >>> b = backend_entry("eager")
        >>> b.name, b.debugging, b.codec is None
        ('eager', True, True)
    """

    name: str
    compile: CompileFn
    support: OpSupport = OpSupport()
    debugging: bool = False
    codec: ArtifactCodec | None = None
    native_devices: frozenset[str] = frozenset()


# Note [Backend registry]
# The one piece of module-level mutable state here (codecs live in the entries): a
# documented registry of Backend entries, filled below with the built-ins and extended with register_backend().
# Inductor artifacts made by the worker are saved (standalone_compile's binary format);
# those compiled in-process (the worker unavailable) carry no bytes and are not cached.
# aot_eager and eager make Python callables over live graphs: nothing to save.
_REGISTRY: dict[str, Backend] = {
    # Note [Factories outside Inductor regions]
    # Inductor turns a tensor made from nothing (arange(256) feeding an embedding) into
    # a lifted constant that its compiled code takes as an extra input; an artifact saved
    # by standalone_compile and loaded back (the compile worker's path) forgets to pass
    # it, and its first call fails ("not enough values to unpack (expected 8, got 7)",
    # torch 2.13; the in-memory artifact works). Such ops run eagerly before the region.
    "inductor": Backend("inductor", _inductor, OpSupport(factories=False),
                        codec=ArtifactCodec(_dump_attached, _load_inductor)),
    "aot_eager": Backend("aot_eager", _aot_eager, debugging=True),
    "eager": Backend("eager", _eager, debugging=True),
    "neuron": Backend("neuron", _neuron, native_devices=frozenset({"neuron"})),
}


def backend_entry(spec: str | CompileFn) -> Backend:
    """The :class:`Backend` a name or callable stands for (a callable: a backend of its
    own, with default support, no codec)."""
    if callable(spec):
        return Backend(getattr(spec, "__name__", "callable"), spec)
    try:
        return _REGISTRY[spec]
    except KeyError:
        raise ValueError(f"unknown adaptive_eager backend {spec!r}; known: {', '.join(_REGISTRY)}") from None


def _cpu_data_device(device_type: str) -> bool:
    """Whether ``device_type`` is the emulated neuron device (data in CPU memory)."""
    if device_type != "neuron":
        return False
    try:
        from .. import neuron_sim
    except ImportError:  # pragma: no cover - the subpackage ships with the project
        return False
    return neuron_sim.is_enabled()


# Note [Compiling for the emulated neuron device]
# The emulated neuron device keeps its data in CPU memory and runs CPU kernels, so a
# region on it compiles with the CPU backend on zero-copy CPU views of its tensors:
# factory ops in the graph are retargeted to cpu, inputs are viewed as CPU tensors
# (in-place writes land in neuron memory), outputs are viewed back as neuron tensors,
# and the whole call counts as one kernel launch (neuron_sim.single_launch). On a real
# Trainium host (torch_neuronx) the "neuron" backend compiles the graph itself.
def for_device(spec: str | CompileFn, device_type: str) -> CompileFn:
    """The compile function of backend ``spec`` adapted to the device the window runs on
    (see the Note above)."""
    backend = backend_entry(spec)
    compile_fn = backend.compile
    if device_type in backend.native_devices or not _cpu_data_device(device_type):
        return compile_fn

    def compile_on_cpu(gm: fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        for node in gm.graph.nodes:
            dev = node.kwargs.get("device") if node.op == "call_function" else None
            if dev is not None and torch.device(dev).type == "neuron":
                node.kwargs = {**node.kwargs, "device": torch.device("cpu")}
        gm.recompile()
        return _on_cpu_views(compile_fn(gm, [_to_cpu(t) for t in example_inputs]))

    compile_on_cpu.examples_device = torch.device("cpu")  # type: ignore[attr-defined]
    return compile_on_cpu


def _to_cpu(t: Any) -> Any:
    from .. import neuron_sim

    return neuron_sim.to_cpu_view(t) if isinstance(t, torch.Tensor) and t.device.type == "neuron" else t


def _on_cpu_views(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """``compiled`` (a CPU artifact) called on CPU views of neuron tensors, as one launch."""
    from .. import neuron_sim

    def call(*args: Any) -> Any:
        with neuron_sim.single_launch():
            outs = compiled(*[_to_cpu(a) for a in args])
        return [neuron_sim.from_cpu(o) if isinstance(o, torch.Tensor) else o for o in outs]

    data = _dump_attached(compiled)
    if data is not None:
        setattr(call, ARTIFACT_BYTES, data)
    return call


def artifact_codec(spec: str | CompileFn, device_type: str) -> ArtifactCodec | None:
    """How ``spec``'s artifacts for ``device_type`` are saved and loaded; None: they are not.

    Example::

        >>> artifact_codec("eager", "cpu") is None, artifact_codec("inductor", "cpu") is not None
        (True, True)
    """
    backend = _REGISTRY.get(spec) if isinstance(spec, str) else None
    codec = backend.codec if backend is not None else None
    if codec is None or device_type == "cpu":
        return codec
    if device_type not in backend.native_devices and _cpu_data_device(device_type):
        # Note [Compiling for the emulated neuron device]: a CPU artifact on CPU views
        return ArtifactCodec(codec.dump, lambda data: _on_cpu_views(codec.load(data)))
    return None


assert tuple(_REGISTRY) == BUILTIN_BACKENDS  # config validates names against these


def register_backend(name: str, compile_fn: CompileFn, support: OpSupport | None = None,
                     debugging: bool = False, codec: ArtifactCodec | None = None,
                     native_devices: frozenset[str] | set[str] = frozenset()) -> None:
    """Add (or replace) a named backend; options accept ``backend=name`` from now on.
    ``native_devices``: device types it compiles for itself (:class:`Backend`).

    ``codec``: how its artifacts are saved to the disk cache and loaded back
    (:class:`ArtifactCodec`); without one, its regions compile in every process.

    Example::

        >>> register_backend("my_eager", lambda gm, example_inputs: gm, debugging=True)
        >>> from adaptive_eager import config
        >>> config.resolve(backend="my_eager").backend
        'my_eager'
    """
    _REGISTRY[name] = Backend(name, compile_fn, support or OpSupport(), debugging, codec,
                              frozenset(native_devices))


def unregister_backend(name: str) -> None:
    """Remove a backend :func:`register_backend` added (no-op when unknown).

    Example::

        >>> register_backend("tmp_eager", lambda gm, example_inputs: gm)
        >>> unregister_backend("tmp_eager"); "tmp_eager" in backend_names()
        False
    """
    if name in BUILTIN_BACKENDS:
        raise ValueError(f"backend {name!r} is built in and cannot be removed")
    _REGISTRY.pop(name, None)


def layout_decompositions(spec: str | CompileFn) -> Callable[[], Any] | None:
    """A zero-argument function returning the decompositions the backend traces with
    (op -> function), for naming the op whose layout a compiler changed (Note [Which
    op's layout disagreed], runtime/layouts.py); None when unknown. Inductor's table for
    "inductor"; for a callable backend (or a registered one), its ``decompositions``
    attribute: a mapping, or a function returning one.

    Example::

        >>> layout_decompositions("eager") is None
        True
        >>> len(layout_decompositions("inductor")()) > 100
        True
    """
    if spec == "inductor":
        def inductor_table() -> Any:
            from torch._inductor.decomposition import select_decomp_table  # noqa: PLC0415

            return select_decomp_table()

        return inductor_table
    entry = _REGISTRY.get(spec) if isinstance(spec, str) else None
    fn = spec if callable(spec) else (entry.compile if entry is not None else None)
    table = getattr(fn, "decompositions", None)
    if table is None:
        return None
    return table if callable(table) else (lambda: table)


def backend_names() -> list[str]:
    """Every backend name options accept (built-ins first)."""
    return list(_REGISTRY)


def get_backend(spec: str | CompileFn) -> CompileFn:
    """The compile function for a backend name or callable."""
    return spec if callable(spec) else backend_entry(spec).compile


def backend_support(spec: str | CompileFn) -> OpSupport:
    """What the backend can compile, as data (default: every ATen op except the usual)."""
    entry = _REGISTRY.get(spec) if isinstance(spec, str) else None
    return entry.support if entry else OpSupport()


def is_debugging(spec: str | CompileFn) -> bool:
    """Whether ``spec`` is a debugging backend (never demoted for speed)."""
    entry = _REGISTRY.get(spec) if isinstance(spec, str) else None
    return bool(entry and entry.debugging)


__all__ = ["CompileFn", "Backend", "BackendUnavailable", "ArtifactCodec", "ARTIFACT_BYTES", "artifact_codec",
           "backend_entry", "register_backend", "unregister_backend", "backend_names", "get_backend", "for_device",
           "backend_support", "is_debugging", "layout_decompositions"]
