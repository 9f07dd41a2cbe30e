"""`dflash-playground` (and `python app.py`): serve the playground on http://127.0.0.1:7860.

`--port N` (or GRADIO_SERVER_PORT) changes the port; Hugging Face Spaces sets GRADIO_SERVER_NAME=0.0.0.0 (both are
checked before anything loads: a port in use or an address not of this machine is one line, exit status 2). Loads the default
preset (SmolLM2-135M-Instruct + our DFlash draft) before serving, so the first visitor does not wait; on a Space
(or with DFLASH_AUTO_INSTALL=1) it first installs the default target's GGUF package if missing (ui/space_setup.py).
`--draft DIR` (or DFLASH_DRAFT) serves the default target with another draft directory, e.g. one that
`python -m dflash train fit --out DIR` wrote. DFLASH_THREADS sets torch's CPU threads. DFLASH_PRESETS lists the
presets visitors may load besides the default (comma-separated registry names, or "all" for every preset this host
can run; unset: the default only), see ui/engines.py for how their loads are bounded.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import socket
import sys
from typing import NoReturn

from dflash.loading.registry import draft_dir_problem

DRAFT_ENV = "DFLASH_DRAFT"
PORT_ENV, DEFAULT_PORT = "GRADIO_SERVER_PORT", 7860
HOST_ENV, DEFAULT_HOST = "GRADIO_SERVER_NAME", "127.0.0.1"
# Server limits an operator may set: variable → (Settings field, unit it is given in, least, most). Defaults: the
# Settings fields' (ui/handlers.py); docs/deploy.md, "Limits", says what each bounds. At most 8 requests waiting:
# half of Gradio's queue (16 places, ui/layout.py), so that replays and trace loads always find room in it.
LIMITS = {"DFLASH_TRACE_MEMORY_MB": ("trace_memory_mb", 1, 256, 10**6),
          "DFLASH_IDLE_MINUTES": ("session_idle_s", 60, 1, 7 * 24 * 60),
          "DFLASH_EXPORTS_MB": ("exports_mb", 1, 64, 10**6),
          "DFLASH_WAITING": ("waiting_generations", 1, 1, 8),
          "DFLASH_SWEEP_MAX_SECONDS": ("sweep_max_s", 1, 10, 7 * 24 * 3600)}
PROG = "dflash-playground"


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number in [1, 65535], got {text!r}")
    return port


def _sweep_seconds(text: str) -> int:
    _, _, lo, hi = LIMITS["DFLASH_SWEEP_MAX_SECONDS"]
    if not text.isdigit() or not lo <= int(text) <= hi:
        raise argparse.ArgumentTypeError(f"must be a whole number of seconds in [{lo}, {hi}], got {text[:40]!r}")
    return int(text)


class _Parser(argparse.ArgumentParser):
    """Every command-line error in one line, `dflash-playground: error: --option: …`, as the CLI's (no usage block)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PROG}: error: {message.removeprefix('argument ')} (usage: python app.py --help)\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line, checked before torch is imported: a wrong --draft answers at once."""
    parser = _Parser(
        prog=PROG, description="Serve the DFlash playground on http://127.0.0.1:7860 (--port or GRADIO_SERVER_PORT: another "
                                "port).",
        epilog="Environment: DFLASH_THREADS (torch's CPU threads), DFLASH_DTYPE (float32 = exact | bfloat16 = fast), "
               "DFLASH_PROBE (0: skip the CPU settings probe; refresh: measure again), DFLASH_PRESETS (presets visitors "
               "may load besides the default, or 'all'), DFLASH_DRAFT (as --draft); the server's limits "
               "DFLASH_TRACE_MEMORY_MB, DFLASH_IDLE_MINUTES, DFLASH_EXPORTS_MB, DFLASH_WAITING, DFLASH_SWEEP_MAX_SECONDS "
               "(docs/deploy.md).")
    parser.add_argument("--draft", metavar="DIR", default=os.environ.get(DRAFT_ENV) or None,
                        help="serve the default target with this DFlash draft directory (config.json + "
                             "model.safetensors, e.g. what `python -m dflash train fit --out DIR` wrote) instead of "
                             "the shipped draft")
    parser.add_argument("--port", type=_port, default=None,
                        help=f"port to serve on (default: GRADIO_SERVER_PORT, else {DEFAULT_PORT})")
    parser.add_argument("--sweep-max-seconds", type=_sweep_seconds, default=None, metavar="N",
                        help="refuse a Sweep whose estimated time is longer (default: DFLASH_SWEEP_MAX_SECONDS, "
                             "else 300)")
    args = parser.parse_args(argv)
    if args.port is None:
        try:
            args.port = _port(os.environ.get(PORT_ENV) or str(DEFAULT_PORT))
        except argparse.ArgumentTypeError as exc:
            parser.error(f"{PORT_ENV}: {exc}")
    if args.draft is not None:
        problem = draft_dir_problem(args.draft)
        if problem:
            parser.error(f"--draft: {problem}")
    problem = address_problem(os.environ.get(HOST_ENV) or DEFAULT_HOST, args.port)
    if problem:
        parser.error(problem)
    args.limits = {}
    for name, (field, unit, lo, hi) in LIMITS.items():
        raw = os.environ.get(name, "").strip()
        if raw:
            value = int(raw) if raw.isdigit() else None
            if value is None or not lo <= value <= hi:
                parser.error(f"{name}: must be a whole number in [{lo}, {hi}], got {raw[:40]!r}")
            args.limits[field] = value * unit
    if args.sweep_max_seconds is not None:  # the flag over the variable
        args.limits["sweep_max_s"] = args.sweep_max_seconds
    return args


def address_problem(host: str, port: int) -> str | None:
    """Why the server could not listen on host:port (None: it can), found before the model loads (~10 s): Gradio
    would find it only after that, with a traceback. Binds as Gradio does (SO_REUSEADDR, and 127.0.0.1 too, where it
    checks the port), then lets go; a port taken in between still fails in Gradio."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (OSError, UnicodeError):
        return f"{HOST_ENV}: {host!r} is not a host name or address of this machine"
    places = [(family, kind, proto, address)] + ([(socket.AF_INET, kind, 0, ("127.0.0.1", port))]
                                                 if address[0] != "127.0.0.1" else [])
    for family, kind, proto, address in places:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(address)
            except OSError as exc:
                return _bind_error(exc, host, port)
    return None


def _bind_error(exc: OSError, host: str, port: int) -> str:
    if exc.errno == errno.EADDRINUSE:
        return f"--port: port {port} is already in use on {host} (choose another with --port N or {PORT_ENV})"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{HOST_ENV}: {host!r} is not an address of this machine"
    return f"--port: cannot listen on {host}:{port} ({exc.strerror or type(exc).__name__}; --port or {PORT_ENV})"


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no calls home (offline machines, privacy)
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from dflash.errors import DFlashError, ValidationError
    from dflash.loading.host import env_threads
    from . import build_demo, launch_kwargs
    from .engines import EngineProvider
    from .handlers import Settings
    from .space_setup import prepare_default_target

    try:
        threads = env_threads()
        # registry presets only: the default (with the operator's --draft, if given) and DFLASH_PRESETS
        provider = EngineProvider(default_draft=args.draft)
    except ValidationError as exc:  # a bad DFLASH_THREADS or DFLASH_PRESETS: one line naming it, no traceback
        raise SystemExit(f"{PROG}: {exc}") from None
    if threads:
        import torch

        torch.set_num_threads(threads)

    prepare_default_target()  # before any load, and before ZeroGPU forks its worker (which inherits sys.path)
    try:
        provider.get("default")
    except DFlashError as exc:  # e.g. a --draft made for another target: one line, no traceback
        message = str(exc)
        if args.draft is not None and message.startswith("draft: "):
            print(f"{PROG}: error: --draft: {message.removeprefix('draft: ')}", file=sys.stderr)
            raise SystemExit(2) from None
        raise SystemExit(f"{PROG}: {message}") from None
    build_demo(provider, settings=Settings(**args.limits)).launch(**launch_kwargs(server_port=args.port))
