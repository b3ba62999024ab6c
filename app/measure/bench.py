"""`specdeck bench`: the one way SpecDeck's speed is measured.

Every decode runs in the engine worker process, as in the app, so a model that aborts llama.cpp ends the
bench with one sentence instead of taking it down. Each answer is timed inside the worker (one ``BenchRun``
request, one ``BenchResult`` reply, nothing through the pipe in between), so the pipe costs nothing in the
timed window. With a baseline each prompt's speculative and plain runs alternate, in alternating order, in
one worker, so that a noisy machine drifts both the same way; speedups are ratios of those side-by-side
runs, and repeats give their median and spread. ``raw`` adds a bare llama_decode loop, to show what the
engine's own Python costs on top of llama.cpp. Every rate comes from ``app.events.RunCounts``.

The command line (``app.cli.bench``), ``tune``, the window's Tune and the benchmarks all describe a run with
a ``BenchConfig`` and get a ``BenchReport`` back.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO, TypeVar

from app.ceiling.memory import is_rpc
from app.errors import AppError, SettingsError
from app.events import (
    BenchResult,
    EngineCrashed,
    EngineError,
    Loaded,
    RawDecoded,
)
from app.measure.bench_report import (
    BenchReport,
    DrafterStep,
    JSONObject,
    PromptResult,
    RunResult,
    RunSetup,
    Speedup,
    Totals,
    Trace,
    rate_ratio,
)
from app.measure.prompts import Prompt
from app.measure.prompts import read_prompts as read_prompts  # re-exported for the bench's callers
from app.params import LoadSettings, SamplingSettings
from app.safe_text import terminal_safe

if TYPE_CHECKING:
    from app.engine.client import EngineClient

WATCHDOG_SECONDS = 1800.0  # a BenchRun answers once, at its end: a slow model may be silent for minutes

# The bench samples with the sampling settings' own defaults, but from a fixed seed (runs at a temperature
# repeat) and with shorter answers.
BENCH_SAMPLING = SamplingSettings(seed=1234, max_tokens=256)


@dataclass(frozen=True)
class BenchConfig:
    """One bench: the pair and its load settings, the prompts, the sampling, and what to measure."""

    settings: LoadSettings
    prompts: tuple[Prompt, ...]
    sampling: SamplingSettings = BENCH_SAMPLING
    baseline: bool = False  # also run each prompt without speculation, side by side
    repeat: int = 1  # runs of each prompt (speculative and plain alternating, in alternating order)
    raw: bool = False  # also time a bare llama_decode loop
    keep_traces: bool = False  # keep each prompt's tokens and answer (tune replays them offline)

    def validate(self) -> BenchConfig:
        """The settings, the sampling and the repeats checked (not the prompts: a caller may read them after);
        raises SettingsError."""
        self.settings.validate()
        self.sampling.validate()
        if self.repeat < 1:
            raise SettingsError(f"--repeat must be at least 1, not {self.repeat}.")
        return self


def print_note(text: str) -> None:
    """The bench's default sink for notes (a context made larger, a refused chat template): stderr."""
    print(f"specdeck bench: {text}", file=sys.stderr)


class EngineCrashedError(AppError):
    """The worker died while the bench drove it; the message is the one sentence to show."""


# --- in the bench process --------------------------------------------------------------------------


E = TypeVar("E")


def crash_sentence(event: EngineCrashed) -> str:
    """One sentence for a worker that died: signal or status, phase, llama.cpp's last words, advice."""
    how = f"was killed by {event.signal_name}" if event.signal_name else f"exited with status {event.exit_code}"
    phase = {"load": "while loading the model", "generate": "while decoding"}.get(event.during, "while idle")
    said = [line.strip() for line in event.last_log_lines if line.strip()][-2:]
    last = f" (llama.cpp's last lines: {' / '.join(said)})" if said else ""
    advice = ("the model file may be damaged or of a kind this llama.cpp build cannot run: check it with "
              "`specdeck doctor --decode-check`, or try another model")
    return f"llama.cpp {how} {phase}{last}; {advice}."


def _await(client: EngineClient, kind: type[E]) -> E:
    """The reply of type ``kind`` to the request just sent; an engine error or crash raises."""
    for event in client.events(timeout=WATCHDOG_SECONDS):
        if isinstance(event, EngineCrashed):
            raise EngineCrashedError(crash_sentence(event))
        if isinstance(event, EngineError):
            raise AppError(event.message)
        if isinstance(event, kind):
            return event
    raise AppError("The engine ended the request without an answer.")  # pragma: no cover - events() raises


def alternating_order(prompt_index: int, repeat: int) -> tuple[bool, bool]:
    """Which run goes first, as (plain?, plain?): the order flips every repeat and every prompt."""
    return (False, True) if (prompt_index + repeat) % 2 == 0 else (True, False)


def ceiling(target: str, n_ctx: int, network_seconds: float = 0.0) -> JSONObject | None:
    """The roofline ceiling for this target on this machine (None when it cannot be computed), with the RPC
    servers' round trips per pass when the layers are on them."""
    from app.measure.doctor_report import ceiling_summary

    try:
        return ceiling_summary(target, n_ctx, network_seconds=network_seconds)
    except AppError:
        return None


def bench(config: BenchConfig, out: TextIO, *, client: EngineClient | None = None, told: set[str] | None = None,
          note: Callable[[str], None] = print_note) -> BenchReport:
    """Run the benchmark that ``config`` describes; print its table to ``out`` and its notes to ``note``;
    return the report.

    ``told`` holds the warnings already given (a caller running several benches, like tune, passes one set so
    each warning is given once across them)."""
    from app.engine.client import EngineClient

    settings = config.validate().settings
    if not config.prompts:
        raise SettingsError("There is no prompt to measure; give at least one.")
    own_client = client is None
    engine = client or EngineClient(watchdog_seconds=WATCHDOG_SECONDS)
    try:
        engine.load(settings)
        loaded = _await(engine, Loaded)
        for line in (loaded.gpu_layers_note, settings.context_note(loaded.n_ctx)):
            if line:
                note(line)
        return _measure(engine, config, loaded, out, set() if told is None else told, note)
    finally:
        if own_client:
            engine.close()


def _measure(client: EngineClient, config: BenchConfig, loaded: Loaded, out: TextIO, told: set[str],
             note: Callable[[str], None]) -> BenchReport:
    from app.storage.measured import keep_answer, keep_pass_costs

    draft, target = config.settings.draft, config.settings.target_path
    sampling, repeats = config.sampling, config.repeat
    verify_cost: list[tuple[int, float]] = []
    draft_step = [0.0]  # the latest run's model-drafter step, kept through runs without one

    def run(messages: Prompt, plain: bool) -> RunResult:
        client.bench_run(messages, sampling, plain)
        result = _await(client, BenchResult)
        if result.warning and result.warning not in told:  # a refused template: say so, once
            told.add(result.warning)
            note(terminal_safe(result.warning, one_line=True))
        verify_cost[:] = result.verify_cost  # what the cost model holds after the latest run
        draft_step[0] = result.draft_step_seconds or draft_step[0]
        return RunResult.of(result)

    target_name = terminal_safe(loaded.target.name, one_line=True)  # GGUF metadata is untrusted
    drafter_name = ("the target's MTP heads" if draft.mtp
                    else terminal_safe(loaded.drafter.name, one_line=True) if loaded.drafter else "none")
    print(f"target {target_name} ({loaded.target.size_bytes / 1e6:.0f} MB), "
          f"drafter {drafter_name}, n-gram {draft.ngram or 'off'}, "
          f"k {'adaptive ≤ ' + str(draft.k_max) if draft.adaptive else draft.k}, backend {loaded.backend}"
          + (f", RPC servers {', '.join(d.description for d in loaded.devices if is_rpc(d))} "
             f"({loaded.network_seconds * 1000:.2f} ms of round trips per pass)" if loaded.network_seconds else "")
          + (f", {repeats} repeats" if repeats > 1 else ""), file=out)
    print(f"{'#':>2} {'tokens':>6} {'tok/s':>8} {'base':>8} {'speedup':>7} {'spread':>11} {'accept':>6} "
          f"{'τ':>5} {'same':>5}", file=out)
    prompts: list[PromptResult] = []
    traces: list[Trace] = []  # each prompt's tokens and its answer (plain decoding's, if run)
    for index, messages in enumerate(config.prompts):
        specs: list[RunResult] = []
        bases: list[RunResult] = []
        firsts: list[str] = []
        for r in range(repeats):
            order = alternating_order(index, r) if config.baseline else (False,)
            firsts.append("plain" if order[0] else "speculative")
            for plain in order:
                result = run(messages, plain)
                (bases if plain else specs).append(result)
        for s in specs:
            if s.stats is not None:
                keep_answer(target, draft.drafter_path, draft.ngram, s.stats, mtp=draft.mtp)
        prompt = PromptResult(index, tuple(specs), tuple(bases), tuple(firsts))
        prompts.append(prompt)
        answered = bases[0] if bases else specs[0]
        traces.append({"prompt": answered.prompt_ids, "answer": answered.tokens})
        _print_row(prompt, repeats, out)
    total = Totals(tuple(p.specs[r] for r in range(repeats) for p in prompts))
    baseline: Totals | None = None
    speedup: Speedup | None = None
    if config.baseline:
        baseline = Totals(tuple(p.bases[r] for r in range(repeats) for p in prompts))
        speedup = Speedup(tuple(rate_ratio([p.specs[r] for p in prompts], [p.bases[r] for p in prompts])
                                for r in range(repeats)), all(p.identical for p in prompts))
    step = DrafterStep.of(draft_step[0], dict(verify_cost))
    setup = RunSetup(target, draft.drafter_path, draft.ngram, draft.mtp, draft.adaptive, draft.k, draft.k_max,
                     sampling.temperature, sampling.seed, sampling.max_tokens, repeats, loaded.backend,
                     tuple(d.description for d in loaded.devices if is_rpc(d)), loaded.network_seconds)
    report = BenchReport(setup, tuple(prompts), total, baseline, speedup, tuple(verify_cost), step,
                         ceiling(target, loaded.n_ctx, loaded.network_seconds),
                         _raw(client, config.prompts[0], sampling.max_tokens, out) if config.raw else None,
                         tuple(traces) if config.keep_traces else ())
    keep_pass_costs(target, loaded.backend, report.verify_cost_ms, draft.drafter_path, draft.ngram,
                    step.c if step else None, mtp=draft.mtp)
    summary = (f"total: {total.tok_s:.1f} tok/s, acceptance {total.acceptance:.2f}, "
               f"τ {total.tokens_per_pass:.2f}")
    if baseline is not None and speedup is not None:
        summary += f", baseline {baseline.tok_s:.1f} tok/s, speedup {speedup.median:.2f}x"
        if repeats > 1:
            summary += f" (median of {repeats}; {speedup.low:.2f}–{speedup.high:.2f})"
        summary += f", identical {speedup.identical}"
    summary += f", Python overhead per pass {total.overhead_ms_median:.3f} ms (median)"
    if step is not None:
        summary += f", drafter step {step.seconds * 1000:.2f} ms (c {step.c:.2f})"
    print(summary, file=out)
    return report


def _print_row(prompt: PromptResult, repeats: int, out: TextIO) -> None:
    """One prompt's line of the table: the medians over repeats, the first repeat's acceptance and τ."""
    spec = prompt.specs[0]
    base = statistics.median(b.decode_tps for b in prompt.bases) if prompt.bases else 0.0
    speedup = statistics.median(prompt.ratios) if prompt.bases else 0.0
    spread = f"{min(prompt.ratios):.2f}–{max(prompt.ratios):.2f}" if prompt.bases and repeats > 1 else ""
    same = str(prompt.identical) if prompt.bases else "-"
    print(f"{prompt.index:>2} {len(spec.tokens):>6} {statistics.median(s.decode_tps for s in prompt.specs):>8.1f} "
          f"{base:>8.1f} {speedup:>7.2f} {spread:>11} {spec.counts.acceptance:>6.2f} "
          f"{spec.counts.tokens_per_pass:>5.2f} {same:>5}", file=out)


def _raw(client: EngineClient, messages: Prompt, max_tokens: int, out: TextIO) -> JSONObject:
    """The bare llama_decode loop against plain decoding through the engine, alternating, three times; both
    after the same prompt (at a shorter context a pass is cheaper: 142 against 111 tok/s on SmolLM2 here)."""
    plain = SamplingSettings(temperature=0.0, max_tokens=max_tokens)
    raw_rates, eng_rates = [], []
    for _ in range(3):
        client.raw_decode(max_tokens, messages=messages)
        raw_rates.append(_await(client, RawDecoded).tokens_per_second)
        client.bench_run(messages, plain, True)
        eng_rates.append(RunResult.of(_await(client, BenchResult)).decode_tps)
    raw, eng = statistics.median(raw_rates), statistics.median(eng_rates)
    print(f"plain decode through the engine: {eng:.1f} tok/s; bare llama_decode loop: {raw:.1f} tok/s; "
          f"ratio {eng / raw if raw else 0:.3f}", file=out)
    return {"bare_loop_tok_s": round(raw, 2), "engine_plain_tok_s": round(eng, 2),
            "ratio": round(eng / raw, 3) if raw else 0.0}
