"""The window's Find models view against the Hub look-alike on loopback (tests/hub_lookalike.py, HF_ENDPOINT):
search, a repository's quants with the fit and the predicted speed read from their remote headers, the download
into the models folder that the picker then lists and loads, Cancel and resume, and the failures as sentences.
The real huggingface_hub client and SpecDeck's own downloader run; nothing reaches the real network."""

from __future__ import annotations

import hashlib
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.units import format_bytes
from tests.gguf_fixtures import write_tiny_model
from tests.hub_lookalike import Fault, HubLookalike, big_model_header, write_split_model
from tests.ui.conftest import LOAD_TIMEOUT_MS
from ui.hub.find_models import FindModelsDialog
from ui.main_window import MainWindow

REPO = "acme/Tiny-GGUF"
Q8 = "Tiny-Q8_0.gguf"
HUB_MS = 60_000  # a bound on a hung request, not a measurement


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("hub-src") / "tiny.gguf", name="tiny")


@pytest.fixture(scope="module")
def probe_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This machine's hardware probe, taken once for the module: each test's fresh home starts with it, as a
    returning user's does, instead of measuring the CPU again."""
    import os

    from app.ceiling.builder import probe_machine

    home = tmp_path_factory.mktemp("probe-home")
    old = os.environ.get("SPECDECK_HOME")
    os.environ["SPECDECK_HOME"] = str(home)
    try:
        probe_machine(retake_busy=False)
    finally:
        if old is None:
            del os.environ["SPECDECK_HOME"]
        else:
            os.environ["SPECDECK_HOME"] = old
    return home / "cache" / "hardware_probe.json"


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, specdeck_home: Path,
        probe_cache: Path) -> Iterator[HubLookalike]:
    server = HubLookalike()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no saved token
    monkeypatch.setenv("SPECDECK_MODELS_DIR", str(tmp_path / "models"))
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    (specdeck_home / "cache").mkdir(exist_ok=True)
    shutil.copy(probe_cache, specdeck_home / "cache" / probe_cache.name)
    yield server
    server.close()


def models_dir(tmp_path: Path) -> Path:
    return tmp_path / "models"


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cdn_ranges(hub: HubLookalike, name: str) -> list[str | None]:
    return [r.headers.get("range") for r in hub.cdn_requests() if f"file={name}" in r.path and r.method == "GET"]


def rows(tree: object) -> list[list[str]]:
    from PySide6.QtWidgets import QTreeWidget

    assert isinstance(tree, QTreeWidget)
    out = []
    for i in range(tree.topLevelItemCount()):
        item = tree.topLevelItem(i)
        assert item is not None
        out.append([item.text(c) for c in range(tree.columnCount())])
    return out


def open_view(window: MainWindow) -> FindModelsDialog:
    window.find_models.action.trigger()  # Model → Find models…
    dialog = window.find_models.dialog
    assert dialog is not None
    assert dialog.isVisible()
    return dialog


def search(qtbot: QtBot, dialog: FindModelsDialog, query: str) -> None:
    dialog.query_edit.setText(query)
    with qtbot.waitSignal(dialog.searched, timeout=HUB_MS):
        dialog.search_button.click()


def choose_repo(qtbot: QtBot, dialog: FindModelsDialog, repo: str) -> None:
    index = [h.repo for h in dialog.hits].index(repo)
    with qtbot.waitSignal(dialog.judged, timeout=HUB_MS):
        item = dialog.repo_tree.topLevelItem(index)
        assert item is not None
        dialog.repo_tree.setCurrentItem(item)


def quant_row(dialog: FindModelsDialog, label: str) -> list[str]:
    return next(r for r in rows(dialog.quant_tree) if r[1] == label)


def test_search_then_quants_with_fit_speed_and_drafters(qtbot: QtBot, make_window: object, hub: HubLookalike,
                                                       tiny: Path, tmp_path: Path, tiny_drafter_same: Path) -> None:
    parts = write_split_model(tiny, tmp_path / "split", "Tiny-BF16", max_tensors=6)
    for p in parts:
        hub.add_file(REPO, f"BF16/{p.name}", p)
    hub.add_file(REPO, Q8, tiny)
    hub.add_file(REPO, "mmproj-Tiny-F16.gguf", tiny)
    hub.add_file(REPO, "Tiny.imatrix.gguf", tiny)
    hub.add_file(REPO, "MTP/mtp-Tiny-Q4_0.gguf", tiny)
    hub.add_file(REPO, "Tiny-Q2_K-00001-of-00002.gguf", parts[0])  # its second part is missing
    header, size = big_model_header(tmp_path / "big")
    hub.add_header_only(REPO, "Big-70B-F16.gguf", header, size)  # the largest, and too big for this machine
    hub.add_file("acme/Tiny-Other-GGUF", "x-Q4_K_M.gguf", tiny)
    hub.add_file("acme/tiny-safetensors", "model.safetensors", b"not gguf")
    hub.repos[REPO].downloads, hub.repos[REPO].likes = 12_345, 7
    hub.repos["acme/Tiny-Other-GGUF"].downloads = 10
    hub.repos["acme/tiny-safetensors"].tags = ("safetensors",)
    drafters = tmp_path / "drafters"
    drafters.mkdir()
    shutil.copy(tiny_drafter_same, drafters / tiny_drafter_same.name)  # same tokenizer as the served model

    window = make_window(start_engine=False, folders=(drafters,))  # type: ignore[operator]
    min_width = window.minimumSizeHint().width()
    dialog = open_view(window)
    search(qtbot, dialog, "tiny")
    assert rows(dialog.repo_tree) == [[REPO, "12.3k", "7", "2026-09-01"], ["acme/Tiny-Other-GGUF", "10", "0",
                                                                            "2026-09-01"]]
    assert all("filter=gguf" in r.path for r in hub.requests if r.path.startswith("/api/models?"))

    choose_repo(qtbot, dialog, REPO)
    table = rows(dialog.quant_tree)
    models = [r for r in table if r[3] != "not a model"]
    assert [(r[0], r[1]) for r in models] == [("BF16", "Tiny-BF16-00001-of-00004.gguf (+3 parts)"),
                                              ("F16", "Big-70B-F16.gguf"), ("Q8_0", Q8)]
    assert quant_row(dialog, Q8)[3] == "fits"
    assert float(quant_row(dialog, Q8)[4]) > 0
    assert quant_row(dialog, "Big-70B-F16.gguf")[3] == "does not fit"
    assert float(quant_row(dialog, "Big-70B-F16.gguf")[4]) < float(quant_row(dialog, Q8)[4])
    assert dialog.quant_tree.headerItem().text(3) == "Fits (ctx 4096)"
    others = dict(r[1].split(" · ") for r in table if r not in models)
    assert all(r[3] == "not a model" for r in table if r not in models)
    assert others["mmproj-Tiny-F16.gguf"] == "vision projector (mmproj)"
    assert others["Tiny.imatrix.gguf"] == "importance matrix (imatrix)"
    assert others["mtp-Tiny-Q4_0.gguf"].startswith("MTP head")
    assert others["Tiny-Q2_K-00001-of-00002.gguf (+1 parts)"] == "incomplete split model (1 of 2 parts)"
    assert not dialog.select_quant("mmproj-Tiny-F16.gguf")  # listed, never offered

    # The largest that fits is chosen: the split BF16 (the 70B is larger, and does not fit).
    group = dialog.selected_group()
    assert group is not None
    assert (group.quant, len(group.parts)) == ("BF16", 4)
    assert "tiny-drafter-same" in dialog.drafters_label.text()
    assert "predicted" in dialog.drafters_label.text()
    assert "mtp-Tiny-Q4_0.gguf" in dialog.drafters_label.text()
    assert dialog.download_button.isEnabled()
    assert not dialog.load_button.isEnabled()

    with qtbot.waitSignal(dialog.judged, timeout=HUB_MS):
        dialog.ctx_spin.setValue(512)  # judged again at the new context
    assert dialog.quant_tree.headerItem().text(3) == "Fits (ctx 512)"
    assert quant_row(dialog, Q8)[3] == "fits"

    # Long untrusted text wraps or elides: neither the window nor the view grows from it.
    dialog._say("x" * 3000)
    dialog.repo_label.setText("Quants of " + "y" * 500)
    assert window.minimumSizeHint().width() == min_width
    assert dialog.minimumSizeHint().width() < 800


def test_download_lists_in_the_picker_and_loads(qtbot: QtBot, make_window: object, hub: HubLookalike,
                                                tiny: Path, tmp_path: Path) -> None:
    hub.add_file(REPO, Q8, tiny)
    hub.add_file(REPO, "Tiny-F16.gguf", tiny)
    window = make_window()  # type: ignore[operator]
    window.picker.load_box.threads_spin.setValue(1)  # this machine has two shared cores
    window.picker.load_box.ctx_spin.setValue(512)
    dialog = open_view(window)
    assert dialog.ctx_spin.value() == 512  # the picker's context
    search(qtbot, dialog, "")  # nothing typed: the most downloaded
    choose_repo(qtbot, dialog, REPO)
    assert dialog.select_quant(Q8)
    assert dialog.download_button.isEnabled()
    with qtbot.waitSignal(dialog.download_finished, timeout=HUB_MS) as done:
        dialog.download_button.click()
    target = models_dir(tmp_path) / "acme" / "Tiny-GGUF" / Q8
    assert done.args == [str(target)]
    assert sha(target) == sha(tiny)
    assert sorted(p.name for p in target.parent.iterdir()) == [Q8]
    assert dialog.progress_bar.value() == 1000
    assert "verified against the Hub's sha256" in dialog.status_label.text()
    assert quant_row(dialog, Q8)[5] == "downloaded"
    assert not dialog.download_button.isEnabled()
    qtbot.waitUntil(lambda: window.picker.target_combo.findData(str(target)) >= 0, timeout=30_000)
    qtbot.waitUntil(dialog.load_button.isEnabled, timeout=5_000)

    with qtbot.waitSignal(window.bridge.model_loaded, timeout=LOAD_TIMEOUT_MS) as loaded:
        dialog.load_button.click()
    assert loaded.args[0].target.path == str(target)
    assert window.picker.target_path() == str(target)
    assert not dialog.isVisible()


def test_cancel_keeps_the_part_and_the_next_download_resumes(qtbot: QtBot, make_window: object,
                                                             hub: HubLookalike, tiny: Path, tmp_path: Path) -> None:
    hub.add_file(REPO, Q8, tiny)
    window = make_window(start_engine=False)  # type: ignore[operator]
    dialog = open_view(window)
    search(qtbot, dialog, "tiny")
    choose_repo(qtbot, dialog, REPO)
    hub.faults[Q8] = Fault(chunk=4096, sleep=0.005)  # throttled: chunks keep coming while Cancel is pressed
    assert dialog.selected_group() is not None
    dialog.download_button.click()
    qtbot.waitUntil(lambda: "/s" in dialog.rate_label.text(), timeout=HUB_MS)
    assert "left" in dialog.rate_label.text()
    assert dialog.cancel_button.isEnabled()
    assert not dialog.download_button.isEnabled()
    with qtbot.waitSignal(dialog.download_failed, timeout=HUB_MS) as stopped:
        dialog.cancel_button.click()
    assert "partial file is kept" in stopped.args[0]
    part = models_dir(tmp_path) / "acme" / "Tiny-GGUF" / f"{Q8}.part"
    have = part.stat().st_size
    assert 0 < have < tiny.stat().st_size
    assert tiny.read_bytes().startswith(part.read_bytes())
    assert not part.with_name(Q8).exists()
    assert quant_row(dialog, Q8)[5].endswith("%, resumes")
    assert dialog.download_button.text() == "Resume download"
    assert not dialog.load_button.isEnabled()

    hub.faults.pop(Q8)
    with qtbot.waitSignal(dialog.download_finished, timeout=HUB_MS):
        dialog.download_button.click()
    assert cdn_ranges(hub, Q8)[-1] == f"bytes={have}-"
    assert sha(part.with_name(Q8)) == sha(tiny)
    assert not part.exists()


def test_failures_are_sentences(qtbot: QtBot, make_window: object, hub: HubLookalike, tiny: Path,
                                tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hub.add_file(REPO, Q8, tiny)
    hub.add_file("acme/Gated-GGUF", Q8, tiny)
    hub.repos["acme/Gated-GGUF"].gated = True
    hub.add_file("acme/Bad-GGUF", Q8, tiny)
    hub.faults[Q8] = Fault(corrupt=True)  # by file name: the three repositories' Q8 files are served corrupted
    hub.add_listed_only("acme/Huge-GGUF", "Huge-Q4_K_M.gguf", 1 << 60)
    window = make_window(start_engine=False)  # type: ignore[operator]
    dialog = open_view(window)
    search(qtbot, dialog, "gguf")

    choose_repo(qtbot, dialog, "acme/Gated-GGUF")
    assert dialog.select_quant(Q8)
    with qtbot.waitSignal(dialog.download_failed, timeout=HUB_MS) as failed:
        dialog.download_button.click()
    assert "gated repository" in failed.args[0]
    assert "HF_TOKEN" in failed.args[0]

    choose_repo(qtbot, dialog, "acme/Bad-GGUF")
    assert dialog.select_quant(Q8)
    with qtbot.waitSignal(dialog.download_failed, timeout=HUB_MS) as failed:
        dialog.download_button.click()
    assert "did not verify" in failed.args[0]
    assert not (models_dir(tmp_path) / "acme" / "Bad-GGUF").exists() or not any(
        (models_dir(tmp_path) / "acme" / "Bad-GGUF").iterdir())

    choose_repo(qtbot, dialog, "acme/Huge-GGUF")
    assert quant_row(dialog, "Huge-Q4_K_M.gguf")[3] == "unknown"  # its header cannot be read: said, not guessed
    assert dialog.select_quant("Huge-Q4_K_M.gguf")
    with qtbot.waitSignal(dialog.download_failed, timeout=HUB_MS) as failed:
        dialog.download_button.click()
    assert "Not enough free space" in failed.args[0]
    assert "needed" in failed.args[0]

    with socket.socket() as s:  # a port nothing listens on: the Hub cannot be reached
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    search(qtbot, dialog, "tiny")
    text = dialog.status_label.text()
    assert "cannot be reached" in text
    assert "Traceback" not in text
    assert len(text.splitlines()) == 1
    choose_repo_failed = dialog.listed
    with qtbot.waitSignal(choose_repo_failed, timeout=HUB_MS):
        dialog.show_repo(REPO)
    assert "cannot be reached" in dialog.status_label.text()


def test_a_download_cut_off_resumes_at_the_next_start_of_the_window(qtbot: QtBot, make_window: object,
                                                                    hub: HubLookalike, tiny: Path,
                                                                    tmp_path: Path) -> None:
    from app.hub.client import HubError, list_files
    from app.hub.files import group_files
    from app.hub.transfer import RETRIES, choose, pull

    hub.add_file(REPO, Q8, tiny)
    size = tiny.stat().st_size
    # Every response is cut after a few kB, more times than one pull reconnects: the pull gives up.
    hub.faults[Q8] = Fault(cut_after=size // 16, cuts=RETRIES + 1, chunk=1024)
    group = choose(group_files(list_files(REPO)), quant="Q8_0", repo=REPO)
    with pytest.raises(HubError, match="partial file is kept"):
        pull(REPO, group)
    folder = models_dir(tmp_path) / "acme" / "Tiny-GGUF"
    part, record = folder / f"{Q8}.part", folder / f"{Q8}.pull.json"
    have = part.stat().st_size
    assert 0 < have < size
    assert record.is_file()
    hub.faults.pop(Q8)
    hub.expire_urls()  # the URLs of that run are signed and expired: fresh ones are needed
    before = len(cdn_ranges(hub, Q8))

    window = make_window(start_engine=False)  # type: ignore[operator]
    target = folder / Q8
    qtbot.waitUntil(lambda: window.picker.target_combo.findData(str(target)) >= 0, timeout=HUB_MS)
    dialog = window.find_models.dialog
    assert dialog is not None
    assert dialog.isVisible()  # shown with its progress and Cancel while it ran
    assert sha(target) == sha(tiny)
    assert "verified against the Hub's sha256" in dialog.status_label.text()
    assert cdn_ranges(hub, Q8)[before:] == [f"bytes={have}-"]
    assert sorted(p.name for p in folder.iterdir()) == [Q8]  # no partial file, no record left


def test_a_hostile_download_record_is_ignored(qtbot: QtBot, make_window: object, hub: HubLookalike,
                                             tiny: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import json

    hub.add_file(REPO, Q8, tiny)
    folder = models_dir(tmp_path) / "acme" / "Tiny-GGUF"
    folder.mkdir(parents=True)
    (folder / f"{Q8}.part").write_bytes(tiny.read_bytes()[:4096])
    record = {"repo": "acme/Other", "revision": "main", "kind": "model", "quant": "Q8_0", "name": Q8,
              "expected_parts": 1, "parts": [{"path": f"../../../{Q8}", "size": tiny.stat().st_size,
                                              "sha256": None}]}
    (folder / f"{Q8}.pull.json").write_text(json.dumps(record))
    (folder / "x.gguf.pull.json").write_bytes(b"\xff{not json")
    with caplog.at_level("WARNING"):
        window = make_window(start_engine=False)  # type: ignore[operator]
        qtbot.waitUntil(lambda: sum("Ignored the download record" in r.message for r in caplog.records) == 2,
                        timeout=HUB_MS)
    assert window.find_models.dialog is None  # nothing resumed
    assert not hub.cdn_requests()
    assert not (models_dir(tmp_path) / Q8).exists()


def test_the_first_start_panel_offers_the_hub(qtbot: QtBot, make_window: object, hub: HubLookalike, tiny: Path,
                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hub.add_file(REPO, Q8, tiny)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # a fresh home: no models anywhere discovery looks
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    window = make_window(start_engine=False)  # type: ignore[operator]
    window.resize(1024, 700)
    window.show()
    qtbot.waitExposed(window)
    panel = window.first_run
    assert window.stack.currentWidget() is panel
    assert panel.hub_button.isVisible()
    assert panel.demo_button.isVisible()
    assert panel.hub_button.y() == panel.demo_button.y()  # beside "Install demo models"
    panel.hub_button.click()
    dialog = window.find_models.dialog
    assert dialog is not None
    assert dialog.isVisible()
    search(qtbot, dialog, "tiny")
    choose_repo(qtbot, dialog, REPO)
    with qtbot.waitSignal(dialog.download_finished, timeout=HUB_MS):
        dialog.download_button.click()
    target = models_dir(tmp_path) / "acme" / "Tiny-GGUF" / Q8
    qtbot.waitUntil(lambda: window.picker.target_combo.findData(str(target)) >= 0, timeout=30_000)
    qtbot.waitUntil(lambda: window.stack.currentWidget() is not panel, timeout=5_000)  # the library has a model now


def test_drafters_from_other_repositories_in_the_view(qtbot: QtBot, make_window: object, hub: HubLookalike,
                                                      tiny: Path, tmp_path: Path) -> None:
    small = {"n_embd": 32, "n_ff": 64}
    same = write_tiny_model(tmp_path / "same.gguf", name="tiny-small", **small)  # type: ignore[arg-type]
    other = write_tiny_model(tmp_path / "alt.gguf", vocab="bytes-alt", name="tiny-alt", **small)  # type: ignore[arg-type]
    hub.add_file(REPO, Q8, tiny)
    hub.add_file("acme/Tiny-Small-GGUF", "Tiny-Small-Q8_0.gguf", same)
    hub.add_file("acme/Tiny-Alt-GGUF", "Tiny-Alt-Q8_0.gguf", other)  # another tokenizer
    hub.add_file("acme/Tiny-Broken-GGUF", "Tiny-Broken-Q4_0.gguf", b"not a GGUF file at all")
    hub.repos[REPO].downloads = 100
    hub.repos["acme/Tiny-Broken-GGUF"].downloads = 99  # looked at first: its failure must not stop the rest
    window = make_window(start_engine=False)  # type: ignore[operator]
    dialog = open_view(window)
    search(qtbot, dialog, "tiny")
    choose_repo(qtbot, dialog, REPO)
    qtbot.waitUntil(lambda: dialog.remote_drafters is not None, timeout=HUB_MS)
    assert quant_row(dialog, Q8)[3] == "fits"  # the listing is whole
    assert dialog.remote_drafters is not None
    assert [d.repo for d in dialog.remote_drafters] == ["acme/Tiny-Small-GGUF"]
    text = dialog.drafters_label.text()
    assert "acme/Tiny-Small-GGUF" in text
    assert format_bytes(same.stat().st_size) in text  # with its size
    assert "Tiny-Alt" not in text
    assert "Tiny-Broken" not in text
    assert any("file=Tiny-Broken-Q4_0.gguf" in r.path for r in hub.cdn_requests())  # tried, and skipped
