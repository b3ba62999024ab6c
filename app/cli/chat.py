"""`specdeck chat`: a streaming chat in the terminal, through the same engine worker as the window.

Everything the model or the model file says is printed through ``terminal_safe``. After an engine crash
the worker is restarted and the model reloaded, by ``app.engine.supervisor``'s rule (the partial answer stays
in the conversation, marked as cut); when that fails, the command says so and exits non-zero.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from app.ceiling.memory import placement
from app.cli.exit_codes import EXIT_ENGINE_CRASHED, EXIT_ERROR
from app.cli.load_options import add_load_arguments, load_settings
from app.engine.client import EngineClient
from app.engine.supervisor import gave_up_sentence, may_restart, restart_worker
from app.errors import AppError
from app.events import EngineCrashed, EngineError, Finished, Loaded, PromptProcessed, Token
from app.params import NGRAM_KEY_LENGTH, DraftSettings, LoadSettings, SamplingSettings
from app.safe_text import terminal_safe
from app.storage.measured import keep_answer
from app.storage.pair_stats import measured_start

CUT_MARK = "[answer cut off: the engine stopped]"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, type=Path, help="target model (GGUF)")
    parser.add_argument("--drafter", type=Path, help="drafter model (GGUF with the target's vocabulary)")
    parser.add_argument("--ngram", type=int, default=NGRAM_KEY_LENGTH, help="suffix drafter's shortest match (0 = off)")
    parser.add_argument("--mtp", action="store_true",
                        help="draft with the target's own MTP heads (Qwen3.5/3.6 GGUFs that ship them)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--system", default="", help="system prompt")
    parser.add_argument("--stats", action="store_true", help="print speed and acceptance after each answer")
    add_load_arguments(parser)


def say(text: str, stream: TextIO | None = None) -> None:
    """One line for the user on stderr (the answer alone goes to stdout), made safe for the terminal."""
    print(f"specdeck chat: {terminal_safe(text, one_line=True)}", file=stream or sys.stderr, flush=True)


class TerminalChat:
    """The conversation and the engine behind it; each method returns False once the engine is lost."""

    def __init__(self, client: EngineClient, settings: LoadSettings, sampling: SamplingSettings,
                 stats: bool) -> None:
        self.client = client
        self.settings = settings
        self.sampling = sampling
        self.stats = stats
        self.messages: list[dict[str, str]] = []
        self.load_crashed = False  # the last load ended in a crash (another try may do)

    def load(self) -> bool:
        self.client.load(self.settings)
        self.load_crashed = False
        for event in self.client.events():
            if isinstance(event, EngineError | EngineCrashed):
                say(event.message or "The engine stopped while loading the model.")
                self.load_crashed = isinstance(event, EngineCrashed)
                return False
            if isinstance(event, Loaded):
                name = terminal_safe(event.target.name, one_line=True)
                where = f", {placement(event.devices, event.main_gpu is not None)}" if event.devices else ""
                print(f"[{name} loaded{terminal_safe(where, one_line=True)}; empty line or Ctrl+D to quit]",
                      file=sys.stderr, flush=True)
                for note in (event.gpu_layers_note, self.settings.context_note(event.n_ctx)):
                    if note:
                        say(terminal_safe(note, one_line=True))
        return True

    def recover(self, crash: EngineCrashed) -> bool:
        """Report a crash, then restart the worker and reload; False (and why) when that is not possible."""
        say(crash.message or "The engine stopped.")
        while may_restart(self.client.crashes_on_load):
            say("Restarting the engine and reloading the model…")
            restart_worker(self.client, None)
            if self.load():
                return True
            if not self.load_crashed:
                say("The engine could not be restarted, so the chat cannot go on.")
                return False
        say(f"{gave_up_sentence(self.client.crashes_on_load)} Your conversation is above.")
        return False

    def check_idle(self) -> bool:
        """A crash while waiting for the user is reported (and recovered) before the next message."""
        event = self.client.poll(0.0)
        while event is not None:
            if isinstance(event, EngineCrashed):
                return self.recover(event)
            event = self.client.poll(0.0)
        return True

    def ask(self, line: str) -> bool:
        self.messages.append({"role": "user", "content": line})
        self.client.generate(self.messages, self.sampling)
        answer: list[str] = []
        for event in self.client.events():
            if isinstance(event, PromptProcessed) and event.warning:
                say(event.warning)
            elif isinstance(event, Token):
                answer.append(event.text)
                sys.stdout.write(terminal_safe(event.text))
                sys.stdout.flush()
            elif isinstance(event, Finished):
                print()
                self.messages.append({"role": "assistant", "content": event.text})
                draft = self.settings.draft
                keep_answer(self.settings.target_path, draft.drafter_path, draft.ngram, event.stats, mtp=draft.mtp)
                if self.stats:
                    s = event.stats
                    print(f"[{s.decode_tps:.1f} tok/s, acceptance {s.acceptance:.2f}, "
                          f"{s.tokens_per_pass:.2f} tokens/pass, {event.reason}]", file=sys.stderr)
                return True
            elif isinstance(event, EngineError):
                if answer:
                    print()
                # The request was refused (too long, bad text): drop it so the next turn is not refused too.
                self.messages.pop()
                say(event.message)
                return True
            elif isinstance(event, EngineCrashed):
                if answer:
                    # The partial answer stays in the conversation; the mark is only shown, never sent.
                    print(f"\n{CUT_MARK}")
                    self.messages.append({"role": "assistant", "content": "".join(answer)})
                else:
                    print(file=sys.stdout)
                    self.messages.pop()  # nothing was answered: the user can send it again
                    say("Your message was not answered; send it again once the engine is back.")
                return self.recover(event)
        return True


def run(args: argparse.Namespace) -> int:
    target, drafter = str(args.target), str(args.drafter) if args.drafter else None
    try:
        settings = load_settings(args, target, DraftSettings(drafter_path=drafter, ngram=args.ngram, mtp=args.mtp,
                                                             model_start=measured_start(target, drafter)))
        sampling = SamplingSettings(temperature=args.temperature, max_tokens=args.max_tokens).validate()
    except AppError as exc:
        say(str(exc))
        return EXIT_ERROR
    client = EngineClient()
    client.start()
    chat = TerminalChat(client, settings, sampling, args.stats)
    try:
        if not chat.load():
            return EXIT_ERROR
        if args.system:
            chat.messages.append({"role": "system", "content": args.system})
        while True:
            try:
                line = input("> ")
            except EOFError:
                break
            if not line.strip():
                break
            if not chat.check_idle() or not chat.ask(line):
                return EXIT_ENGINE_CRASHED
    except KeyboardInterrupt:
        pass
    finally:
        client.close()
    return 0
