"""The ``adaptive-eager`` command (also ``python -m adaptive_eager``).

Commands::

    adaptive-eager demo [--model M] [--steps N] [--plot FILE]   train eager vs adaptive, compare
    adaptive-eager run SCRIPT [ARGS...]        run a script under the runtime, then print the report
    adaptive-eager run -m MODULE [ARGS...]     the same for a module
    adaptive-eager explain SCRIPT [ARGS...]    run it, then list sync sites and fallbacks with fixes
    adaptive-eager bench [BENCH ARGS...]       the benchmark suite (adaptive_eager.benchmarks)
    adaptive-eager options                     the options table (names, env vars, defaults)
    adaptive-eager cache [info|clear]          the compiled-region cache on disk: show or empty it

``run`` and ``explain`` accept runtime options before the script:
``--backend eager``, ``--device cpu`` or any option as ``-o name=value``.

Example::

    $ adaptive-eager run --backend eager train.py --epochs 1
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback
from typing import Any, Sequence


def _options_from(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    for item in getattr(args, "option", None) or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"adaptive-eager: -o expects name=value, got {item!r}")
        opts[name.strip()] = value
    for name in ("backend", "device"):
        if getattr(args, name, None) is not None:
            opts[name] = getattr(args, name)
    return opts


def _add_runtime_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", help="compile backend (inductor, aot_eager, eager, neuron)")
    p.add_argument("--device", help="device type to defer (auto, cpu, cuda, neuron; default auto)")
    p.add_argument("-o", "--option", action="append", metavar="NAME=VALUE",
                   help="any runtime option, e.g. -o window_size=128 (repeatable)")


def _version() -> str:
    try:
        from importlib.metadata import version  # noqa: PLC0415

        return version("adaptive-eager")
    except Exception:  # noqa: BLE001 - not installed: the source tree's
        from . import __version__  # noqa: PLC0415

        return __version__


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="adaptive-eager",
        description="Adaptive eager execution for PyTorch: defer ops into micro-graphs, "
                    "compile the hot ones, flush wherever Python can observe a value.")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    demo = sub.add_parser("demo", help="train a model eagerly and under adaptive eager; compare "
                                       "loss curves, speed and where the time went")
    demo.add_argument("--model", default="mlp", choices=("mlp", "gpt"),
                      help="mlp (default: a wide MLP whose AdamW step fuses) or gpt (the "
                           "benchmarks' GPT)")
    demo.add_argument("--steps", type=int, default=None,
                      help="training steps per run (default: 250 for mlp, 200 for gpt)")
    demo.add_argument("--backend", default="inductor",
                      help="compile backend for adaptive eager (default inductor)")
    demo.add_argument("--size", default="small", choices=("tiny", "small", "medium"),
                      help="model size (default small)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--threads", type=int, default=1,
                      help="torch threads for both runs (default 1: stable timings on a busy "
                           "machine; 0 keeps torch's default)")
    demo.add_argument("--plot", metavar="FILE",
                      help="draw the loss curves and where the time went into FILE (.png, .svg, "
                           ".pdf; needs matplotlib: pip install \"adaptive-eager[plot]\")")
    demo.add_argument("--json", metavar="FILE",
                      help="write both runs' per-step wall and CPU times and the summary's "
                           "figures to FILE (JSON)")
    demo.add_argument("-o", "--option", action="append", metavar="NAME=VALUE",
                      help="any runtime option, e.g. -o window_size=128 (repeatable)")

    for name, helptext in (("run", "run a Python script (or -m module) under adaptive eager, "
                                   "then print the report"),
                           ("explain", "run a script under adaptive eager, then list its sync "
                                       "sites and fallback ops with what to change")):
        sp = sub.add_parser(name, help=helptext)
        _add_runtime_options(sp)
        sp.add_argument("-m", dest="module", action="store_true",
                        help="TARGET is a module name (like python -m)")
        sp.add_argument("--report", default="stderr",
                        help="where the report goes: stderr (default), stdout or a file path "
                             "(JSON when it ends in .json)" if name == "run" else argparse.SUPPRESS)
        sp.add_argument("--json", action="store_true",
                        help="the report as JSON (adaptive_eager.stats().to_json())" if name == "run"
                        else "sync sites and fallbacks as JSON, on stdout")
        sp.add_argument("target", metavar="SCRIPT", help="script path (or module name with -m)")
        sp.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")

    bench = sub.add_parser("bench", help="run the benchmark suite (arguments go to it; try --help)",
                           add_help=False)
    bench.add_argument("args", nargs=argparse.REMAINDER)

    cache = sub.add_parser("cache", help="the compiled-region cache kept across processes: "
                                         "where it is and what it holds (info), or empty it (clear)")
    cache.add_argument("action", nargs="?", default="info", choices=("info", "clear"))
    cache.add_argument("-o", "--option", action="append", metavar="NAME=VALUE",
                       help="cache options, e.g. -o cache_dir=PATH (default: ADAPTIVE_EAGER_CACHE_DIR)")

    opts = sub.add_parser("options", help="print the runtime options: names, env variables, defaults")
    opts.add_argument("--markdown", action="store_true", help="as the README's Markdown table")
    return p


def _run_target(args: argparse.Namespace) -> int:
    """Run the script/module as __main__ under enable(); return its exit status."""
    from . import process, session

    options = _options_from(args)
    session.resolve_options(**options)  # a bad option fails here, before the script runs
    old_argv, old_path0 = sys.argv[:], sys.path[0] if sys.path else None
    if args.module:
        sys.argv = [args.target, *args.args]
    else:
        sys.argv = [args.target, *args.args]
        sys.path.insert(0, os.path.dirname(os.path.abspath(args.target)))
    status = 0
    process.enable(**options)
    try:
        if args.module:
            runpy.run_module(args.target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(args.target, run_name="__main__")
    except SystemExit as e:
        code = e.code
        status = code if isinstance(code, int) else (0 if code is None else 1)
        if not isinstance(code, int) and code is not None:
            print(code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - report the script's error like python does
        traceback.print_exc()
        status = 1
    finally:
        try:
            process.disable()
        finally:
            sys.argv = old_argv
            if not args.module and sys.path and old_path0 is not None:
                sys.path.pop(0)
    return status


def cmd_run(args: argparse.Namespace) -> int:
    from . import session
    from .reporting import emit_report

    session.reset_stats()
    status = _run_target(args)
    emit_report(session.stats(), args.report, title=f"adaptive_eager report: {args.target}",
                as_json=args.json)
    return status


def cmd_explain(args: argparse.Namespace) -> int:
    from . import session
    from .reporting import explain_data, explain_lines

    session.reset_stats()
    status = _run_target(args)
    s = session.stats()
    if args.json:
        import json  # noqa: PLC0415

        print(json.dumps({"target": args.target, **explain_data(s)}, indent=2))
        return status
    print(f"\nadaptive-eager explain: {args.target}  ({s.ops_captured:,} ops captured, "
          f"{s.total_flushes:,} flushes)", file=sys.stderr)
    for line in explain_lines(s):
        print(line, file=sys.stderr)
    return status


def cmd_demo(args: argparse.Namespace) -> int:
    import torch

    from .demo import PlotUnavailable, plot, pyplot, run_demo, summarize

    if args.steps is not None and args.steps < 1:
        raise SystemExit("adaptive-eager demo: --steps must be >= 1")
    try:
        if args.plot:
            pyplot()  # before training, not after it
    except PlotUnavailable as e:
        print(f"adaptive-eager demo: {e}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    options = _options_from(args)
    options.pop("backend", None)
    result = run_demo(steps=args.steps, backend=args.backend, size=args.size, seed=args.seed,
                      model=args.model, out=sys.stdout, **options)
    print(summarize(result))
    print(result.report)
    if args.plot:
        plot(result, args.plot)
        print(f"plot written to {args.plot}")
    if args.json:
        import json  # noqa: PLC0415

        from .demo import record  # noqa: PLC0415

        with open(args.json, "w") as f:
            json.dump(record(result), f)
        print(f"per-step times written to {args.json}")
    return 0 if result.agree else 1


def cmd_bench(args: argparse.Namespace) -> int:
    from .benchmarks.run import main as bench_main  # shipped with the package

    return int(bench_main(list(args.args)) or 0)


def options_markdown() -> str:
    """The options table in Markdown, as in README.md (generated from config.describe())."""
    from .config import describe

    rows = ["| option | environment variable | default | what it does |", "|---|---|---|---|"]
    rows += [f"| `{name}` | `{env}` | `{default!r}` | {doc} |" for name, env, default, doc in describe()]
    return "\n".join(rows)


def cmd_options(args: argparse.Namespace) -> int:
    from .config import describe

    if getattr(args, "markdown", False):
        print(options_markdown())
        return 0
    rows = describe()
    width = max(len(r[1]) for r in rows)
    for name, env, default, doc in rows:
        print(f"{name:<22} {env:<{width}}  default {default!r:<12} {doc}")
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    from .config import resolve
    from .runtime.disk_cache import DiskCache, resolve_dir

    options = resolve(**_options_from(args))
    path = resolve_dir(options.cache_dir)
    if path is None:
        print(f"the compiled-region cache is off (cache_dir={options.cache_dir!r})")
        return 0
    cache = DiskCache(path, options.cache_max_mb << 20)
    if args.action == "clear":
        if not os.path.isdir(path):
            print(f"{path}: no cache there, nothing to clear")
            return 0
        n = cache.clear()
        info = cache.info()
        print(f"{path}: {n} entries deleted" if info.usable else f"{path}: not cleared: {info.problem}")
        return 0 if info.usable else 1
    if not os.path.isdir(path):
        print(f"{path}: empty (created when a region is first compiled), bound "
              f"{options.cache_max_mb} MB")
        return 0
    info = cache.info()
    if not info.usable:
        print(f"{path}: not used: {info.problem}")
        return 1
    print(f"{path}: {info.entries} entries, {info.bytes / 2**20:.1f} MB of {info.max_bytes / 2**20:.0f} MB "
          "(least recently used entries are deleted beyond it)")
    return 0


COMMANDS = {"demo": cmd_demo, "run": cmd_run, "explain": cmd_explain, "bench": cmd_bench,
            "options": cmd_options, "cache": cmd_cache}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``adaptive-eager`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":  # pass everything, --help included, to the suite
        return cmd_bench(argparse.Namespace(args=argv[1:]))
    args = build_parser().parse_args(argv)
    from .config import ConfigError

    try:
        return COMMANDS[args.command](args)
    except ConfigError as e:
        print(f"adaptive-eager: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
