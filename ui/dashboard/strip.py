"""The dashboard's strip of live figures above the plots: speed, its share of the roof, acceptance, α, τ, k, the
drafters' shares, context, device. While an answer streams they cover the last second (and the last 32
passes; the scope reads "live:"); once it has ended, the answer's own totals, as its stats line in the chat
reads them (the scope reads "answer:", k the deepest draft of the answer). The accepted tokens by source are the
answer's so far; the context is what the KV cache holds now."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QFont, QFontMetrics
from PySide6.QtWidgets import QLabel, QWidget

from app.ceiling.metrics import MetricsSnapshot
from app.events import TRAINED_DRAFTERS
from ui.dashboard.plots import GREEN
from ui.figures import acceptance_text, decode_text, tau_text
from ui.flow_layout import FlowLayout

# The widest text each live figure is expected to show; its label gets that fixed width (see LiveStrip).
LIVE_LABEL_TEMPLATES = {
    "scope": "answer:",
    "tps": "9999.9 tok/s",
    "pct": "9999% of the bandwidth roof ▲",
    "acceptance": "accept 100%",
    "alpha": "α 0.00",
    "tau": "τ 99.99",
    "k": "k 99",
    "sources": "accepted: suffix 99,999 · trained 99,999",
    "context": "context 999,999 of 999,999 tokens",
}


class LiveStrip(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        strip = FlowLayout(self, h_spacing=14, v_spacing=2)
        self.labels: dict[str, QLabel] = {}
        tips = {
            "scope": "While an answer streams: the last second and the last 32 passes. After it: the "
                     "answer's totals, as in its stats line in the chat",
            "tps": "Decode speed (tokens per second of wall clock)",
            "pct": "Speed as a share of the bandwidth roof: memory bandwidth (a CPU's probed on this machine, a "
                   "GPU's from its spec sheet) ÷ bytes read per token, at one token per pass, at the current "
                   "context (doctor gives it at its --ctx). Above 100% is only possible by speculating",
            "acceptance": "Draft tokens accepted / drafted",
            "alpha": "α: chance each draft position is accepted given the previous ones were (Leviathan)",
            "tau": "τ: tokens per verify pass, last 32 passes",
            "k": "Live: the draft depth the controller chose for the last pass. After an answer (k ≤ N): the "
                 "deepest draft it chose in that answer",
            "sources": f"This answer's accepted draft tokens by source: the suffix drafter and the trained drafter "
                       f"({TRAINED_DRAFTERS})",
            "context": "Tokens the KV cache holds now, of the context size",
            "device": "llama.cpp backend and the device whose bandwidth sets the ceiling",
        }
        for name, tip in tips.items():
            lab = QLabel("–", self)
            lab.setObjectName(f"dashboard_{name}")
            lab.setToolTip(tip)
            lab.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            lab.setTextFormat(Qt.TextFormat.PlainText)  # device names come from the system
            strip.addWidget(lab)
            self.labels[name] = lab
        f = self.labels["tps"].font()
        f.setPointSizeF(f.pointSizeF() * 1.4)
        f.setBold(True)
        self.labels["tps"].setFont(f)
        for name, widest in LIVE_LABEL_TEMPLATES.items():
            # A fixed size: Qt then skips the relayout a new text asks for (it reached the whole window, ten
            # times a second while tokens stream; the soak caught it in the strip's layout).
            lab = self.labels[name]
            bold = QFont(lab.font())
            bold.setBold(True)  # the share of the roof turns bold above 100 %
            lab.setFixedSize(QFontMetrics(bold).horizontalAdvance(widest) + 4, lab.sizeHint().height())

    def set_live(self, name: str, text: str) -> None:
        """A live figure's new text; its fixed width grows (one relayout) only for a text wider than it."""
        lab = self.labels[name]
        if lab.text() == text:
            return
        need = lab.fontMetrics().horizontalAdvance(text) + 4
        if need > lab.width() and name in LIVE_LABEL_TEMPLATES:
            lab.setFixedWidth(need)
        lab.setText(text)

    def paint(self, s: MetricsSnapshot, *, loaded: bool) -> None:
        """Live figures (last second, last 32 passes) while an answer streams; the answer's own totals, as
        its stats line in the chat reads them, once it has ended."""
        c = s.current
        set_text = self.set_live
        totals = s.last_stats if not s.generating else None
        spec = s.spec_ceiling
        if totals is not None:
            set_text("scope", "answer:")
            tps: float | None = totals.decode_tps
            set_text("tps", decode_text(totals.decode_tps))
            set_text("acceptance", f"accept {acceptance_text(totals.acceptance)}" if totals.drafted
                     else "accept –")
            set_text("tau", f"τ {tau_text(totals.tokens_per_pass)}")
            alpha = s.message_alpha
            set_text("k", f"k ≤ {max(totals.k_history)}" if totals.k_history else "k –")
        else:
            set_text("scope", "live:" if s.generating else "")
            tps = c.tps
            set_text("tps", decode_text(c.tps) if c.tps is not None else "– tok/s")
            set_text("acceptance", f"accept {acceptance_text(c.acceptance)}" if c.acceptance is not None
                     else "accept –")
            set_text("tau", f"τ {tau_text(c.tau)}" if c.tau is not None else "τ –")
            alpha = c.alpha
            set_text("k", f"k {c.k}" if c.k is not None else "k –")
        pct = 100.0 * tps / spec if tps is not None and spec else None
        if pct is not None:
            above = pct > 100.0
            set_text("pct", f"{pct:.0f}% of the bandwidth roof" + (" ▲" if above else ""))
            self._style_pct(f"color: {GREEN.name()}; font-weight: bold" if above else "")
        else:
            # Between answers there is no speed to compare: the roof itself, when it is known.
            roof = "roof unknown" if spec is None else f"roof {spec:.0f} tok/s"
            set_text("pct", roof if loaded else "–")
            self._style_pct("")
        set_text("alpha", f"α {alpha:.2f}" if alpha is not None else "α –")
        set_text("sources", c.sources_text)
        set_text("context", f"context {c.context_text}" if c.n_ctx else "no model")
        set_text("device", " · ".join(x for x in (c.backend, c.device) if x) or "–")

    def _style_pct(self, sheet: str) -> None:
        label = self.labels["pct"]
        if label.styleSheet() != sheet:  # a style sheet is parsed and the label polished at every set
            label.setStyleSheet(sheet)
