"""`dflash-playground` (and `python app.py`): serve the playground on http://127.0.0.1:7860.

`--port N` (or GRADIO_SERVER_PORT) changes the port; Hugging Face Spaces sets GRADIO_SERVER_NAME=0.0.0.0. Loads the default
preset (SmolLM2-135M-Instruct + our DFlash draft) before serving, so the first visitor does not wait; on a Space
(or with DFLASH_AUTO_INSTALL=1) it first installs the default target's GGUF package if missing (ui/space_setup.py).
`--draft DIR` (or DFLASH_DRAFT) serves the default target with another draft directory, e.g. one that
`python -m dflash train fit --out DIR` wrote. DFLASH_THREADS sets torch's CPU threads. DFLASH_PRESETS lists the
presets visitors may load besides the default (comma-separated registry names, or "all" for every preset this host
can run; unset: the default only), see ui/engines.py for how their loads are bounded.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import NoReturn

from dflash.registry import draft_dir_problem

DRAFT_ENV = "DFLASH_DRAFT"
PORT_ENV, DEFAULT_PORT = "GRADIO_SERVER_PORT", 7860
PROG = "dflash-playground"


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number in [1, 65535], got {text!r}")
    return port


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
               "may load besides the default, or 'all'), DFLASH_DRAFT (as --draft).")
    parser.add_argument("--draft", metavar="DIR", default=os.environ.get(DRAFT_ENV) or None,
                        help="serve the default target with this DFlash draft directory (config.json + "
                             "model.safetensors, e.g. what `python -m dflash train fit --out DIR` wrote) instead of "
                             "the shipped draft")
    parser.add_argument("--port", type=_port, default=None,
                        help=f"port to serve on (default: GRADIO_SERVER_PORT, else {DEFAULT_PORT})")
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
    return args


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no calls home (offline machines, privacy)
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from dflash.errors import DFlashError, ValidationError
    from dflash.host import env_threads
    from ui import build_demo, launch_kwargs
    from ui.engines import EngineProvider
    from ui.space_setup import prepare_default_target

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
    build_demo(provider).launch(**launch_kwargs(server_port=args.port))
