"""`specdeck serve`: an OpenAI-compatible endpoint and Prometheus /metrics on the speculative engine."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from app.cli.exit_codes import EXIT_BAD_OPTIONS, EXIT_ERROR
from app.cli.load_options import add_load_arguments, load_settings
from app.errors import AppError, SettingsError
from app.params import NGRAM_KEY_LENGTH, DraftSettings
from app.safe_text import terminal_safe
from app.serve.protocol import DEFAULT_BODY_LIMIT, Limits
from app.serve.server import DEFAULT_PORT
from app.storage.pair_stats import measured_start


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, type=Path, help="target model (GGUF)")
    parser.add_argument("--drafter", type=Path, help="drafter model (GGUF with the target's vocabulary)")
    parser.add_argument("--ngram", type=int, default=NGRAM_KEY_LENGTH, help="suffix drafter's shortest match (0 = off)")
    parser.add_argument("--mtp", action="store_true",
                        help="draft with the target's own MTP heads (Qwen3.5/3.6 GGUFs that ship them)")
    parser.add_argument("--k", type=int, help="fixed draft depth (default: adaptive)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1; any other needs an API key)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 = any)")
    keys = parser.add_mutually_exclusive_group()
    keys.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on every route but /health (other "
                      "users of this computer can read it in the process list: prefer --api-key-file or "
                      f"{API_KEY_ENV})")
    keys.add_argument("--api-key-file", type=Path, metavar="PATH",
                      help=f"read the API key from this file (its first line); without either option the key is "
                      f"taken from the environment variable {API_KEY_ENV}, if set")
    parser.add_argument("--max-tokens", type=int, help="most tokens one request may ask for (default: --ctx)")
    parser.add_argument("--body-limit", type=int, default=DEFAULT_BODY_LIMIT, help="largest request body in bytes")
    parser.add_argument("--queue", type=int, default=4, help="requests that may wait while one is answered")
    parser.add_argument("--no-history", action="store_true", help="do not save API requests to the chat history")
    add_load_arguments(parser)


API_KEY_ENV = "SPECDECK_API_KEY"
MAX_KEY_FILE_BYTES = 64 << 10


def api_key(args: argparse.Namespace) -> str | None:
    """The key from --api-key, --api-key-file or the environment, in that order; SettingsError for a bad file."""
    if args.api_key is not None:
        return str(args.api_key)
    path: Path | None = args.api_key_file
    if path is None:
        return os.environ.get(API_KEY_ENV) or None
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise SettingsError(f"The API key file {path} cannot be read: {exc.strerror or exc}.") from None
    if len(raw) > MAX_KEY_FILE_BYTES:
        raise SettingsError(f"The API key file {path} is over {MAX_KEY_FILE_BYTES // 1024} kB; it holds one key.")
    try:
        lines = raw.decode("utf-8-sig").splitlines()
    except UnicodeDecodeError:
        raise SettingsError(f"The API key file {path} is not UTF-8 text.") from None
    key = lines[0].strip() if lines else ""
    if not key:
        raise SettingsError(f"The API key file {path} is empty; write the key on its first line.")
    return key


def run(args: argparse.Namespace) -> int:
    from app.paths import data_dir
    from app.serve.metrics import ServeMetrics
    from app.serve.runner import EngineRunner
    from app.serve.server import ServeOptions, Server
    from app.storage.history import FILE_NAME

    target, drafter = str(args.target), str(args.drafter) if args.drafter else None
    try:
        draft = DraftSettings(drafter_path=drafter, ngram=args.ngram, mtp=args.mtp, adaptive=args.k is None,
                              k=args.k if args.k is not None else 4, model_start=measured_start(target, drafter))
        settings = load_settings(args, target, draft.validate())
        options = ServeOptions(host=args.host, port=args.port, api_key=api_key(args),
                               limits=Limits(body_bytes=max(args.body_limit, 1024),
                                             max_tokens=args.max_tokens or settings.n_ctx),
                               max_waiting=max(args.queue, 0)).check()
    except (AppError, ValueError) as exc:
        print(f"specdeck serve: {terminal_safe(exc, one_line=True)}", file=sys.stderr)
        return EXIT_BAD_OPTIONS

    def log(line: str) -> None:
        # Model names, file names and engine messages come from files: never raw to the terminal.
        print(f"[specdeck serve] {terminal_safe(line, one_line=True)}", file=sys.stderr, flush=True)

    unusable: list[str] = []
    metrics = ServeMetrics()
    server: Server | None = None

    def give_up(message: str) -> None:
        unusable.append(message)
        if server is not None:
            server.uvicorn.should_exit = True

    runner = EngineRunner(settings, metrics, history_path=None if args.no_history else data_dir() / FILE_NAME,
                          log=log, on_unusable=give_up)
    server = Server(runner, metrics, options)
    try:
        server.bind()  # before the model loads: a port in use is said at once, not after a long load
    except OSError as exc:
        print(f"specdeck serve: cannot listen on {options.host}:{options.port}: "
              f"{terminal_safe(exc.strerror or exc, one_line=True)}; choose another --port or stop the program "
              "using this one.", file=sys.stderr)
        return EXIT_BAD_OPTIONS
    log(f"serving {runner.model_id} on {server.base_url}/v1 (loading the model; "
        "/health answers 503 until it is ready)")
    _say_template(target, log)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        print(f"specdeck serve: could not listen on {options.host}:{options.port}: "
              f"{terminal_safe(exc, one_line=True)}", file=sys.stderr)
        return EXIT_ERROR
    if unusable:
        print(f"specdeck serve: the model cannot be served: {terminal_safe(unusable[0], one_line=True)}",
              file=sys.stderr)
        return EXIT_ERROR
    return 0


def _say_template(target: str, log: Callable[[str], None]) -> None:
    """Say when the model's chat template is refused and answers use the fallback format (as chat does)."""
    from app.engine.template_status import template_status

    try:
        status = template_status(target)
    except AppError:
        return  # the load reports an unreadable file in its own words
    if not status.ok:
        log(status.message)
