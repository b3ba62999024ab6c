"""What every answer and every measurement saves, decided in one place: bench, tune, the terminal chat, serve and
the window call these two and nothing else of ``pair_stats`` or ``verify_cost`` to save.

- An answer (``keep_answer``) teaches the drafter ranking the pair's acceptance when one drafter made every
  draft, the trained drafter's own share when it drafted beside the suffix drafter, or that it drafted nothing.
- A bench (``keep_pass_costs``) also keeps the verify cost by width that the cost model held, and the model
  drafter's step over a one-token target pass (c).

A full disk or a locked file only means a figure is not kept: the ranking falls back to its stated default, and
nothing here raises for that.
"""

from __future__ import annotations

from collections.abc import Mapping

from app.events import Loaded, MessageStats
from app.storage import pair_stats, verify_cost


def keep_answer(target: str, drafter_path: str | None, ngram: int, stats: MessageStats, *, mtp: bool = False) -> None:
    """Fold one finished answer into what the ranking knows of (target, its drafter): ``drafter_path`` a drafter
    file, or ``mtp`` the target's own MTP heads."""
    trained = pair_stats.trained_key(drafter_path, mtp)
    key = pair_stats.drafter_key(trained, ngram)
    if key is not None:
        pair_stats.record(target, key, stats)
    elif trained is not None:  # stacked with the suffix drafter: the trained drafter's own tokens
        pair_stats.record_trained_share(target, trained, stats)


def keep_loaded_answer(loaded: Loaded, stats: MessageStats) -> None:
    """``keep_answer`` for the pair a worker reported as loaded."""
    keep_answer(loaded.target.path, loaded.drafter.path if loaded.drafter else None, loaded.ngram, stats,
                mtp=loaded.mtp)


def keep_pass_costs(target: str, backend: str, verify_cost_ms: Mapping[str, float], drafter_path: str | None,
                    ngram: int, step_c: float | None, *, mtp: bool = False) -> None:
    """A bench's pass costs: the verify curve by width, and the trained drafter's c where it was measured."""
    if verify_cost_ms:
        verify_cost.record(target, verify_cost_ms, backend)
    key = pair_stats.drafter_key(pair_stats.trained_key(drafter_path, mtp), ngram)
    if key is not None and step_c is not None:  # the ranking prices this drafter with its measured step
        pair_stats.record_step_cost(target, key, step_c)
