"""Options: one source of truth for every knob of the runtime.

Each option can be set three ways, strongest first:

1. keyword arguments: ``adaptive_eager(window_size=64)``;
2. ``config.patch(window_size=64)`` (a context manager, nests);
3. environment variables: ``ADAPTIVE_EAGER_WINDOW_SIZE=64``;

and otherwise takes its default. Unknown names and bad values raise
:class:`ConfigError`, which names the option, where the value came from and what
is accepted; nothing falls back silently to a default.

Example::

    >>> from adaptive_eager import config
    >>> config.resolve(window_size=8).window_size
    8
    >>> with config.patch(compile_after=5):
    ...     config.resolve().compile_after
    5
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

from ._env import OFF_WORDS, ON_WORDS  # how on and off are spelled

ENV_PREFIX = "ADAPTIVE_EAGER_"

BUILTIN_BACKENDS = ("inductor", "aot_eager", "eager", "neuron")


class ConfigError(ValueError):
    """A bad option name or value. The message names the option and what is accepted."""


def _parse_bool(name: str, value: Any, origin: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        low = value.strip().lower()
        if low in ON_WORDS:
            return True
        if low in OFF_WORDS:
            return False
    raise ConfigError(
        f"adaptive_eager option {name!r}{origin}: expected a boolean "
        f"(True/False, or 1/0/true/false/yes/no/on/off), got {value!r}"
    )


def _int_parser(minimum: int) -> Callable[[str, Any, str], int]:
    def parse(name: str, value: Any, origin: str) -> int:
        if isinstance(value, bool):
            ok = False
        elif isinstance(value, int):
            ok, out = True, value
        elif isinstance(value, str):
            try:
                out, ok = int(value.strip()), True
            except ValueError:
                ok = False
        else:
            ok = False
        if not ok or out < minimum:
            raise ConfigError(
                f"adaptive_eager option {name!r}{origin}: expected an integer >= {minimum}, got {value!r}"
            )
        return out

    return parse


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


def _parse_bytes(name: str, value: Any, origin: str) -> int:
    """A size in bytes: an int, or a string such as ``512MiB``, ``2G``; ``auto`` is 0."""
    out = None
    if isinstance(value, int) and not isinstance(value, bool):
        out = value
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        if text == "auto":
            return 0
        digits = text.rstrip("kmgib")
        unit = text[len(digits):]
        try:
            if unit in _UNITS and digits:
                out = int(float(digits) * _UNITS[unit])
        except ValueError:
            out = None
    if out is None or out < 0:
        raise ConfigError(f"adaptive_eager option {name!r}{origin}: expected a size in bytes "
                          f"(e.g. 268435456, 256MiB, 1G) or 'auto', got {value!r}")
    return out


def _float_parser(minimum: float) -> Callable[[str, Any, str], float]:
    def parse(name: str, value: Any, origin: str) -> float:
        try:
            if isinstance(value, bool):
                raise ValueError
            out = float(value.strip() if isinstance(value, str) else value)
        except (TypeError, ValueError):
            out = None
        if out is None or out != out or out < minimum:
            raise ConfigError(
                f"adaptive_eager option {name!r}{origin}: expected a number >= {minimum}, got {value!r}"
            )
        return out

    return parse


# Device types torch's parser knows (torch.device's error lists them); those this torch
# build accepts are offered in the error message.
_TORCH_DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu", "hpu", "xla", "meta", "mtia", "maia", "ipu",
                       "lazy", "vulkan", "hip", "ve", "fpga", "opengl", "opencl", "ideep")
# Accepted before anything registers them: torch_neuronx (or adaptive_eager.neuron_sim)
# renames PrivateUse1 to "neuron" when it is imported, which may be after options are read.
_FUTURE_DEVICE_TYPES = ("neuron",)


def accepted_device_types() -> tuple[str, ...]:
    """Device types the ``device`` option accepts: torch's, PrivateUse1's name, "neuron"."""
    import torch  # local: keeps `import adaptive_eager.config` light

    out = []
    for t in _TORCH_DEVICE_TYPES:
        try:
            out.append(torch.device(t).type)
        except RuntimeError:
            pass
    pu1 = torch._C._get_privateuse1_backend_name()
    for t in (pu1, *_FUTURE_DEVICE_TYPES):
        if t not in out:
            out.append(t)
    return tuple(out)


# Note [device="auto"]
# The default device is "auto": the accelerator the process has
# (``torch.accelerator.current_accelerator()``: cuda, or the neuron device once torch_neuronx
# or the emulator registered it), else the CPU. It is resolved when Options are made
# (``Options.__post_init__``), so every stage sees a concrete device type; the Options keep
# whether it was chosen (``device_auto``) and the report says so. On a machine without an
# accelerator "auto" is "cpu", exactly the old default. An unmodified program that runs
# on the emulated neuron device (ADAPTIVE_EAGER_NEURON_SIM=1) no longer needs
# ADAPTIVE_EAGER_DEVICE=neuron beside ADAPTIVE_EAGER=1.
AUTO_DEVICE = "auto"


def auto_device() -> str:
    """The device type ``device="auto"`` stands for now (Note [device="auto"]).

    Example::

        >>> auto_device() in accepted_device_types()
        True
    """
    import torch  # local: keeps `import adaptive_eager.config` light

    accelerator = getattr(torch, "accelerator", None)
    try:
        if accelerator is not None and accelerator.is_available():
            found = accelerator.current_accelerator()
            if found is not None:
                return found.type
    except RuntimeError:  # an accelerator that fails to initialize is not one to defer
        pass
    return "cuda" if torch.cuda.is_available() else "cpu"


def _parse_device(name: str, value: Any, origin: str) -> str:
    import torch  # local: keeps `import adaptive_eager.config` light

    if isinstance(value, torch.device):
        return value.type
    text = value.strip() if isinstance(value, str) else ""
    if text.lower() == AUTO_DEVICE:
        return AUTO_DEVICE
    if text:
        try:
            return torch.device(text).type
        except RuntimeError:
            kind = text.split(":", 1)[0]
            if kind in _FUTURE_DEVICE_TYPES:
                return kind
    raise ConfigError(
        f"adaptive_eager option {name!r}{origin}: expected 'auto' or a device type, one of "
        f"{', '.join(accepted_device_types())}, got {value!r}"
    )


def did_you_mean(word: str, choices: Any) -> str:
    """``" (did you mean 'x'?)"`` for the closest of ``choices`` (difflib), or ``""``.

    Example::

        >>> did_you_mean("window_sise", OPTION_NAMES)
        " (did you mean 'window_size'?)"
    """
    import difflib  # noqa: PLC0415 - only on the error path

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _registered_backends() -> tuple[str, ...]:
    """The built-ins and every name given to ``runtime.register_backend`` so far."""
    import sys  # noqa: PLC0415

    # registered: imported (and not still importing in another thread)
    names = getattr(sys.modules.get("adaptive_eager.runtime.backends"), "backend_names", None)
    return tuple(names()) if names is not None else BUILTIN_BACKENDS


def _parse_backend(name: str, value: Any, origin: str) -> Any:
    if callable(value):
        return value
    if isinstance(value, str) and value.strip() in BUILTIN_BACKENDS:
        return value.strip()
    known = _registered_backends()
    if isinstance(value, str) and value.strip() in known:
        return value.strip()
    hint = did_you_mean(value.strip(), known) if isinstance(value, str) else ""
    raise ConfigError(
        f"adaptive_eager option {name!r}{origin}: expected one of {', '.join(known)} "
        f"or a callable (GraphModule, example_inputs) -> callable, got {value!r}{hint}"
    )


def _parse_str(name: str, value: Any, origin: str) -> str:
    if isinstance(value, str):
        return value
    raise ConfigError(f"adaptive_eager option {name!r}{origin}: expected a string, got {value!r}")


@dataclass(frozen=True)
class _Spec:
    default: Any
    parse: Callable[[str, Any, str], Any]
    doc: str


# Note [One table of options]
# Every option is declared here once: its default, its parser (which is also its
# validator) and its documentation. Options, the environment variables, patch() and
# the README's table are all derived from this table.
_SPECS: dict[str, _Spec] = {
    "device": _Spec(AUTO_DEVICE, _parse_device, "device type whose ops are deferred: auto (the "
                    "accelerator torch.accelerator reports, else cpu), cpu, cuda, neuron"),
    "backend": _Spec(
        "inductor", _parse_backend,
        "compile backend for hot regions: inductor, aot_eager, eager, neuron, or a callable",
    ),
    "window_size": _Spec(256, _int_parser(1), "ops buffered before a window is flushed"),
    "window_bytes": _Spec(
        0, _parse_bytes,
        "a window is flushed once the real tensors it keeps alive that the program dropped "
        "exceed this many bytes (e.g. 256MiB; 0 or auto: 256 MiB on the CPU, 2% of an "
        "accelerator's memory); a quarter of it bounds a compiled region's checked first call",
    ),
    "compile_after": _Spec(2, _int_parser(1), "times a region is seen before it is compiled"),
    "async_compile": _Spec(True, _parse_bool, "compile in a background thread (never stall the program)"),
    "pace_compiles": _Spec(
        False, _parse_bool,
        "while a compile is in flight and the program's threads fill the cores, run the compile "
        "worker in slices (10 ms of every 30): a 175 ms step slows ~1.2x instead of ~3x, but "
        "the compile lands 4-6x later and an 8 ms step still slows 1.3-2.5x (off: full speed)",
    ),
    "cache_size": _Spec(512, _int_parser(1), "compiled regions kept (LRU)"),
    "cache_dir": _Spec(
        "auto", _parse_str,
        "folder of the compiled-region cache kept across processes: auto ($XDG_CACHE_HOME/"
        "adaptive_eager or ~/.cache/adaptive_eager), a path, or '' / off (no disk cache)",
    ),
    "cache_max_mb": _Spec(1024, _int_parser(1), "size bound of that folder (least recently used "
                          "entries deleted)"),
    "meta_cache_size": _Spec(8192, _int_parser(16), "memoized output-metadata entries (LRU)"),
    "min_region_work": _Spec(
        4096, _int_parser(0), "regions that touch fewer elements than this run eagerly"
    ),
    "compile_timeout_s": _Spec(
        120.0, _float_parser(0.0), "a compile taking longer marks its region eager-only"
    ),
    "verify_compiled": _Spec(
        True, _parse_bool, "check a compiled region's first outputs against eager once"
    ),
    "adaptive_passthrough": _Spec(
        True, _parse_bool, "stop deferring when nothing in the windows is worth compiling"
    ),
    "warmup": _Spec(
        True, _parse_bool,
        "run eagerly until the program first reads a value or ends an optimizer step "
        "(its first iteration), then start capturing; needs adaptive_passthrough",
    ),
    "fast_path": _Spec(
        True, _parse_bool,
        "match windows that recur against their recorded trace instead of recording them "
        "again (capture near the floor; off: every op is recorded)",
    ),
    "optimizer_step": _Spec(
        True, _parse_bool,
        "run a qualifying torch.optim step as one compiled function over params, grads, "
        "state and 0-d hyperparameters, captured or parked (off: the step runs as before)",
    ),
    "optimizer_step_after_ms": _Spec(
        100.0, _float_parser(0.0),
        "an optimizer's steps run eagerly until they have cost this much (ms of the program "
        "thread's CPU) before its step is traced and compiled: a step cheaper over the whole "
        "run cannot repay the compile (0: from its second step)",
    ),
    "report": _Spec("", _parse_str, "print the report at exit: '' (off), 1/stderr, or a file "
                    "path (JSON when it ends in .json)"),
    "strict": _Spec(
        False, _parse_bool,
        "raise at the program's line on a sync or a fallback, naming it and what to change "
        "(like torch.compile's fullgraph=True); routine flushes (block exit, full window, "
        "optimizer step) never raise",
    ),
}

OPTION_NAMES = tuple(_SPECS)


@dataclass(frozen=True)
class Options:
    """A complete, validated set of options. Build one with :func:`resolve`.

    Example::

        >>> Options().window_size
        256
    """

    device: str = _SPECS["device"].default
    backend: Any = _SPECS["backend"].default
    window_size: int = _SPECS["window_size"].default
    window_bytes: int = _SPECS["window_bytes"].default
    compile_after: int = _SPECS["compile_after"].default
    async_compile: bool = _SPECS["async_compile"].default
    pace_compiles: bool = _SPECS["pace_compiles"].default
    cache_size: int = _SPECS["cache_size"].default
    cache_dir: str = _SPECS["cache_dir"].default
    cache_max_mb: int = _SPECS["cache_max_mb"].default
    meta_cache_size: int = _SPECS["meta_cache_size"].default
    min_region_work: int = _SPECS["min_region_work"].default
    compile_timeout_s: float = _SPECS["compile_timeout_s"].default
    verify_compiled: bool = _SPECS["verify_compiled"].default
    adaptive_passthrough: bool = _SPECS["adaptive_passthrough"].default
    warmup: bool = _SPECS["warmup"].default
    fast_path: bool = _SPECS["fast_path"].default
    optimizer_step: bool = _SPECS["optimizer_step"].default
    optimizer_step_after_ms: float = _SPECS["optimizer_step_after_ms"].default
    report: str = _SPECS["report"].default
    strict: bool = _SPECS["strict"].default

    def __post_init__(self) -> None:
        # Note [device="auto"]: resolved once, here; `device_auto` remembers the choice.
        chosen = self.device == AUTO_DEVICE
        if chosen:
            object.__setattr__(self, "device", auto_device())
        object.__setattr__(self, "_device_auto", chosen)

    @property
    def device_auto(self) -> bool:
        """Whether ``device`` was chosen by ``device="auto"`` (Note [device="auto"]).

        Example::

            >>> Options(device="cpu").device_auto, Options().device_auto
            (False, True)
        """
        return self._device_auto  # type: ignore[attr-defined]

    def replace(self, **changes: Any) -> "Options":
        """A copy with ``changes`` validated and applied."""
        parsed = {name: _parse(name, value, "") for name, value in changes.items()}
        if "device" not in parsed and self.device_auto:
            parsed["device"] = AUTO_DEVICE  # chosen afresh, as the original was
        return dataclasses.replace(self, **parsed)


assert tuple(f.name for f in dataclasses.fields(Options)) == OPTION_NAMES


def _check_name(name: str, origin: str = "") -> None:
    if name not in _SPECS:
        hint = did_you_mean(name, OPTION_NAMES)
        raise ConfigError(
            f"unknown adaptive_eager option {name!r}{origin}{hint}; known options: "
            f"{', '.join(OPTION_NAMES)}"
        )


def _parse(name: str, value: Any, origin: str) -> Any:
    _check_name(name, origin)
    return _SPECS[name].parse(name, value, origin)


# Note [patch() stack]
# patch() pushes a dict of overrides; resolve() reads them under keyword arguments.
# This is the module's one piece of mutable state, a documented registry like
# torch._dynamo.config's: process-wide on purpose, so that a patch set in a test
# reaches modes created in other threads.
_PATCHES: list[dict[str, Any]] = []


def env_overrides(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Options set through ``ADAPTIVE_EAGER_<NAME>`` variables, validated.

    The switches (``ADAPTIVE_EAGER``, ``ADAPTIVE_EAGER_NEURON_SIM``, ``_LOG``,
    ``_FUEL``; Note [Switches]) are not options: they are validated here, not
    returned; any other unknown ``ADAPTIVE_EAGER_*`` name raises, so a typo in a
    variable name is reported rather than ignored.

    Example::

        >>> env_overrides({"ADAPTIVE_EAGER_WINDOW_SIZE": "32"})
        {'window_size': 32}
    """
    environ = os.environ if environ is None else environ
    check_switches(environ)
    out: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX) or key in NON_OPTION_VARIABLES:
            continue
        name = key[len(ENV_PREFIX):].lower()
        if name not in _SPECS:
            known = [ENV_PREFIX + n.upper() for n in OPTION_NAMES] + sorted(NON_OPTION_VARIABLES)
            raise ConfigError(
                f"unknown adaptive_eager option {name!r} (from environment variable "
                f"{key}){did_you_mean(key, known)}; options: {', '.join(OPTION_NAMES)} (as "
                f"{ENV_PREFIX}<NAME>), switches: {', '.join(sorted(NON_OPTION_VARIABLES))}"
            )
        out[name] = _parse(name, raw, f" (from environment variable {key})")
    return out


# Note [Switches]
# Environment variables that are not options: each is read where it acts (autoload,
# logging, the emulated device, the compile service), and all are validated here, with
# the options, whenever options are resolved: a bad value raises a ConfigError naming
# the variable at the user's line (or, under ADAPTIVE_EAGER=1, is logged and the
# program runs plain eager), never a bare error later.
def _parse_level(name: str, value: Any, origin: str) -> str:
    from ._logging import LEVEL_NAMES  # noqa: PLC0415 - a leaf module

    low = str(value).strip().lower()
    if low in LEVEL_NAMES or low in OFF_WORDS or low == "none":
        return low
    raise ConfigError(f"adaptive_eager switch {name}{origin}: expected a logging level, one of "
                      f"{', '.join(LEVEL_NAMES)} (or 0/off), got {value!r}")


def _parse_fuel(name: str, value: Any, origin: str) -> int | None:
    if isinstance(value, str) and not value.strip():
        return None
    return _int_parser(0)(name, value, origin)


SWITCHES: dict[str, tuple[Callable[[str, Any, str], Any], str]] = {
    "ADAPTIVE_EAGER": (_parse_bool, "turn the runtime on at `import torch` (1/0)"),
    "ADAPTIVE_EAGER_NEURON_SIM": (_parse_bool, "register the emulated neuron device (1/0)"),
    "ADAPTIVE_EAGER_NEURON_SIM_LATENCY_US": (
        _float_parser(0.0), "the emulated device's launch latency in µs (with ..._NEURON_SIM=1)"),
    "ADAPTIVE_EAGER_NEURON_SIM_ASYNC": (
        _parse_bool, "emulated launches asynchronous (1, the default) or synchronous (0)"),
    "ADAPTIVE_EAGER_LOG": (_parse_level, "stderr logging at this level: debug, info, warning, error"),
    "ADAPTIVE_EAGER_FUEL": (_parse_fuel, "compile at most this many regions (bisecting a miscompile)"),
}
# Variables that share the prefix but are switches, not options.
NON_OPTION_VARIABLES = frozenset(SWITCHES)


def switch(variable: str, environ: Mapping[str, str] | None = None) -> Any:
    """The parsed value of switch ``variable`` (its default when unset), or ConfigError.

    Example::

        >>> switch("ADAPTIVE_EAGER_FUEL", {"ADAPTIVE_EAGER_FUEL": "3"})
        3
    """
    environ = os.environ if environ is None else environ
    parse = SWITCHES[variable][0]
    return parse(variable, environ.get(variable, ""), f" (from environment variable {variable})")


# Note [Switches that never stop a block]
# ADAPTIVE_EAGER and ADAPTIVE_EAGER_NEURON_SIM act once, at ``import torch`` (autoload),
# and ADAPTIVE_EAGER_LOG only sets up stderr logging: none of them is an option of a
# block. A bad value used to raise ConfigError at every ``with adaptive_eager():`` of a
# program that never asked for them. Now it is warned about once per process, naming
# the variable and what happens instead (the switch stays off; logging keeps its
# default level), and the block runs. The warning's key is shared with the places that
# act on the variable (autoload, _logging.configure_from_env), so whichever meets the
# bad value first warns and the others stay quiet. ADAPTIVE_EAGER_FUEL changes what a
# block compiles, so a bad value raises like a bad option does.
WARN_ONLY_SWITCHES = {
    "ADAPTIVE_EAGER": "staying off",
    "ADAPTIVE_EAGER_NEURON_SIM": "the emulated neuron device stays off",
    "ADAPTIVE_EAGER_NEURON_SIM_LATENCY_US": "the emulated device keeps its launch latency",
    "ADAPTIVE_EAGER_NEURON_SIM_ASYNC": "the emulated device keeps its launch model",
    "ADAPTIVE_EAGER_LOG": "logging keeps its default level",
}


def check_switches(environ: Mapping[str, str] | None = None) -> None:
    """Validate every switch that is set (Note [Switches]); raise ConfigError on the first
    bad one, or warn once for a switch that is not a block's (Note [Switches that never
    stop a block])."""
    environ = os.environ if environ is None else environ
    for variable in SWITCHES:
        if variable in environ:
            try:
                switch(variable, environ)
            except ConfigError as e:
                if variable not in WARN_ONLY_SWITCHES:
                    raise
                from ._logging import bad_switch_key, warn_once  # noqa: PLC0415 - a leaf module

                value = environ[variable]
                warn_once(bad_switch_key(variable, value), "adaptive_eager: %s=%r ignored, %s: %s",
                          variable, value, WARN_ONLY_SWITCHES[variable], e)


def resolve(environ: Mapping[str, str] | None = None, **overrides: Any) -> Options:
    """Defaults < environment < patch() < keyword arguments, validated.

    Example::

        >>> resolve(backend="eager").backend
        'eager'
    """
    values: dict[str, Any] = {name: spec.default for name, spec in _SPECS.items()}
    values.update(env_overrides(environ))
    for layer in _PATCHES:
        values.update(layer)
    for name, value in overrides.items():
        values[name] = _parse(name, value, "")
    return Options(**values)


@contextlib.contextmanager
def patch(**overrides: Any) -> Iterator[None]:
    """Override options for the duration of a ``with`` block (validated on entry).

    Example::

        >>> with patch(window_size=4):
        ...     resolve().window_size
        4
    """
    layer = {name: _parse(name, value, "") for name, value in overrides.items()}
    _PATCHES.append(layer)
    try:
        yield
    finally:
        _PATCHES.remove(layer)


def describe() -> list[tuple[str, str, Any, str]]:
    """Rows ``(name, env var, default, doc)`` for documentation and ``--help``."""
    return [(n, ENV_PREFIX + n.upper(), s.default, s.doc) for n, s in _SPECS.items()]


__all__ = [
    "ConfigError", "Options", "OPTION_NAMES", "resolve", "patch", "env_overrides", "describe",
    "SWITCHES", "WARN_ONLY_SWITCHES", "switch", "check_switches", "accepted_device_types",
    "auto_device", "AUTO_DEVICE",
]
