"""Live decode metrics: everything the dashboard plots, computed from engine events without Qt.

``LiveMetrics`` eats ``Loaded``/``PassStats``/``Finished`` and keeps fixed-size numpy ring buffers (time,
tok/s, acceptance, tokens per pass, k, context) plus per-position and per-k counts; ``snapshot()`` hands the
painter immutable copies. The ceilings it compares against come from ``app.ceiling.builder``.

Acceptance, τ and tok/s are ``app.events``' definitions (``acceptance``, ``tokens_per_pass``,
``decode_rate``), the ones the chat's stats line and ``specdeck bench`` report; ``message`` holds the
answer's ``RunCounts``, which equal its ``MessageStats.counts``. Here they are also taken over rolling
windows. Only the dashboard has:
- α = accepted / positions tested (the flags up to and including the first rejection): the per-position
  acceptance probability of Leviathan et al., so E[τ](k) = (1 − α^(k+1)) / (1 − α) is comparable to τ.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from app.ceiling import speculation
from app.ceiling.builder import CeilingInfo
from app.engine_limits import DEPTH_CAP
from app.events import (
    FROM_MODEL,
    FROM_NGRAM,
    SOURCE_NAMES,
    Finished,
    Loaded,
    MessageStats,
    PassStats,
    RunCounts,
    acceptance,
    decode_rate,
    tokens_per_pass,
)

FloatArray = npt.NDArray[np.float64]

DEFAULT_CAPACITY = 2048
SMOOTH_SECONDS = 1.0  # window of the smoothed tok/s
ACCEPT_WINDOW = 32  # passes in the rolling acceptance, α and τ
MAX_K = DEPTH_CAP  # the deepest draft a setting may ask for
CURVE_K_MIN = 8  # the Leviathan curve spans at least k = 0..8

# Ring-buffer rows.
T, TPS, TPS_SMOOTH, ACC, ACC_ROLL, TAU, TAU_ROLL, K, CTX = range(9)
_ROWS = 9


def leviathan_curve(alpha: float, k_max: int) -> tuple[FloatArray, FloatArray]:
    """(k, expected tokens per pass) for k = 0..k_max at acceptance probability alpha."""
    a = min(max(alpha, 0.0), 1.0)
    ks = np.arange(k_max + 1, dtype=np.float64)
    taus = np.array([speculation.expected_tokens_per_pass(a, int(k)) for k in ks], dtype=np.float64)
    return ks, taus


# --- ring buffer ----------------------------------------------------------------------------------


class _Ring:
    """Rows of float64 in a doubled buffer: every value is written twice so the last `capacity` points are
    always one contiguous slice (no concatenate per repaint)."""

    def __init__(self, rows: int, capacity: int) -> None:
        self.capacity = capacity
        self._buf = np.full((rows, 2 * capacity), np.nan, dtype=np.float64)
        self._head = 0  # next write position in [0, capacity)
        self.count = 0

    def clear(self) -> None:
        self._buf.fill(np.nan)
        self._head = 0
        self.count = 0

    def append(self, values: Sequence[float]) -> None:
        h = self._head
        col = np.asarray(values, dtype=np.float64)
        self._buf[:, h] = col
        self._buf[:, h + self.capacity] = col
        self._head = (h + 1) % self.capacity
        self.count = min(self.count + 1, self.capacity)

    def set_last(self, row: int, value: float) -> None:
        if self.count == 0:
            return
        i = (self._head - 1) % self.capacity
        self._buf[row, i] = value
        self._buf[row, i + self.capacity] = value

    def last(self, row: int) -> float:
        if self.count == 0:
            return math.nan
        return float(self._buf[row, (self._head - 1) % self.capacity])

    def view(self) -> FloatArray:
        """The stored points in time order (a view: copy before handing it out)."""
        start = self._head + self.capacity - self.count
        return self._buf[:, start : start + self.count]


# --- snapshot -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Current:
    """The numbers strip."""

    tps: float | None  # smoothed tok/s
    pct_of_ceiling: float | None  # of the spec ceiling at one token per pass (above 100: beyond the wall)
    pct_of_speculative: float | None  # of τ × the spec ceiling
    acceptance: float | None  # rolling accepted / drafted
    alpha: float | None  # rolling α
    tau: float | None  # rolling tokens per pass
    k: int | None
    context_tokens: int
    n_ctx: int
    kv_bytes_used: int
    kv_bytes_total: int
    backend: str
    device: str
    from_ngram: int = 0  # this answer's tokens drafted by the n-gram drafter and accepted
    from_trained: int = 0  # ... by the trained drafter (a drafter model, the MTP heads, an EAGLE-3 head)
    has_trained: bool = False  # a trained drafter is loaded (a drafter file: a model or a head)

    @property
    def sources_text(self) -> str:
        """Where this answer's accepted draft tokens came from, named as the chat's highlight names them; the
        trained drafter only where one is loaded (a "trained 0" without one reads as a drafter that failed)."""
        # Short: the strip's label must fit a narrow dashboard (335 px at 1024x700); the tooltip names both.
        if not self.from_ngram and not self.from_trained:
            return "accepted: –"
        parts = [f"{SOURCE_NAMES[FROM_NGRAM].split()[0]} {self.from_ngram:,}"]
        if self.has_trained or self.from_trained:
            parts.append(f"{SOURCE_NAMES[FROM_MODEL].split()[0]} {self.from_trained:,}")
        return "accepted: " + " · ".join(parts)

    @property
    def context_fill(self) -> float:
        return self.context_tokens / self.n_ctx if self.n_ctx else 0.0

    @property
    def context_text(self) -> str:
        return f"{self.context_tokens:,} of {self.n_ctx:,} tokens"


@dataclass(frozen=True)
class MetricsSnapshot:
    """Immutable copies for the painter (arrays are read-only)."""

    t: FloatArray
    tps: FloatArray
    tps_smooth: FloatArray
    acceptance: FloatArray  # NaN where nothing was drafted
    acceptance_roll: FloatArray
    tau: FloatArray
    tau_roll: FloatArray
    k: FloatArray
    context: FloatArray
    position_acceptance: FloatArray  # per draft position j = 0, 1, ...
    position_drafted: FloatArray
    tau_by_k_k: FloatArray  # k values with at least one pass ...
    tau_by_k_mean: FloatArray  # ... and their mean τ
    curve_k: FloatArray  # Leviathan's E[τ](k) at the message α
    curve_tau: FloatArray
    message_alpha: float | None
    spec_ceiling: float | None  # one token per pass, at the current context
    measured_ceiling: float | None
    speculative_ceiling: float | None  # τ × spec ceiling
    current: Current
    generating: bool
    passes: int
    last_stats: MessageStats | None = None
    finish_reason: str = ""


def _frozen(a: FloatArray) -> FloatArray:
    out = np.array(a, dtype=np.float64, copy=True)
    out.flags.writeable = False
    return out


# --- the live model -------------------------------------------------------------------------------


@dataclass
class _Window:
    """Running sums over the last N passes."""

    size: int
    items: deque[tuple[int, int, int, int]] = field(default_factory=deque)  # accepted, drafted, tested, τ
    accepted: int = 0
    drafted: int = 0
    tested: int = 0
    tau: int = 0

    def push(self, accepted: int, drafted: int, tested: int, tau: int) -> None:
        self.items.append((accepted, drafted, tested, tau))
        self.accepted += accepted
        self.drafted += drafted
        self.tested += tested
        self.tau += tau
        if len(self.items) > self.size:
            a, d, t, u = self.items.popleft()
            self.accepted -= a
            self.drafted -= d
            self.tested -= t
            self.tau -= u

    def clear(self) -> None:
        self.items.clear()
        self.accepted = self.drafted = self.tested = self.tau = 0


class LiveMetrics:
    """Rolling decode metrics for one loaded model; a new request id starts a new generation."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY, *, smooth_seconds: float = SMOOTH_SECONDS,
                 accept_window: int = ACCEPT_WINDOW) -> None:
        if capacity < 2:
            raise ValueError("capacity must be at least 2")
        self.capacity = capacity
        self.smooth_seconds = smooth_seconds
        self._ring = _Ring(_ROWS, capacity)
        self._win = _Window(accept_window)
        self._recent: deque[tuple[float, int]] = deque()  # (t_start, emitted) within the smoothing window
        self.loaded: Loaded | None = None
        self.ceiling: CeilingInfo | None = None
        self._plain_verify_ema: float | None = None  # width-1 verify seconds: a live measured ceiling
        self._context = 0  # tokens in the KV cache after the last pass
        self._kv_used = 0
        self.reset()

    # -- events --

    def on_loaded(self, loaded: Loaded, ceiling: CeilingInfo | None = None) -> None:
        self.loaded = loaded
        self.ceiling = ceiling
        self._plain_verify_ema = None
        self.reset()
        self._context = self._kv_used = 0

    def set_ceiling(self, ceiling: CeilingInfo | None) -> None:
        self.ceiling = ceiling

    def on_unloaded(self) -> None:
        self.loaded = None
        self.ceiling = None
        self._plain_verify_ema = None
        self.reset()
        self._context = self._kv_used = 0

    def reset(self) -> None:
        """Forget the generation (series, counts); keep the loaded model, its ceiling and what its KV cache
        holds (the context stays filled until the next answer or a load)."""
        self._ring.clear()
        self._win.clear()
        self._recent.clear()
        self._recent_sum = 0
        self.request_id: int | None = None
        self._t0 = 0.0
        self._prev_start: float | None = None
        self._prev_emitted = 0
        self.passes = 0
        self.generating = False
        self._pos_drafted = np.zeros(MAX_K, dtype=np.float64)
        self._pos_accepted = np.zeros(MAX_K, dtype=np.float64)
        self._max_pos = 0
        self._k_passes = np.zeros(MAX_K + 1, dtype=np.float64)
        self._k_tau = np.zeros(MAX_K + 1, dtype=np.float64)
        self._max_k = 0
        self._accepted_total = 0
        self._tested_total = 0
        self.message = RunCounts()  # this answer's counts so far
        self._from_ngram = self._from_trained = 0
        self._k_last: int | None = None
        self.last_stats: MessageStats | None = None
        self.finish_reason = ""

    def on_pass(self, p: PassStats) -> None:
        if p.request_id != self.request_id:
            self.reset()
            self.request_id = p.request_id
            self._t0 = p.t_start
        self.generating = True
        n_acc = sum(1 for ok in p.accepted if ok)
        tested = len(p.accepted)
        tau = p.emitted + p.ended
        self._from_ngram += p.from_ngram
        self._from_trained += p.from_model
        self.message = self.message + RunCounts(tokens=p.emitted, passes=1, drafted=p.drafted, accepted=n_acc,
                                                end_tokens=int(p.ended))
        busy = p.draft_seconds + p.verify_seconds + p.overhead_seconds

        # The wall time between pass starts is the honest duration of the previous pass (it includes what
        # the worker did between passes); until the next pass arrives, the measured parts stand in.
        if self._prev_start is not None:
            gap = p.t_start - self._prev_start
            if gap > 0:
                self._ring.set_last(TPS, self._prev_emitted / gap)
        tps = p.emitted / busy if busy > 0 else math.nan

        # Passes before this one are complete: their tokens over the wall span they covered.
        while self._recent and self._recent[0][0] < p.t_start - self.smooth_seconds:
            self._recent_sum -= self._recent.popleft()[1]
        if self._recent and p.t_start > self._recent[0][0]:
            smooth = decode_rate(self._recent_sum, p.t_start - self._recent[0][0])
        else:
            smooth = tps
        self._recent.append((p.t_start, p.emitted))
        self._recent_sum += p.emitted

        self._win.push(n_acc, p.drafted, tested, tau)
        acc = acceptance(n_acc, p.drafted) if p.drafted else math.nan
        acc_roll = acceptance(self._win.accepted, self._win.drafted) if self._win.drafted else math.nan
        tau_roll = tokens_per_pass(self._win.tau, len(self._win.items))
        self._ring.append((p.t_start - self._t0, tps, smooth, acc, acc_roll, tau, tau_roll, p.k,
                           p.context_tokens))

        d = min(p.drafted, MAX_K)
        self._pos_drafted[:d] += 1
        for j, ok in enumerate(p.accepted[:MAX_K]):
            if not ok:
                break
            self._pos_accepted[j] += 1
        self._max_pos = max(self._max_pos, d)
        kk = min(p.drafted, MAX_K)
        self._k_passes[kk] += 1
        self._k_tau[kk] += tau
        self._max_k = max(self._max_k, kk, min(p.k, MAX_K))
        self._accepted_total += n_acc
        self._tested_total += tested
        if p.verify_width == 1 and p.verify_seconds > 0:
            v, ema = p.verify_seconds, self._plain_verify_ema
            self._plain_verify_ema = v if ema is None else 0.9 * ema + 0.1 * v

        self._prev_start = p.t_start
        self._prev_emitted = p.emitted
        self._context = p.context_tokens
        self._kv_used = p.kv_bytes_used
        self._k_last = p.k
        self.passes += 1

    def on_finished(self, f: Finished) -> None:
        if self.request_id is None or f.request_id == self.request_id:
            self.generating = False
            self.last_stats = f.stats
            self.finish_reason = f.reason

    # -- derived --

    def rolling_alpha(self) -> float | None:
        return self._win.accepted / self._win.tested if self._win.tested else None

    def message_alpha(self) -> float | None:
        return self._accepted_total / self._tested_total if self._tested_total else None

    def spec_ceiling(self) -> float | None:
        return self.ceiling.spec_at(self._context) if self.ceiling is not None else None

    def measured_ceiling(self) -> float | None:
        """The plain decode rate the engine measured at load, else a calibrated ceiling, else the live rate
        of plain (width-1) verify passes."""
        if self.loaded is not None and self.loaded.plain_tps > 0:
            return self.loaded.plain_tps
        if self.ceiling is not None:
            m = self.ceiling.measured_at(self._context)
            if m is not None:
                return m
        if self._plain_verify_ema:
            return 1.0 / self._plain_verify_ema
        return None

    def current(self) -> Current:
        tps = self._ring.last(TPS_SMOOTH)
        tps_v = None if math.isnan(tps) else tps
        tau = tokens_per_pass(self._win.tau, len(self._win.items)) if self._win.items else None
        spec = self.spec_ceiling()
        pct = 100.0 * tps_v / spec if tps_v is not None and spec else None
        pct_spec = 100.0 * tps_v / (spec * tau) if tps_v is not None and spec and tau else None
        ld = self.loaded
        return Current(
            tps=tps_v,
            pct_of_ceiling=pct,
            pct_of_speculative=pct_spec,
            acceptance=acceptance(self._win.accepted, self._win.drafted) if self._win.drafted else None,
            alpha=self.rolling_alpha(),
            tau=tau,
            k=self._k_last,
            context_tokens=self._context,
            n_ctx=ld.n_ctx if ld else 0,
            kv_bytes_used=self._kv_used,
            kv_bytes_total=ld.kv_bytes_total if ld else 0,
            backend=ld.backend if ld else "",
            device=self.ceiling.device if self.ceiling else "",
            from_ngram=self._from_ngram,
            from_trained=self._from_trained,
            has_trained=ld is not None and ld.drafter is not None,
        )

    def snapshot(self) -> MetricsSnapshot:
        v = self._ring.view()
        n = self._max_pos
        drafted = self._pos_drafted[:n]
        with np.errstate(invalid="ignore", divide="ignore"):
            pos_acc = np.where(drafted > 0, self._pos_accepted[:n] / np.maximum(drafted, 1), 0.0)
        seen = np.nonzero(self._k_passes)[0]
        mean_tau = self._k_tau[seen] / self._k_passes[seen]
        alpha = self.message_alpha()
        k_max = max(CURVE_K_MIN, self._max_k)
        if alpha is not None:
            ck, ct = leviathan_curve(alpha, k_max)
        else:
            ck, ct = np.zeros(0), np.zeros(0)
        spec = self.spec_ceiling()
        tau = tokens_per_pass(self._win.tau, len(self._win.items)) if self._win.items else None
        return MetricsSnapshot(
            t=_frozen(v[T]),
            tps=_frozen(v[TPS]),
            tps_smooth=_frozen(v[TPS_SMOOTH]),
            acceptance=_frozen(v[ACC]),
            acceptance_roll=_frozen(v[ACC_ROLL]),
            tau=_frozen(v[TAU]),
            tau_roll=_frozen(v[TAU_ROLL]),
            k=_frozen(v[K]),
            context=_frozen(v[CTX]),
            position_acceptance=_frozen(pos_acc),
            position_drafted=_frozen(drafted),
            tau_by_k_k=_frozen(seen.astype(np.float64)),
            tau_by_k_mean=_frozen(mean_tau),
            curve_k=_frozen(ck),
            curve_tau=_frozen(ct),
            message_alpha=alpha,
            spec_ceiling=spec,
            measured_ceiling=self.measured_ceiling(),
            speculative_ceiling=spec * tau if spec is not None and tau is not None else None,
            current=self.current(),
            generating=self.generating,
            passes=self.passes,
            last_stats=self.last_stats,
            finish_reason=self.finish_reason,
        )
