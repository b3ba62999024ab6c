"""Whether the adaptive depth drafts a verbatim copy on a busy CPU, through the window's engine worker.

    .venv/bin/python benchmarks/copy_under_load.py [--target MODEL.gguf] [--homes 5] [--hogs 2]
                                                   [--prompts code,paragraph] [--max-tokens 300]

Issue 38: on a busy 2-core machine, an answer that copies text the model has already seen (a 30-line function
output whole with one rename; the model's own earlier paragraph, repeated) ran at k = 0 on nearly every pass
although its suffix proposals were right. This script starts ``--hogs`` busy-loop processes (one per core by
default; killed at the end), and then, per prompt and per home, a fresh engine worker (``EngineClient``, as
the window uses) in a fresh SPECDECK_HOME, so nothing measured earlier is reused: load (which times every
width on the busy CPU), then the prompt's turns in one chat, greedy, as the window answers (the paragraph
prompt: the model writes a paragraph, then is asked to repeat it). It prints, for the last answer of each
home, where the copy starts (the first pass whose output begins COPY_RUN tokens that the chat before it
holds verbatim), how many passes after that the first draft came, the k history in runs, and the answer's
tokens per pass; a home passes when drafting engages within ENGAGE_PASSES of the copy's start and
tokens/pass is at least MIN_TOKENS_PER_PASS. ``uptime``'s load average is printed before, after each
prompt, and at the end. The exit status is 1 when any home fails.

For a before/after comparison, run a copy of this script from a checkout of the older commit (``git worktree
add /tmp/old COMMIT``, then ``.venv/bin/python /tmp/old/benchmarks/copy_under_load.py``): the script puts its
own checkout first on the path, and the workers inherit it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.engine.client import EngineClient  # noqa: E402
from app.events import EngineCrashed, EngineError, Finished, Loaded, PassStats, Token  # noqa: E402
from app.params import NGRAM_KEY_LENGTH, DraftSettings, LoadSettings, SamplingSettings  # noqa: E402

# The engine worker is spawned, and a spawned process imports this script as __mp_main__: with --plan-log set,
# the worker sends the depth policy's per-pass debug lines (what ``plan`` weighed) to a file of its own.
if __name__ == "__mp_main__" and os.environ.get("SPECDECK_PLAN_LOG"):
    import logging

    _handler = logging.FileHandler(Path(os.environ["SPECDECK_PLAN_LOG"]) / f"plan-{os.getpid()}.log", delay=True)
    _handler.setFormatter(logging.Formatter("%(message)s"))
    logging.getLogger("app.engine.adaptive").addHandler(_handler)
    logging.getLogger("app.engine.adaptive").setLevel(logging.DEBUG)

ENGAGE_PASSES = 20
MIN_TOKENS_PER_PASS = 3.0
COPY_RUN = 12  # answer tokens in a row that the prompt holds: the copy has started
TIMEOUT = 600.0

FUNCTION = '''def summarize_orders(rows, currency="EUR"):
    total = 0.0
    count = 0
    largest = None
    by_customer = {}
    skipped = []
    for row in rows:
        if not row or row.get("status") == "cancelled":
            skipped.append(row)
            continue
        amount = float(row.get("amount", 0.0))
        if row.get("currency", currency) != currency:
            skipped.append(row)
            continue
        total += amount
        count += 1
        customer = row.get("customer", "unknown").strip().lower()
        by_customer[customer] = by_customer.get(customer, 0.0) + amount
        if largest is None or amount > largest["amount"]:
            largest = {"customer": customer, "amount": amount}
    average = total / count if count else 0.0
    ranked = sorted(by_customer.items(), key=lambda item: item[1], reverse=True)
    return {
        "total": round(total, 2),
        "count": count,
        "average": round(average, 2),
        "largest": largest,
        "top": ranked[:3],
        "skipped": len(skipped),
    }'''

# Per prompt, the user's turns: each is answered in turn in the same chat, and the last answer is measured.
PROMPTS: dict[str, list[str]] = {
    "code": ["Rename the variable total to grand_total in this function and output the whole function in one "
             "code block, nothing else.\n\n```python\n" + FUNCTION + "\n```"],
    "paragraph": ["Write about 150 words about lighthouses and their keepers.", "Say that again, exactly the same."],
}


@dataclass
class Answer:
    """One greedy answer: per pass, the depth chosen and the text it emitted."""

    source: str = ""  # the chat before the answer: what it may copy
    ks: list[int] = field(default_factory=list)
    texts: list[list[str]] = field(default_factory=list)  # per pass, the pieces of its tokens
    tokens_per_pass: float = 0.0
    hindsight_first: float = 0.0  # share of passes whose suffix proposal was right on its first token

    def copy_start(self) -> int | None:
        """The first pass from which COPY_RUN tokens of the answer appear verbatim in the chat before it."""
        pieces = [(p, piece) for p, texts in enumerate(self.texts) for piece in texts]
        for i in range(len(pieces) - COPY_RUN + 1):
            if pieces[i][0] != pieces[i - 1][0] if i else True:  # pieces that start a pass
                run = "".join(piece for _, piece in pieces[i : i + COPY_RUN])
                if run.strip() and run in self.source:
                    return pieces[i][0]
        return None

    def engaged_after(self) -> int | None:
        """Passes from the copy's start to its first drafting pass (0: the start itself drafted)."""
        start = self.copy_start()
        if start is None:
            return None
        return next((i - start for i in range(start, len(self.ks)) if self.ks[i] > 0), None)

    @property
    def text(self) -> str:
        return "".join(piece for texts in self.texts for piece in texts)

    def ok(self) -> bool:
        engaged = self.engaged_after()
        return engaged is not None and engaged <= ENGAGE_PASSES and self.tokens_per_pass >= MIN_TOKENS_PER_PASS

    def summary(self) -> str:
        engaged = self.engaged_after()
        return (f"copy from pass {self.copy_start()}, drafts "
                f"{'never' if engaged is None else f'{engaged} passes later'}, {len(self.ks)} passes, "
                f"{self.tokens_per_pass:.2f} tokens/pass, proposals right on their first token in hindsight "
                f"{self.hindsight_first:.0%}; k: {runs(self.ks)}")


def runs(ks: list[int]) -> str:
    """The k history as value×count runs: "0×12 2 0×11 16×9"."""
    out: list[str] = []
    i = 0
    while i < len(ks):
        j = i
        while j < len(ks) and ks[j] == ks[i]:
            j += 1
        out.append(f"{ks[i]}×{j - i}" if j - i > 1 else str(ks[i]))
        i = j
    return " ".join(out)


def await_loaded(client: EngineClient) -> None:
    for event in client.events(timeout=TIMEOUT):
        if isinstance(event, Loaded):
            return
        if isinstance(event, (EngineError, EngineCrashed)):
            raise RuntimeError(f"the load failed: {event}")
    raise RuntimeError("the worker ended without loading")


def one_answer(client: EngineClient, messages: list[dict[str, str]], max_tokens: int) -> tuple[Answer, str]:
    """A greedy answer to ``messages``: its passes, and its text."""
    client.generate(messages, SamplingSettings(temperature=0.0, max_tokens=max_tokens))
    answer, pending = Answer(), list[str]()
    for event in client.events(timeout=TIMEOUT):
        if isinstance(event, Token):
            pending = list(event.pieces)
        elif isinstance(event, PassStats):
            answer.ks.append(event.k)
            answer.texts.append(pending)
            pending = []
        elif isinstance(event, Finished):
            stats = event.stats
            answer.tokens_per_pass = stats.tokens_per_pass
            first = stats.proposal_matches[0] if stats.proposal_matches else 0
            answer.hindsight_first = first / stats.proposal_passes if stats.proposal_passes else 0.0
            return answer, event.text
        elif isinstance(event, (EngineError, EngineCrashed)):
            raise RuntimeError(f"the answer failed: {event}")
    raise RuntimeError("the worker ended without finishing the answer")


def copy_in_fresh_home(target: str, turns: list[str], max_tokens: int = 300) -> Answer:
    """Load ``target`` in a fresh SPECDECK_HOME (nothing measured before) through the window's engine worker,
    answer ``turns`` in one chat, and return the last answer, with the earlier messages as its copy source."""
    before = os.environ.get("SPECDECK_HOME")
    with tempfile.TemporaryDirectory(prefix="specdeck-copy-") as home:
        os.environ["SPECDECK_HOME"] = home  # the worker is spawned with this environment
        client = EngineClient(log_dir=Path(home) / "logs", watchdog_seconds=TIMEOUT)
        try:
            # The window's drafting settings on a fresh home (app.storage.settings.fresh_load); its history of
            # earlier answers is empty there.
            client.load(LoadSettings(target_path=target, draft=DraftSettings(ngram=NGRAM_KEY_LENGTH)).validate())
            await_loaded(client)
            messages: list[dict[str, str]] = []
            for turn in turns:
                messages.append({"role": "user", "content": turn})
                answer, text = one_answer(client, messages, max_tokens)
                messages.append({"role": "assistant", "content": text})
            answer.source = "\n".join(m["content"] for m in messages[:-1])
            return answer
        finally:
            client.close()
            if before is None:
                os.environ.pop("SPECDECK_HOME", None)
            else:
                os.environ["SPECDECK_HOME"] = before


# Each busy loop stops by itself once this process is gone, however it ended.
HOG = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass"


@contextmanager
def hogs(n: int) -> Iterator[None]:
    """``n`` processes that each keep a core busy while the block runs."""
    procs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def default_target() -> str:
    from app.library.demo_install import install_demo_models

    return str(install_demo_models()[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=None, help="default: the SmolLM2 demo model")
    parser.add_argument("--homes", type=int, default=5)
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--prompts", default=",".join(PROMPTS))
    parser.add_argument("--max-tokens", type=int, default=300, help="per answer")
    parser.add_argument("--show", action="store_true", help="print each answer's text")
    parser.add_argument("--plan-log", default=None, help="a folder for each worker's per-pass plan lines")
    args = parser.parse_args()
    if args.plan_log:
        Path(args.plan_log).mkdir(parents=True, exist_ok=True)
        os.environ["SPECDECK_PLAN_LOG"] = str(Path(args.plan_log).resolve())
    target = args.target or default_target()
    failed = 0
    import app.engine.adaptive

    print(f"policy: {app.engine.adaptive.__file__}")  # the workers import the same (they inherit sys.path)
    print(f"before: {uptime()}", flush=True)
    with hogs(args.hogs):
        for name in args.prompts.split(","):
            for home in range(1, args.homes + 1):
                answer = copy_in_fresh_home(target, PROMPTS[name], args.max_tokens)
                failed += not answer.ok()
                print(f"{name} home {home}: {'ok  ' if answer.ok() else 'FAIL'} {answer.summary()}", flush=True)
                if args.show:
                    print(answer.text, flush=True)
            print(f"  {uptime()}", flush=True)
    print(f"after: {uptime()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
