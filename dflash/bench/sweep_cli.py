"""`python -m dflash sweep`: a grid of settings → a sweep document (JSON), and on request its CSV and chart.

The document is rewritten after every finished cell (atomically), so Ctrl-C keeps the measured cells and
`--resume` continues them; a complete document with `--resume` measures nothing and only writes the CSV or chart
asked for. Every option error is named before any model loads, save those that need the models (a block size the
draft cannot verify, the time estimate).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import shlex
import signal
import sys
import threading
from pathlib import Path

from dflash.bench.sweep import SWEEP_PARAMS, CellResult, SweepSpec, conditions, load_sweep, parse_set, sweep_result, to_csv
from dflash.bench.cli import json_output
from dflash.cli import DefaultsHelp, add_model_args, check_model_args, check_output_path, engine_from_args
from dflash.errors import DFlashError, ValidationError
from dflash.loading.datasets import prompt_rows

CPU_MAX_SECONDS = 600.0  # the default --max-seconds on a CPU (none elsewhere)
PLOT_SUFFIXES = (".png", ".svg", ".pdf")
# Where a spec's ValidationError comes from on this command line (a Request field: --set, or --fix when fixed).
SPEC_OPTIONS = {"axes": "--set", "base": "--fix", "repeats": "--repeats", "max_new_tokens": "--max-new-tokens",
                "prompts": "--prompts"}


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("sweep", help="measure a grid of settings against the no-draft loop (τ, speed, identity)",
                              description="Measure every cell of a grid of 1-3 settings over a prompt set, each run "
                                          "interleaved with a no-draft run; write a JSON result, a CSV, a chart.",
                              formatter_class=DefaultsHelp)
    g = p.add_argument_group("sweep")
    g.add_argument("--set", action="append", metavar="NAME=V1,V2", dest="axes",
                   help=f"a setting to vary and its values, 1-3 times (x, y, facet): {', '.join(SWEEP_PARAMS)}; "
                        "without it, --resume takes the grid from --output")
    g.add_argument("--fix", action="append", metavar="NAME=VALUE",
                   help="a setting held for every cell, e.g. adaptive=fixed (the block size unchanged by a policy)")
    g.add_argument("--prompts", default="mt-bench", help="mt-bench | humaneval | sharegpt-heldout | FILE.jsonl (as in bench)")
    g.add_argument("--limit", type=int, default=4, help="first N prompts of the set")
    g.add_argument("--max-new-tokens", type=int, default=64, help="tokens per run")
    g.add_argument("--repeats", type=int, default=2, help="runs of each cell on each prompt (each with its no-draft run)")
    g.add_argument("--output", default="sweep.json", help="the result JSON, rewritten after every finished cell")
    g.add_argument("--csv", help="also write one row per cell here")
    g.add_argument("--plot", help=f"also draw the chart here ({', '.join(PLOT_SUFFIXES)}; needs matplotlib)")
    g.add_argument("--metric", choices=["speedup", "tau", "tok_s"], default="speedup", help="what --plot shows")
    again = g.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true",
                       help="continue --output's grid (a complete one: only --csv / --plot are written)")
    again.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    g.add_argument("--max-seconds", type=float,
                   help=f"refuse a grid estimated to take longer (default: {CPU_MAX_SECONDS:g} on a CPU, none on a GPU)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar (a line per cell is still printed)")
    add_model_args(p)
    p.set_defaults(func=cmd_sweep, _parser=p)
    return p


def cmd_sweep(args: argparse.Namespace) -> int:
    if args.no_draft:
        raise ValidationError("no_draft", "a sweep runs the no-draft loop itself, beside each cell: leave it out")
    out, csv_path, plot_path = _paths(args)
    check_model_args(args)  # --draft, --threads, --device: before any prompt set is read or model loads
    old = _read_old(out) if args.resume and out.exists() else None
    spec = _spec(args, old)
    if old is not None:
        _check_same(old["spec"], spec.to_dict(), out, ("axes", "prompts", "repeats", "max_new_tokens", "base"))
        if old["complete"]:
            _write_extras(old, csv_path, plot_path, args.metric)
            print(f"nothing to resume: {out} is complete (pass --overwrite to measure again)", file=sys.stderr)
            return 0
    engine, info = engine_from_args(args)
    host, models = _host_models(args, engine, info)
    spec = dataclasses.replace(spec, conditions=conditions(models, host))
    if old is not None:
        _check_same(old["spec"], spec.to_dict(), out, ("conditions",))
    done = {c["key"]: CellResult.from_dict(c) for c in (old or {}).get("cells", [])}
    _check_estimate(args, spec, engine, done)
    doc, stopped = _measure(args, spec, _engine_for(args, engine, info), done, out, host, models)
    if stopped:
        n = len(doc["cells"])
        print(f"interrupted: {n} of {len(spec.cells())} cells saved in {out}; the same command with --resume continues it"
              if n else "interrupted: no cell finished, nothing saved", file=sys.stderr)
        return 130
    _write_extras(doc, csv_path, plot_path, args.metric)
    print(table(doc))
    return 0


# -- options ------------------------------------------------------------------------------------------------------
def _paths(args: argparse.Namespace) -> tuple[Path, Path | None, Path | None]:
    """--output, --csv and --plot, checked before anything loads."""
    out = json_output(args)
    csv_path = Path(args.csv) if args.csv else None
    if csv_path is not None:
        check_output_path("csv", csv_path)
    plot_path = Path(args.plot) if args.plot else None
    if plot_path is not None:
        check_output_path("plot", plot_path)
        if plot_path.suffix.lower() not in PLOT_SUFFIXES:
            raise ValidationError("plot", f"must end in {', '.join(PLOT_SUFFIXES)}, got {args.plot!r}")
        if importlib.util.find_spec("matplotlib") is None:
            raise ValidationError("plot", "needs matplotlib: pip install matplotlib")
    return out, csv_path, plot_path


def _read_old(out: Path) -> dict:
    try:
        return load_sweep(out.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValidationError("resume", f"{out} is not a sweep result ({exc}); use --overwrite to start again") from None


def _spec(args: argparse.Namespace, old: dict | None) -> SweepSpec:
    """The grid the options give; without --set, the one --resume continues. Errors name the option."""
    if not args.axes:
        if old is None:
            raise ValidationError("--set", "give 1 to 3 settings to vary, as NAME=V1,V2 (or --resume an --output)")
        return SweepSpec.from_dict({**old["spec"], "conditions": {}})
    base = _fixed(args.fix or [])
    try:
        axes = tuple(parse_set(text) for text in args.axes)
        rows = prompt_rows(args.prompts, args.limit)
        prompts = tuple(r.text if r.ids is None else tuple(r.ids) for r in rows)
        return SweepSpec(axes, prompts, args.repeats, args.max_new_tokens, base)
    except ValidationError as exc:
        raise _named(exc, args) from None


def _fixed(texts: list[str]) -> dict:
    """--fix NAME=VALUE (each once) → the spec's base."""
    base = {}
    for text in texts:
        try:
            name, values = parse_set(text)
        except ValidationError as exc:
            raise DFlashError(f"--fix: {exc.message if exc.param == 'set' else exc}") from None
        if len(values) != 1 or name in base:
            raise DFlashError(f"--fix: {name}: give one value, once (NAME=VALUE)")
        base[name] = values[0]
    return base


def _named(exc: ValidationError, args: argparse.Namespace) -> DFlashError:
    """A spec's or a cell's error as the option the user typed: `--set: block_size: must be in [1, 64], got 100`."""
    fixed = {t.partition("=")[0].strip() for t in args.fix or []}
    if exc.param in SPEC_OPTIONS or exc.param in ("set", "limit"):
        option = SPEC_OPTIONS.get(exc.param, f"--{exc.param}")
        return DFlashError(f"{option}: {exc.message}")
    return DFlashError(f"{'--fix' if exc.param in fixed else '--set'}: {exc.param}: {exc.message}")


def _check_same(old: dict, new: dict, out: Path, keys: tuple[str, ...]) -> None:
    """--resume only continues the same grid, measured under the same conditions: what differs is named."""
    differ = []
    for k in keys:
        if k == "conditions":
            a, b = old.get(k) or {}, new.get(k) or {}
            differ += [f"{n} (was {a.get(n)!r}, now {b.get(n)!r})" for n in sorted(a.keys() | b.keys()) if a.get(n) != b.get(n)]
        elif old.get(k) != new.get(k):
            was, now = json.dumps(old.get(k)), json.dumps(new.get(k))
            differ.append(f"{k} (was {_short(was)}, now {_short(now)})")
    if differ:
        raise ValidationError("resume", f"{out} was made with another grid or setup: {'; '.join(differ)}; use "
                                        "--overwrite to start again")


def _short(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


# -- the models and the estimate ----------------------------------------------------------------------------------
def _host_models(args: argparse.Namespace, engine, info: dict) -> tuple[dict, dict]:
    from dflash.bench.machine import machine_info

    host = {**machine_info(info["device"]), "settings": info.get("host")}
    models = {"name": engine.name, "preset": args.preset, "target": info["target"], "draft": info.get("draft"),
              "dtype": info["dtype"], "device": info["device"], "trained_block_size": engine.trained_block_size}
    return host, models


def _engine_for(args: argparse.Namespace, engine, info: dict):
    """engine_for(dtype) of run_sweep: the loaded engine, or the same models loaded again in another dtype (with the
    threads chosen for the first), once."""
    engines = {None: engine, info["dtype"]: engine}

    def engine_for(dtype: str | None):
        if dtype not in engines:
            threads = args.threads or (engine.host.threads if engine.host is not None else None)
            print(f"[loading the models again in {dtype}]", file=sys.stderr)
            engines[dtype] = engine_from_args(argparse.Namespace(**{**vars(args), "dtype": dtype, "threads": threads}))[0]
        return engines[dtype]

    return engine_for


def _check_estimate(args: argparse.Namespace, spec: SweepSpec, engine, done: dict) -> None:
    from dflash.bench.sweep import estimate_seconds, host_costs

    step, verify = host_costs(engine)
    est = estimate_seconds(spec, step, verify, skip=done)
    todo = len(spec.cells()) - len(done)
    print(f"estimate: at most {est:.0f} s for {todo} cells × {len(spec.prompts)} prompts × {spec.repeats} repeats × 2 runs "
          f"(1-token step {step * 1000:.1f} ms, {engine.trained_block_size or 1}-token verify {verify * 1000:.1f} ms)",
          file=sys.stderr)
    limit = args.max_seconds if args.max_seconds is not None else (
        CPU_MAX_SECONDS if engine.target.device.type == "cpu" else None)
    if limit is not None and est > limit:
        raise ValidationError("max_seconds", f"the grid's estimate, {est:.0f} s, exceeds {limit:g} s: fewer cells, "
                                             "prompts, repeats or tokens, or a larger --max-seconds")


# -- measuring ----------------------------------------------------------------------------------------------------
class StopOnSigint:
    """`with StopOnSigint() as stop:` — the first Ctrl-C sets `stop` (the sweep ends between runs, keeping its
    finished cells); a second one interrupts at once (the previous handler is back)."""

    def __init__(self):
        self.event = threading.Event()

    def __enter__(self) -> threading.Event:
        self.previous = signal.signal(signal.SIGINT, self._handle)
        return self.event

    def _handle(self, *_):
        self.event.set()
        signal.signal(signal.SIGINT, self.previous)
        print("\nstopping after the current run (Ctrl-C again: at once)", file=sys.stderr)

    def __exit__(self, *exc) -> None:
        signal.signal(signal.SIGINT, self.previous)


def _measure(args, spec: SweepSpec, engine_for, done: dict, out: Path, host: dict, models: dict) -> tuple[dict, bool]:
    """Run the sweep, rewriting `out` after every finished cell; (the document, whether Ctrl-C stopped it)."""
    from tqdm import tqdm

    from dflash.bench.report import write_atomic
    from dflash.bench.sweep import run_sweep

    cells = dict(done)
    command = shlex.join(["python", "-m", "dflash", *args.argv])
    bar = tqdm(total=2 * len(spec.cells()) * len(spec.prompts) * spec.repeats, unit="run", disable=args.no_progress,
               file=sys.stderr, dynamic_ncols=True)
    try:
        with StopOnSigint() as stop:
            for p in run_sweep(engine_for, spec, done=done, should_stop=stop.is_set):
                bar.update(p.done - bar.n)
                bar.set_postfix_str(p.message)
                if p.cell is not None:
                    cells[p.cell.key] = p.cell
                    doc = {**sweep_result(spec, list(cells.values()), host=host, models=models), "command": command}
                    write_atomic(out, json.dumps(doc, indent=1) + "\n")
                    bar.write(_cell_line(p.message.split(" ")[1], p.cell, p.cell.key in done), file=sys.stderr)
    except ValidationError as exc:  # a cell the models cannot run, found before the first run
        raise _named(exc, args) from None
    finally:
        bar.close()
    doc = {**sweep_result(spec, list(cells.values()), host=host, models=models), "command": command}
    return doc, stop.is_set()


def _cell_line(where: str, c: CellResult, read_back: bool) -> str:
    s = c.speedup
    same = "identical" if c.identical else f"{c.differs} of {c.n} differ ({c.ties} ties)"
    drift = f", drift {c.drift_tokens} tokens" if c.lossy else ""
    return (f"cell {where} {c.key}: speedup {s[0]:.2f}× ({s[1]:.2f}–{s[2]:.2f}), τ {c.tau[0]:.2f}, "
            f"{c.tok_s[0]:.1f} tok/s, {same}{drift}" + (" [read back]" if read_back else ""))


def _write_extras(doc: dict, csv_path: Path | None, plot_path: Path | None, metric: str) -> None:
    from dflash.bench.report import write_atomic

    if csv_path is not None:
        write_atomic(csv_path, to_csv(doc))
        print(f"[wrote {csv_path}]", file=sys.stderr)
    if plot_path is not None:
        from dflash.bench.sweep_plot import sweep_figure

        sweep_figure(doc, metric).savefig(plot_path, dpi=150)
        print(f"[wrote {plot_path}]", file=sys.stderr)


def table(doc: dict) -> str:
    """A plain-text table of the cells, the best and the default named."""
    rows = [("cell", "speedup (q25-q75)", "tau", "tok/s", "n", "output")]
    for c in doc["cells"]:
        s = c["speedup"]
        same = "identical" if c["identical"] else f"{c['differs']} differ" + (" (lossy)" if c["lossy"] else "")
        mark = " *best" if c["key"] == doc["best"] else ""
        mark += " (default)" if c["key"] == doc["default"] else ""
        rows.append((c["key"] + mark, f"{s[0]:.2f}x ({s[1]:.2f}-{s[2]:.2f})", f"{c['tau'][0]:.2f}",
                     f"{c['tok_s'][0]:.1f}", str(c["n"]), same))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    best = doc["best"] or "none (no lossless cell gave identical output)"
    return "\n".join([*lines, f"best lossless: {best}"])

