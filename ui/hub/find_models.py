"""The Find models view: GGUF repositories on the Hub, a repository's quants with the fit on this machine at the
chosen context and the predicted plain tok/s (``app.hub.verdict``, as `specdeck search REPO` computes them), the
drafters in the library (and in other repositories, ``app.hub.pairing``) that pair with a quant, and its download
with progress, Cancel and resume (also of a download an earlier run left unfinished).

Every Hub request, header read, disk check and download runs on a worker (``ui.tasks``); results come back by
signal, and a result for a search, repository or context no longer shown is dropped. Over 500 lines: the search,
the quant list with its verdicts and the buttons depend on one selection, kept in one widget so that dependency is
in one place (the download's own bar and worker are ``ui.hub.download``, the texts ``ui.hub.results``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import PurePosixPath

from PySide6.QtCore import Qt, QTimer, Signal, Slot
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QSplitter,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.ceiling.roofline import Device
from app.errors import AppError
from app.hub.client import RepoHit, search
from app.hub.files import MODEL, ModelFiles
from app.hub.pairing import RemoteDrafter, remote_drafters
from app.hub.pending import PendingPull, target_folder
from app.hub.transfer import Pulled
from app.hub.verdict import QuantVerdict, judge
from app.library.discovery import LibraryEntry
from app.library.gguf_reader import GGUFInfo
from app.measure.recommend import drafters_for
from app.params import MAX_CTX
from app.storage.pair_stats import load_measured
from app.units import format_bytes, format_count
from ui.flow_layout import FlowLayout
from ui.hub.download import DownloadBar
from ui.hub.results import (
    Judged,
    Listing,
    drafters_text,
    error_text,
    list_repo,
    remote_drafters_text,
    speed_text,
)
from ui.plain_text import plain_tooltip
from ui.tasks import TaskRunner

logger = logging.getLogger(__name__)

SEARCH_LIMIT = 30
GROUP_ROLE = Qt.ItemDataRole.UserRole
CTX_SETTLE_MS = 600  # a context typed digit by digit is judged once, not per digit
REPO_COLUMNS = ("Repository", "Downloads", "Likes", "Updated")
QUANT_COLUMNS = ("Quant", "File", "Size", "Fits", "Plain tok/s", "Here")
CHECKING = "checking…"
NOT_A_MODEL = "not a model"
COLUMN_GAP = 10  # pixels after a column's widest text, so "Q4_K_M" never runs into the file name


def _wrapping_label(parent: QWidget) -> QLabel:
    """Untrusted, possibly long text (a path, a repository name) that wraps and never widens the dialog."""
    label = QLabel(parent)
    label.setTextFormat(Qt.TextFormat.PlainText)
    label.setWordWrap(True)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
    return label


def _tree(parent: QWidget, columns: Sequence[str], stretch: int) -> QTreeWidget:
    tree = QTreeWidget(parent)
    tree.setColumnCount(len(columns))
    tree.setHeaderLabels(list(columns))
    tree.setRootIsDecorated(False)
    tree.setUniformRowHeights(True)
    tree.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    tree.setTextElideMode(Qt.TextElideMode.ElideMiddle)
    header = tree.header()
    header.setStretchLastSection(False)
    header.setMinimumSectionSize(40)
    for i in range(len(columns)):
        header.setSectionResizeMode(i, QHeaderView.ResizeMode.Stretch if i == stretch
                                    else QHeaderView.ResizeMode.Interactive)
    return tree


class FindModelsDialog(QDialog):
    searched = Signal()  # the results of a search, or its error, are shown
    listed = Signal()  # a repository's files, or the error, are shown
    judged = Signal()  # every quant of the repository shown has its verdict
    paired = Signal()  # the drafters from other repositories for the repository shown are known
    download_finished = Signal(str)  # the model's first file, now in the models folder
    download_failed = Signal(str)  # the sentence: an error, or the stop that kept the partial file
    load_requested = Signal(str)  # a downloaded model's path: load it as the picker would

    def __init__(self, parent: QWidget | None = None, *, context: int = 4096,
                 library: Callable[[], Sequence[LibraryEntry]] = list) -> None:
        super().__init__(parent)
        self.setWindowTitle("Find models")
        self.setWindowModality(Qt.WindowModality.NonModal)
        self._library = library  # the picker's entries: drafters are ranked among them
        # One worker each: a slow header read never holds up a search, and a download holds up neither.
        self._hub_tasks = TaskRunner(self, max_threads=1)
        self._judge_tasks = TaskRunner(self, max_threads=1)
        self._pair_tasks = TaskRunner(self, max_threads=1)  # drafters from other repositories: searches, headers
        self.remote_drafters: list[RemoteDrafter] | None = None  # for the listing shown; None: not known yet
        self._paired_for = 0  # the listing whose search for drafters from other repositories has started
        self._search_serial = 0
        self._list_serial = 0
        self._judge_serial = 0
        self._devices: list[Device] | None = None
        self._devices_lock = threading.Lock()
        self.hits: list[RepoHit] = []
        self.listing: Listing | None = None
        self.verdicts: dict[str, Judged] = {}  # by group name, for the listing shown
        self._picked_by_hand = False
        self._ctx_timer = QTimer(self)
        self._ctx_timer.setSingleShot(True)
        self._ctx_timer.setInterval(CTX_SETTLE_MS)
        self._ctx_timer.timeout.connect(self._judge_all)
        self._build(context)
        self._update_buttons()

    # --- layout -------------------------------------------------------------------------------------

    def _build(self, context: int) -> None:
        outer = QVBoxLayout(self)
        top = QHBoxLayout()
        self.query_edit = QLineEdit(self)
        self.query_edit.setPlaceholderText("Search GGUF models on the Hub, e.g. qwen 7b (empty: the most downloaded)")
        self.query_edit.setClearButtonEnabled(True)
        self.query_edit.returnPressed.connect(self._on_search_button_clicked)
        self.search_button = QPushButton("Search", self)
        self.search_button.setAutoDefault(False)
        self.search_button.clicked.connect(self._on_search_button_clicked)
        top.addWidget(self.query_edit, 1)
        top.addWidget(self.search_button)
        outer.addLayout(top)

        split = QSplitter(Qt.Orientation.Vertical, self)
        split.setChildrenCollapsible(False)
        self.repo_tree = _tree(split, REPO_COLUMNS, stretch=0)
        self.repo_tree.itemSelectionChanged.connect(self._on_repo_tree_item_selection_changed)
        split.addWidget(self.repo_tree)

        quants = QWidget(split)
        qlayout = QVBoxLayout(quants)
        qlayout.setContentsMargins(0, 0, 0, 0)
        head = QHBoxLayout()
        self.repo_label = _wrapping_label(quants)
        self.repo_label.setText("Choose a repository to see its quants.")
        self.ctx_spin = QSpinBox(quants)
        self.ctx_spin.setRange(256, MAX_CTX)
        self.ctx_spin.setSingleStep(1024)
        self.ctx_spin.setValue(max(256, min(MAX_CTX, context)))
        self.ctx_spin.setToolTip("The context length the fit and the speed are computed at")
        self.ctx_spin.valueChanged.connect(self._on_ctx_spin_value_changed)
        ctx_label = QLabel("Context", quants)
        ctx_label.setBuddy(self.ctx_spin)
        head.addWidget(self.repo_label, 1)
        head.addWidget(ctx_label)
        head.addWidget(self.ctx_spin)
        qlayout.addLayout(head)
        self.quant_tree = _tree(quants, QUANT_COLUMNS, stretch=1)
        self.quant_tree.itemSelectionChanged.connect(self._on_quant_tree_item_selection_changed)
        self.quant_tree.itemClicked.connect(self._on_quant_tree_item_clicked)
        self.quant_tree.headerItem().setToolTip(4, "Plain decoding (one token per pass) predicted from SpecDeck's "
                                                   "roofline on this machine's devices")
        qlayout.addWidget(self.quant_tree, 1)
        self.fit_label = _wrapping_label(quants)  # the chosen quant's fit in full: memory needed and free
        qlayout.addWidget(self.fit_label)
        self.drafters_label = _wrapping_label(quants)
        qlayout.addWidget(self.drafters_label)
        split.addWidget(quants)
        split.setStretchFactor(0, 2)
        split.setStretchFactor(1, 3)
        outer.addWidget(split, 1)

        self.download_bar = DownloadBar(self)
        self.download_bar.finished.connect(self._on_download_bar_finished)
        self.download_bar.failed.connect(self._on_download_bar_failed)
        self.progress_bar, self.rate_label = self.download_bar.progress_bar, self.download_bar.rate_label
        outer.addWidget(self.download_bar)

        buttons = QWidget(self)
        flow = FlowLayout(buttons, h_spacing=6, v_spacing=4)
        self.download_button = QPushButton("Download", buttons)
        self.download_button.clicked.connect(self._on_download_button_clicked)
        self.cancel_button = QPushButton("Cancel download", buttons)
        self.cancel_button.setToolTip("Stops the download; the partial file is kept and the next Download resumes it")
        self.cancel_button.clicked.connect(self._on_cancel_button_clicked)
        self.load_button = QPushButton("Load", buttons)
        self.load_button.setToolTip("Loads the downloaded model with the drafter the picker chooses for it")
        self.load_button.clicked.connect(self._on_load_button_clicked)
        self.close_button = QPushButton("Close", buttons)
        self.close_button.clicked.connect(self.hide)
        for button in (self.download_button, self.cancel_button, self.load_button, self.close_button):
            button.setAutoDefault(False)
            flow.addWidget(button)
        outer.addWidget(buttons)
        self.status_label = _wrapping_label(self)
        outer.addWidget(self.status_label)

    def _say(self, text: str) -> None:
        self.status_label.setText(text)
        self.status_label.setToolTip(plain_tooltip(text))

    # --- search -------------------------------------------------------------------------------------

    @Slot()
    def _on_search_button_clicked(self) -> None:
        self.search(self.query_edit.text())

    def search(self, query: str) -> None:
        query = query.strip()
        self.query_edit.setText(query)
        self._search_serial += 1
        serial = self._search_serial
        self._say(f"Searching the Hub for {query!r}…" if query else "Asking the Hub for its most downloaded GGUF "
                  "repositories…")
        self._hub_tasks.run(lambda: search(query, SEARCH_LIMIT), lambda hits: self._on_searched(serial, hits),
                            lambda exc: self._on_search_failed(serial, exc))

    def _on_searched(self, serial: int, hits: list[RepoHit]) -> None:
        if serial != self._search_serial:
            return
        self.hits = hits
        self.repo_tree.blockSignals(True)
        self.repo_tree.clear()
        for hit in hits:
            item = QTreeWidgetItem([hit.repo + (" (gated)" if hit.gated else ""), format_count(hit.downloads),
                                    str(hit.likes),
                                    hit.last_modified.strftime("%Y-%m-%d") if hit.last_modified else "–"])
            item.setToolTip(0, plain_tooltip(hit.repo + ("\nGated: accept its licence on the Hub and give a token "
                                                         "with HF_TOKEN." if hit.gated else "")))
            for col in (1, 2):
                item.setTextAlignment(col, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            self.repo_tree.addTopLevelItem(item)
        self.repo_tree.blockSignals(False)
        self._fit_columns(self.repo_tree)
        query = self.query_edit.text()
        if hits:
            self._say(f"{len(hits)} GGUF repositor{'ies' if len(hits) != 1 else 'y'}"
                      f"{f' match {query!r}' if query else ''}, most downloaded first: choose one to see its quants.")
        else:
            self._say(f"No GGUF repositories match {query!r}." if query else "The Hub listed no GGUF repositories.")
        self.searched.emit()

    def _on_search_failed(self, serial: int, exc: Exception) -> None:
        if serial != self._search_serial:
            return
        self._say(error_text(exc))
        self.searched.emit()

    # --- a repository's quants ----------------------------------------------------------------------

    @Slot()
    def _on_repo_tree_item_selection_changed(self) -> None:
        items = self.repo_tree.selectedItems()
        if items:
            self.show_repo(self.hits[self.repo_tree.indexOfTopLevelItem(items[0])].repo)

    def show_repo(self, repo: str) -> None:
        self._list_serial += 1
        self._judge_serial += 1  # the verdicts of the repository shown before are not wanted any more
        serial = self._list_serial
        self.listing = None
        self.verdicts = {}
        self.remote_drafters = None
        self._picked_by_hand = False
        self.quant_tree.clear()
        self.repo_label.setText(f"Quants of {repo}")
        self.fit_label.setText("")
        self.drafters_label.setText("")
        self._say(f"Listing the files of {repo}…")
        self._update_buttons()
        self._hub_tasks.run(lambda: list_repo(repo), lambda listing: self._on_listed(serial, listing),
                            lambda exc: self._on_list_failed(serial, exc))

    def _on_listed(self, serial: int, listing: Listing) -> None:
        if serial != self._list_serial:
            return
        self.listing = listing
        self._fill_quants()
        models = self.models()
        others = len(listing.groups) - len(models)
        if not listing.groups:
            self._say(f"{listing.repo} has no GGUF files.")
        elif not models:
            self._say(f"{listing.repo} has no GGUF model to load, only files that are not models.")
        else:
            self._say(f"{len(models)} quant{'s' if len(models) != 1 else ''}"
                      + (f" (and {others} file{'s' if others != 1 else ''} that are not models)" if others else "")
                      + ": reading each one's header from the Hub for the fit and the speed…")
        self.listed.emit()
        self._judge_all()

    def _on_list_failed(self, serial: int, exc: Exception) -> None:
        if serial != self._list_serial:
            return
        self._say(error_text(exc))
        self.listed.emit()

    def models(self) -> list[ModelFiles]:
        if self.listing is None:
            return []
        return [g for g in self.listing.groups if g.kind == MODEL and g.complete]

    def _others(self) -> list[ModelFiles]:
        if self.listing is None:
            return []
        return [g for g in self.listing.groups if not (g.kind == MODEL and g.complete)]

    def _here_text(self, group: ModelFiles) -> str:
        if self.listing is None:
            return ""
        whole, done = self.listing.on_disk.get(group.name, (False, 0))
        if whole:
            return "downloaded"
        return f"{int(done * 100 / group.size)} %, resumes" if done and group.size else ""

    def _fill_quants(self) -> None:
        assert self.listing is not None
        self.quant_tree.blockSignals(True)
        self.quant_tree.clear()
        for index, group in enumerate(self.listing.groups):
            model = group.kind == MODEL and group.complete
            if model:
                cells = [group.quant or "?", group.label, format_bytes(group.size), CHECKING, "",
                         self._here_text(group)]
            else:
                what = group.kind if group.complete else (f"incomplete split model ({len(group.parts)} of "
                                                          f"{group.expected_parts} parts)")
                # What it is goes in the wide, eliding column: the fit column stays as narrow as its verdicts.
                cells = ["–", f"{group.label} · {what}", format_bytes(group.size), NOT_A_MODEL, "", ""]
            item = QTreeWidgetItem(cells)
            item.setData(0, GROUP_ROLE, index)
            item.setToolTip(1, plain_tooltip("\n".join(p.path for p in group.parts)))
            for col in (2, 4):
                item.setTextAlignment(col, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            if not model:  # listed so the user sees what it is, never offered as a quant to download or load
                item.setFlags(item.flags() & ~(Qt.ItemFlag.ItemIsSelectable | Qt.ItemFlag.ItemIsEnabled))
                paths = "\n".join(p.path for p in group.parts)
                item.setToolTip(1, plain_tooltip(f"{cells[1]}: never offered as a quant\n{paths}"))
            self.quant_tree.addTopLevelItem(item)
        self.quant_tree.blockSignals(False)
        self._set_ctx_header()
        self._fit_columns(self.quant_tree)

    def _set_ctx_header(self) -> None:
        self.quant_tree.headerItem().setText(3, f"Fits (ctx {self.ctx_spin.value()})")

    def _item_for(self, name: str) -> QTreeWidgetItem | None:
        if self.listing is None:
            return None
        for i in range(self.quant_tree.topLevelItemCount()):
            item = self.quant_tree.topLevelItem(i)
            if item is not None and self.listing.groups[int(item.data(0, GROUP_ROLE))].name == name:
                return item
        return None

    def selected_group(self) -> ModelFiles | None:
        items = self.quant_tree.selectedItems()
        if not items or self.listing is None:
            return None
        group = self.listing.groups[int(items[0].data(0, GROUP_ROLE))]
        return group if group.kind == MODEL and group.complete else None

    def select_quant(self, name: str) -> bool:
        item = self._item_for(name)
        if item is None or not item.flags() & Qt.ItemFlag.ItemIsSelectable:
            return False
        self.quant_tree.setCurrentItem(item)
        return True

    # --- verdicts -----------------------------------------------------------------------------------

    @Slot(int)
    def _on_ctx_spin_value_changed(self, _value: int) -> None:
        if self.listing is not None:
            self._set_ctx_header()
            self._ctx_timer.start()

    def _machine(self) -> list[Device]:
        """This machine's devices as the fit sees them, probed once (on a worker: it can measure the CPU)."""
        from app.ceiling.builder import probe_machine

        with self._devices_lock:
            if self._devices is None:
                # The cached probe as it is, as the dashboard takes it: doctor retakes a busy one.
                self._devices = probe_machine(retake_busy=False)[1]
            return self._devices

    def _judge_all(self) -> None:
        self._ctx_timer.stop()
        if self.listing is None:
            return
        self._judge_serial += 1
        serial = self._judge_serial
        repo, ctx = self.listing.repo, self.ctx_spin.value()
        entries = list(self._library())
        models = self.models()
        self.verdicts = {}
        for group in models:
            item = self._item_for(group.name)
            if item is not None:
                item.setText(3, CHECKING)
                item.setText(4, "")
            self._queue_judge(serial, repo, group, ctx, entries)
        self._show_drafters()
        if not models:
            self.judged.emit()

    def _queue_judge(self, serial: int, repo: str, group: ModelFiles, ctx: int,
                     entries: Sequence[LibraryEntry]) -> None:
        self._judge_tasks.run(lambda: self._judge_one(serial, repo, group, ctx, entries),
                              lambda judged: self._on_judged(serial, group, judged),
                              lambda exc: self._on_judge_failed(serial, group, exc))

    def _judge_one(self, serial: int, repo: str, group: ModelFiles, ctx: int,
                   entries: Sequence[LibraryEntry]) -> Judged | None:
        """On the worker: the verdict as `specdeck search REPO` computes it, and the library's drafters for it."""
        if serial != self._judge_serial:
            return None  # a newer listing or context was asked for: no header read for this one
        verdict = judge(repo, group, self._machine(), ctx)
        report = None
        if verdict.info is not None:
            try:
                report = drafters_for(verdict.info, entries, load_measured(), confirm=False)
            except (AppError, OSError, ValueError):
                logger.warning("drafters for %s could not be ranked", group.name, exc_info=True)
        return Judged(verdict, report)

    def _on_judged(self, serial: int, group: ModelFiles, judged: Judged | None) -> None:
        if serial != self._judge_serial or judged is None:
            return
        self.verdicts[group.name] = judged
        if judged.verdict.info is not None:
            self._pair(judged.verdict.info)
        item = self._item_for(group.name)
        if item is not None:
            v = judged.verdict
            if v.error:
                fit, tip = "unknown", v.error
            else:
                fit, tip = ("fits" if v.fits else "does not fit"), v.fit_message
            item.setText(3, fit)
            item.setToolTip(3, plain_tooltip(tip))
            item.setText(4, speed_text(v.tokens_per_second))
            item.setToolTip(4, plain_tooltip(v.speed_basis))
        self._after_verdict()

    def _pair(self, target: GGUFInfo) -> None:
        """Once per listing, from the first header read: the tokenizer is the same in every quant."""
        if self.listing is None or self._paired_for == self._list_serial:
            return
        self._paired_for = serial = self._list_serial
        repo, largest = self.listing.repo, max(g.size for g in self.models())
        self._pair_tasks.run(lambda: remote_drafters(repo, target, largest),
                             lambda found: self._on_paired(serial, found),
                             lambda exc: self._on_pair_failed(serial, exc))

    def _on_paired(self, serial: int, found: list[RemoteDrafter]) -> None:
        if serial != self._list_serial:
            return
        self.remote_drafters = found
        self._show_drafters()
        self.paired.emit()

    def _on_pair_failed(self, serial: int, exc: Exception) -> None:
        logger.warning("drafters from other repositories could not be looked for: %s", error_text(exc))
        self._on_paired(serial, [])  # never in the way of the listing

    def _on_judge_failed(self, serial: int, group: ModelFiles, exc: Exception) -> None:
        if serial != self._judge_serial:
            return
        message = error_text(exc)
        self.verdicts[group.name] = Judged(QuantVerdict(group, None, self.ctx_spin.value(), None, "", None, message),
                                           None)
        item = self._item_for(group.name)
        if item is not None:
            item.setText(3, "unknown")
            item.setToolTip(3, plain_tooltip(message))
        self._after_verdict()

    def _after_verdict(self) -> None:
        models = self.models()
        if len(self.verdicts) < len(models):
            self._show_drafters()
            return
        self._fit_columns(self.quant_tree)
        fitting = [g for g in models if self.verdicts[g.name].verdict.fits]
        if not self._picked_by_hand and fitting:
            best = max(fitting, key=lambda g: g.size)  # the largest that fits: the best quality this machine holds
            self.select_quant(best.name)
        ctx = self.ctx_spin.value()
        if fitting:
            self._say(f"{len(fitting)} of {len(models)} quants fit this machine at context {ctx}"
                      + ("; the largest that fits is chosen." if not self._picked_by_hand else "."))
        elif models:
            unknown = [g for g in models if self.verdicts[g.name].verdict.fits is None]
            self._say(f"No quant could be checked: {self.verdicts[unknown[0].name].verdict.error}"
                      if len(unknown) == len(models) else f"No quant fits this machine at context {ctx}: a "
                      "smaller context, or a smaller model, may.")
        self._show_drafters()
        self.judged.emit()

    def _show_drafters(self) -> None:
        group = self.selected_group()
        if group is None:
            self.fit_label.setText("")
            self.drafters_label.setText("")
            return
        judged = self.verdicts.get(group.name)
        verdict = judged.verdict if judged is not None else None
        text = "" if verdict is None else (verdict.error or verdict.fit_message)
        if verdict is not None and verdict.speed_basis:
            text += f"\nPlain decoding {speed_text(verdict.tokens_per_second)} tok/s: {verdict.speed_basis}."
        self.fit_label.setText(text.strip())
        text = drafters_text(judged, self._others())
        if self._paired_for == self._list_serial:
            text += "\n" + remote_drafters_text(self.remote_drafters, group.size)
        self.drafters_label.setText(text)

    @Slot()
    def _on_quant_tree_item_selection_changed(self) -> None:
        self._show_drafters()
        self._update_buttons()

    @Slot(QTreeWidgetItem, int)
    def _on_quant_tree_item_clicked(self, _item: QTreeWidgetItem, _column: int) -> None:
        self._picked_by_hand = True  # a verdict arriving later no longer moves the choice

    # --- download -----------------------------------------------------------------------------------

    def selected_path(self) -> str | None:
        """Where the selected quant's first file is (or will be) in the models folder."""
        group = self.selected_group()
        if group is None or self.listing is None:
            return None
        return str(target_folder(self.listing.repo) / PurePosixPath(group.parts[0].path).name)

    def _listed_in_library(self, path: str | None) -> bool:
        return path is not None and any(e.path == path and e.is_model for e in self._library())

    def library_changed(self) -> None:
        """The picker scanned again: a downloaded model may be loadable now."""
        self._update_buttons()

    def _update_buttons(self) -> None:
        group = self.selected_group()
        busy = self.download_bar.downloading is not None
        whole = bool(group and self.listing and self.listing.on_disk.get(group.name, (False, 0))[0])
        self.download_button.setEnabled(group is not None and not busy and not whole)
        self.download_button.setText("Resume download" if group is not None and not whole and self.listing
                                     and self.listing.on_disk.get(group.name, (False, 0))[1] else "Download")
        self.cancel_button.setEnabled(busy and not self.download_bar.stopping)
        self.load_button.setEnabled(whole and self._listed_in_library(self.selected_path()))

    @Slot()
    def _on_download_button_clicked(self) -> None:
        self.download()

    def download(self) -> bool:
        group = self.selected_group()
        if group is None or self.listing is None or not self.download_bar.start(self.listing.repo, group):
            return False
        self._say(f"Downloading {group.label} ({format_bytes(group.size)}) from {self.listing.repo} into the models "
                  "folder…")
        self._update_buttons()
        return True

    def resume(self, pending: PendingPull) -> bool:
        """Continue a download that an earlier run left unfinished (its record and partial file in the models
        folder), with progress and Cancel as any other."""
        group = pending.group
        if not self.download_bar.start(pending.repo, group, pending.revision):
            return False
        self.repo_label.setText(f"Resuming {pending.repo}")
        self._say(f"Resuming the download of {group.label} from {pending.repo}: {format_bytes(pending.done)} of "
                  f"{format_bytes(group.size)} were already in the models folder…")
        self._update_buttons()
        return True

    @Slot()
    def _on_cancel_button_clicked(self) -> None:
        self.cancel_download()

    def cancel_download(self) -> None:
        self.download_bar.cancel()
        self._update_buttons()

    def _mark_on_disk(self, repo: str, group: ModelFiles, state: tuple[bool, int]) -> None:
        if self.listing is None or self.listing.repo != repo:
            return
        self.listing.on_disk[group.name] = state
        item = self._item_for(group.name)
        if item is not None:
            item.setText(5, self._here_text(group))

    @Slot(str, object, object)
    def _on_download_bar_finished(self, repo: str, group: ModelFiles, done: Pulled) -> None:
        self._mark_on_disk(repo, group, (True, group.size))
        where = done.paths[0]
        if done.already_there:
            self._say(f"{where.name} is already in the models folder: {where}")
        else:
            checked = "verified against the Hub's sha256" if done.verified else "size checked (the Hub gave no sha256)"
            self._say(f"Downloaded {where.name} ({format_bytes(group.size)}, {checked}) into {where.parent}. Load "
                      "starts it with the drafter the picker chooses.")
        self._update_buttons()
        self.download_finished.emit(str(where))

    @Slot(str, object, str, object)
    def _on_download_bar_failed(self, repo: str, group: ModelFiles, message: str,
                                state: tuple[bool, int] | None) -> None:
        if state is not None:
            self._mark_on_disk(repo, group, state)
        self._say(message.replace("pull again", "Download again"))  # the window's word for the same step
        self._update_buttons()
        self.download_failed.emit(message)

    # --- load and closing ---------------------------------------------------------------------------

    @Slot()
    def _on_load_button_clicked(self) -> None:
        path = self.selected_path()
        if path is not None and self._listed_in_library(path):
            self.load_requested.emit(path)

    def shutdown(self, msecs: int = 30_000) -> None:
        """Stop a download (its partial file stays) and wait for the workers, before the window goes."""
        self._judge_serial += 1
        self.download_bar.shutdown(msecs)
        for runner in (self._hub_tasks, self._judge_tasks, self._pair_tasks):
            runner.wait(msecs)

    @staticmethod
    def _fit_columns(tree: QTreeWidget) -> None:
        """Short columns sized to their text once, then left to the user; the stretched one takes the rest."""
        header = tree.header()
        for i in range(tree.columnCount()):
            if header.sectionResizeMode(i) != QHeaderView.ResizeMode.Stretch:
                tree.resizeColumnToContents(i)
                tree.setColumnWidth(i, tree.columnWidth(i) + COLUMN_GAP)
