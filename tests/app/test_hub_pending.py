"""The record a pull keeps beside its partial file (app.hub.pending): read back as the pull that wrote it, and
anything else in its place (corrupt, hostile, naming files outside its folder, a FIFO) ignored with a log line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from app.hub.files import MODEL, ModelFiles, RemoteFile
from app.hub.pending import part_path, pending_pulls, record_path, target_folder, write_record

REPO = "acme/Tiny-GGUF"
SHA = "ab" * 32


def split_group() -> ModelFiles:
    parts = (RemoteFile("BF16/m-BF16-00001-of-00002.gguf", 1000, SHA), RemoteFile("BF16/m-BF16-00002-of-00002.gguf",
                                                                                   500, None))
    return ModelFiles(MODEL, "BF16", parts[0].path, parts, 2)


def first_target(root: Path, group: ModelFiles) -> Path:
    folder = target_folder(REPO, root)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / Path(group.parts[0].path).name


def test_a_record_reads_back_as_the_pull_that_wrote_it(tmp_path: Path) -> None:
    group = split_group()
    first = first_target(tmp_path, group)
    write_record(first, REPO, "main", group)
    part_path(first).write_bytes(b"x" * 300)
    (found,) = pending_pulls(tmp_path)
    assert (found.repo, found.revision, found.group, found.done) == (REPO, "main", group, 300)


def test_a_record_with_nothing_to_resume_is_removed(tmp_path: Path) -> None:
    group = split_group()
    first = first_target(tmp_path, group)
    write_record(first, REPO, "main", group)
    assert pending_pulls(tmp_path) == []
    assert not record_path(first).exists()


@pytest.mark.parametrize("change", [
    {"repo": "acme/Other"},  # not the folder it lies in
    {"repo": "../x"},
    {"revision": "main; rm -rf /"},
    {"parts": [{"path": "../../../evil.gguf", "size": 10, "sha256": None}]},
    {"parts": [{"path": "BF16/m-BF16-00001-of-00002.gguf", "size": -1, "sha256": None}]},
    {"parts": [{"path": "BF16/m-BF16-00001-of-00002.gguf", "size": 10, "sha256": "not a sha"}]},
    {"parts": [{"path": "BF16/m-BF16-00001-of-00002.gguf", "size": True, "sha256": None}]},
    {"expected_parts": 7},
    {"parts": "everything"},
])
def test_a_hostile_record_is_ignored_with_one_log_line(tmp_path: Path, change: dict[str, object],
                                                       caplog: pytest.LogCaptureFixture) -> None:
    group = split_group()
    first = first_target(tmp_path, group)
    write_record(first, REPO, "main", group)
    part_path(first).write_bytes(b"x" * 300)
    doc = json.loads(record_path(first).read_text())
    doc.update(change)
    if isinstance(doc["parts"], list):
        doc["expected_parts"] = change.get("expected_parts", len(doc["parts"]))
    record_path(first).write_text(json.dumps(doc))
    with caplog.at_level("WARNING"):
        assert pending_pulls(tmp_path) == []
    assert [r.message.startswith("Ignored the download record") for r in caplog.records] == [True]
    assert part_path(first).exists()  # nothing is deleted on a record's word


def test_a_corrupt_or_irregular_record_is_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = target_folder(REPO, tmp_path)
    folder.mkdir(parents=True)
    (folder / "a.gguf.pull.json").write_bytes(b"\xff\x00{")
    (folder / "b.gguf.pull.json").write_text("[" * 100_000)
    os.mkfifo(folder / "c.gguf.pull.json")  # a reader that waited for a writer would hang here
    (folder / "d.gguf.pull.json").write_bytes(b" " * (1 << 20))
    with caplog.at_level("WARNING"):
        assert pending_pulls(tmp_path) == []
    assert sum("Ignored the download record" in r.message for r in caplog.records) == 4
