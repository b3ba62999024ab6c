"""`specdeck chat`: a streaming chat in the terminal, through the same engine worker as the window."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.engine.params import DraftSettings, LoadSettings, SamplingSettings
from app.errors import AppError
from app.events import EngineCrashed, EngineError, Finished, Loaded, Token


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, type=Path, help="target model (GGUF)")
    parser.add_argument("--drafter", type=Path, help="drafter model (GGUF with the target's vocabulary)")
    parser.add_argument("--ngram", type=int, default=3, help="n-gram drafter key length (0 = off)")
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--system", default="", help="system prompt")
    parser.add_argument("--stats", action="store_true", help="print speed and acceptance after each answer")


def run(args: argparse.Namespace) -> int:
    from app.engine.client import EngineClient

    try:
        settings = LoadSettings(
            target_path=str(args.target),
            draft=DraftSettings(drafter_path=str(args.drafter) if args.drafter else None, ngram=args.ngram),
            n_ctx=args.ctx,
        ).validate()
        sampling = SamplingSettings(temperature=args.temperature, max_tokens=args.max_tokens).validate()
    except AppError as exc:
        print(f"specdeck chat: {exc}", file=sys.stderr)
        return 1
    client = EngineClient()
    client.start()
    try:
        client.load(settings)
        for event in client.events():
            if isinstance(event, EngineError | EngineCrashed):
                print(f"specdeck chat: {getattr(event, 'message', event)}", file=sys.stderr)
                return 1
            if isinstance(event, Loaded):
                print(f"[{event.target.name} loaded; empty line or Ctrl+D to quit]", file=sys.stderr)
        messages: list[dict[str, str]] = [{"role": "system", "content": args.system}] if args.system else []
        while True:
            try:
                line = input("> ")
            except EOFError:
                break
            if not line.strip():
                break
            messages.append({"role": "user", "content": line})
            client.generate(messages, sampling)
            answer = ""
            for event in client.events():
                if isinstance(event, Token):
                    sys.stdout.write(event.text)
                    sys.stdout.flush()
                elif isinstance(event, Finished):
                    answer = event.text
                    print()
                    if args.stats:
                        s = event.stats
                        print(f"[{s.decode_tps:.1f} tok/s, acceptance {s.acceptance:.2f}, "
                              f"{s.tokens_per_pass:.2f} tokens/pass, {event.reason}]", file=sys.stderr)
                elif isinstance(event, EngineError | EngineCrashed):
                    print(f"\nspecdeck chat: {event.message}", file=sys.stderr)
            messages.append({"role": "assistant", "content": answer})
    except KeyboardInterrupt:
        pass
    finally:
        client.close()
    return 0
