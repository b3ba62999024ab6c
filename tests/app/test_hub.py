"""`specdeck search` and `specdeck pull` against a Hub look-alike on loopback (tests/hub_lookalike.py), through
the real huggingface_hub client and SpecDeck's own downloader, with real tiny GGUF files."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.cli import main
from tests.gguf_fixtures import write_small_gguf, write_tiny_model
from tests.hub_lookalike import Fault, HubLookalike, big_model_header, write_split_model

ROOT = Path(__file__).resolve().parents[2]
REPO = "acme/Tiny-GGUF"
Q8 = "Tiny-Q8_0.gguf"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("hub-src") / "tiny.gguf", name="tiny")


@pytest.fixture(scope="module")
def probe_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One SPECDECK_HOME for the module, so the CPU probe behind the fit runs once."""
    return tmp_path_factory.mktemp("hub-home")


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, probe_home: Path) -> Iterator[HubLookalike]:
    server = HubLookalike()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no saved token
    monkeypatch.setenv("SPECDECK_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("SPECDECK_HOME", str(probe_home))
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    yield server
    server.close()


def models_dir(tmp_path: Path) -> Path:
    return tmp_path / "models"


def files_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def cdn_ranges(hub: HubLookalike, name: str) -> list[str | None]:
    return [r.headers.get("range") for r in hub.cdn_requests() if f"file={name}" in r.path and r.method == "GET"]


def test_search_lists_gguf_repositories(hub: HubLookalike, tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hub.add_file("acme/Tiny-Other-GGUF", "x-Q4_K_M.gguf", tiny)
    hub.add_file(REPO, Q8, tiny)
    hub.add_file("acme/tiny-safetensors", "model.safetensors", b"not gguf")
    hub.repos["acme/Tiny-Other-GGUF"].downloads = 10
    hub.repos[REPO].downloads, hub.repos[REPO].likes = 12_345, 7
    hub.repos["acme/tiny-safetensors"].tags = ("safetensors",)

    code, out, _ = run_cli(capsys, "search", "tiny", "--json")
    assert code == 0
    found = json.loads(out)["repositories"]
    assert [r["repo"] for r in found] == [REPO, "acme/Tiny-Other-GGUF"]
    assert found[0]["downloads"] == 12_345
    assert found[0]["likes"] == 7
    assert found[0]["last_modified"].startswith("2026-09-01")
    searches = [r.path for r in hub.requests if r.path.startswith("/api/models?")]
    assert all("filter=gguf" in p for p in searches)

    code, out, _ = run_cli(capsys, "search", "tiny", "--limit", "1")
    assert code == 0
    assert REPO in out
    assert "12.3k" in out
    assert "acme/Tiny-Other-GGUF" not in out


def test_quant_list_joins_split_parts_and_labels_other_files(hub: HubLookalike, tiny: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    parts = write_split_model(tiny, tmp_path / "split", "Tiny-BF16", max_tensors=6)
    assert len(parts) == 4
    for p in parts:
        hub.add_file(REPO, f"BF16/{p.name}", p)
    hub.add_file(REPO, Q8, tiny)
    hub.add_file(REPO, "mmproj-Tiny-F16.gguf", tiny)
    hub.add_file(REPO, "Tiny.imatrix.gguf", tiny)
    hub.add_file(REPO, "MTP/mtp-Tiny-Q4_0.gguf", tiny)
    hub.add_file(REPO, "Tiny-Q2_K-00001-of-00002.gguf", parts[0])  # its second part is missing
    hub.add_file(REPO, "README.md", b"# Tiny\n")

    code, out, _ = run_cli(capsys, "search", REPO, "--json", "--ctx", "512")
    assert code == 0, out
    rows = json.loads(out)["files"]
    models = [r for r in rows if r["kind"] == "model" and r["complete"]]
    assert [(r["quant"], len(r["parts"])) for r in models] == [("BF16", 4), ("Q8_0", 1)]
    assert models[0]["size_bytes"] == sum(p.stat().st_size for p in parts)
    for r in models:
        assert r["fits"] is True, r
        assert r["tokens_per_second"] > 0
        assert r["ctx"] == 512
        assert r["architecture"] == "llama"
        assert r["quantization"] == "F32"
    assert models[0]["n_params"] == models[1]["n_params"]  # every part's tensors counted
    kinds = {r["file"]: r["kind"] for r in rows if r not in models}
    assert kinds["mmproj-Tiny-F16.gguf"].startswith("vision projector")
    assert kinds["Tiny.imatrix.gguf"].startswith("importance matrix")
    assert kinds["MTP/mtp-Tiny-Q4_0.gguf"].startswith("MTP head")
    assert kinds["Tiny-Q2_K-00001-of-00002.gguf"] == "model"  # listed apart: incomplete
    assert all(r.startswith("bytes=0-") for r in cdn_ranges(hub, Q8))  # header reads ask a Range

    code, out, _ = run_cli(capsys, "search", REPO, "--no-fit")
    assert code == 0
    table, others = out.split("Not models")
    assert "BF16" in table
    assert "Q8_0" in table
    assert "mmproj" not in table
    assert "Q2_K" not in table
    assert "vision projector" in others
    assert "incomplete split model (1 of 2 parts)" in others


def test_pull_resumes_a_cut_connection_and_models_lists_it(hub: HubLookalike, tiny: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    hub.add_file(REPO, Q8, tiny)
    hub.add_file(REPO, "Tiny-F16.gguf", tiny)
    hub.faults[Q8] = Fault(cut_after=100_000)

    code, out, err = run_cli(capsys, "pull", REPO, "--quant", "q8_0")
    assert code == 0, err
    target = models_dir(tmp_path) / "acme" / "Tiny-GGUF" / Q8
    assert sha(target) == sha(tiny)
    assert files_in(models_dir(tmp_path)) == [target]
    assert cdn_ranges(hub, Q8) == [None, "bytes=100000-"]
    resolves = [r for r in hub.requests if r.method == "HEAD" and r.path.endswith(f"/resolve/main/{Q8}")]
    assert len(resolves) == 2  # a fresh URL for the resumed request
    assert "100%" in err
    assert "/s" in err
    assert "left" in err
    assert "verified" in out

    code, out, _ = run_cli(capsys, "models", "--json")
    assert code == 0
    listed = [m for m in json.loads(out)["models"] if m["path"] == str(target)]
    assert listed
    assert listed[0]["error"] is None
    assert listed[0]["architecture"] == "llama"

    code, out, _ = run_cli(capsys, "pull", REPO, "--file", Q8)
    assert code == 0
    assert "already in the models folder" in out


def test_split_model_pulled_part_by_part(hub: HubLookalike, tiny: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    from app.library.discovery import discover

    parts = write_split_model(tiny, tmp_path / "split", "Tiny-BF16", max_tensors=6)
    for p in parts:
        hub.add_file(REPO, f"BF16/{p.name}", p)
    hub.add_file(REPO, Q8, tiny)
    code, _, err = run_cli(capsys, "pull", REPO, "--file", parts[2].name)  # any part picks the whole model
    assert code == 0, err
    folder = models_dir(tmp_path) / "acme" / "Tiny-GGUF"
    assert [p.name for p in files_in(folder)] == [p.name for p in parts]
    assert all(sha(folder / p.name) == sha(p) for p in parts)
    entries = [e for e in discover(specdeck_dir=models_dir(tmp_path), use_cache=False)
               if e.path.startswith(str(folder)) and e.info is not None and e.info.kind == "model"]
    assert len(entries) == 1
    assert entries[0].info is not None
    assert entries[0].info.missing_shards == ()


def test_a_corrupted_download_is_refused_and_deleted(hub: HubLookalike, tiny: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    hub.add_file(REPO, Q8, tiny)
    hub.faults[Q8] = Fault(corrupt=True)
    code, _, err = run_cli(capsys, "pull", REPO)
    assert code == 1
    assert "did not verify" in err
    assert "deleted" in err
    assert err.count("\nspecdeck pull:") <= 1
    assert files_in(models_dir(tmp_path)) == []


def test_an_error_body_is_never_written_into_a_model(hub: HubLookalike, tiny: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    hub.add_file(REPO, Q8, tiny)
    hub.faults[Q8] = Fault(deny=1)
    code, _, err = run_cli(capsys, "pull", REPO)
    assert code == 1
    assert "answered 403" in err
    assert files_in(models_dir(tmp_path)) == []

    hub.faults[Q8] = Fault(cut_after=50_000, deny=10, deny_after=1)  # cut, then every fresh URL refused
    code, _, err = run_cli(capsys, "pull", REPO)
    assert code == 1
    assert "answered 403" in err
    assert "kept" in err
    part, record = files_in(models_dir(tmp_path))
    assert (part.name, record.name) == (f"{Q8}.part", f"{Q8}.pull.json")  # the record: what the window resumes
    assert part.read_bytes() == tiny.read_bytes()[:50_000]  # no XML after the good bytes

    hub.faults.pop(Q8)
    code, _, err = run_cli(capsys, "pull", REPO)
    assert code == 0, err
    assert cdn_ranges(hub, Q8)[-1] == "bytes=50000-"
    assert sha(part.with_name(Q8)) == sha(tiny)


def test_a_gated_repository_needs_a_token(hub: HubLookalike, tiny: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    hub.add_file(REPO, Q8, tiny)
    hub.repos[REPO].gated = True
    code, _, err = run_cli(capsys, "pull", REPO)
    assert code == 1
    assert "gated repository" in err
    assert "HF_TOKEN" in err
    assert len(err.strip().splitlines()) == 1
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    code, _, err = run_cli(capsys, "pull", REPO)
    assert code == 1
    assert "token given has no access" in err
    assert files_in(models_dir(tmp_path)) == []
    monkeypatch.setenv("HF_TOKEN", "hf_good")
    code, _, err = run_cli(capsys, "pull", REPO)
    assert code == 0, err
    assert sha(models_dir(tmp_path) / "acme" / "Tiny-GGUF" / Q8) == sha(tiny)
    assert not any("authorization" in r.headers for r in hub.cdn_requests())  # the token stays on the Hub


def test_kill_9_mid_download_then_resume(hub: HubLookalike, tiny: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    hub.add_file(REPO, Q8, tiny)
    held = 150_000
    hub.faults[Q8] = Fault(chunk=4096, sleep=0.002, hold_after=held)
    part = models_dir(tmp_path) / "acme" / "Tiny-GGUF" / f"{Q8}.part"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.Popen([sys.executable, "-m", "app", "pull", REPO], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120  # a bound on a hung child, not a measurement
        while not (part.exists() and part.stat().st_size >= held):
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the pull never reached the held byte"
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
        hub.faults[Q8].release.set()
        child.communicate()
    assert child.returncode == -signal.SIGKILL
    assert part.stat().st_size == held
    killed_url = next(r.path for r in reversed(hub.cdn_requests()) if f"file={Q8}" in r.path)
    hub.expire_urls()
    hub.faults.pop(Q8)

    code, _, err = run_cli(capsys, "pull", REPO)
    assert code == 0, err
    assert cdn_ranges(hub, Q8)[-1] == f"bytes={held}-"
    assert hub.cdn_requests()[-1].path != killed_url
    assert files_in(models_dir(tmp_path)) == [part.with_name(Q8)]
    assert sha(part.with_name(Q8)) == sha(tiny)


def test_free_space_is_checked_before_any_byte(hub: HubLookalike, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    hub.add_listed_only(REPO, "Huge-Q4_K_M.gguf", 1 << 60)
    code, _, err = run_cli(capsys, "pull", REPO)
    assert code == 1
    assert "Not enough free space" in err
    assert " free, " in err
    assert "needed" in err
    assert hub.cdn_requests() == []
    assert files_in(models_dir(tmp_path)) == []


def test_bad_input_gets_one_sentence(hub: HubLookalike, tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hub.add_file(REPO, Q8, tiny)
    hub.add_file(REPO, "Tiny-F16.gguf", tiny)
    code, _, err = run_cli(capsys, "pull", "not a repo")
    assert code == 2
    assert "owner/name" in err
    code, _, err = run_cli(capsys, "pull", REPO)
    assert code == 1
    assert "--quant (one of F16, Q8_0)" in err
    code, _, err = run_cli(capsys, "pull", REPO, "--quant", "Q5_K_M")
    assert code == 1
    assert "no Q5_K_M model; its quants: F16, Q8_0" in err
    code, _, err = run_cli(capsys, "pull", REPO, "--file", "nope.gguf")
    assert code == 1
    assert "has no GGUF file nope.gguf" in err
    code, _, err = run_cli(capsys, "pull", "acme/missing")
    assert code == 1
    assert "no repository acme/missing" in err
    code, _, err = run_cli(capsys, "search", "tiny", "--limit", "0")
    assert code == 2
    assert "--limit" in err
    for e in (err,):
        assert len(e.strip().splitlines()) == 1


def test_no_network_says_so(hub: HubLookalike, monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    for argv in (("search", "tiny"), ("pull", REPO)):
        code, _, err = run_cli(capsys, *argv)
        assert code == 1
        assert "cannot be reached" in err
        assert len(err.strip().splitlines()) == 1


def test_offline_mode_says_so(hub: HubLookalike, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = run_cli(capsys, "search", "tiny")
    assert code == 1
    assert "HF_HUB_OFFLINE is set" in err
    assert hub.requests == []


def test_a_quant_too_big_for_this_machine_does_not_fit(hub: HubLookalike, tiny: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    header, size = big_model_header(tmp_path / "big")
    hub.add_header_only(REPO, "Big-70B-F16.gguf", header, size)
    hub.add_file(REPO, Q8, tiny)
    code, out, _ = run_cli(capsys, "search", REPO, "--json")
    assert code == 0
    rows = {r["quant"]: r for r in json.loads(out)["files"]}
    assert rows["F16"]["error"] is None, rows["F16"]
    assert rows["F16"]["fits"] is False
    assert rows["F16"]["fit"].startswith("Does not fit on ")
    assert rows["F16"]["n_params"] > 40e9
    assert rows["F16"]["tokens_per_second"] < rows["Q8_0"]["tokens_per_second"]
    assert rows["Q8_0"]["fits"] is True
    code, out, _ = run_cli(capsys, "search", REPO)
    assert code == 0
    assert "does not fit" in out
    assert "F16: Does not fit on " in out


def test_a_long_header_is_read_with_growing_ranges(hub: HubLookalike, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    long_text = "x" * (3 << 20)  # a 3 MiB description: the header goes on past the first MiB
    path = write_small_gguf(tmp_path / "long.gguf", "llama",
                            lambda w: w.add_string("general.description", long_text))
    hub.add_file(REPO, "Long-Q4_0.gguf", path)
    code, out, _ = run_cli(capsys, "search", REPO, "--json")
    assert code == 0
    (row,) = json.loads(out)["files"]
    assert row["architecture"] == "llama", row
    assert cdn_ranges(hub, "Long-Q4_0.gguf") == ["bytes=0-1048575", f"bytes=0-{path.stat().st_size - 1}"]


def test_a_file_kept_in_git_comes_from_the_hub_with_the_token(hub: HubLookalike, tiny: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    hub.add_in_git(REPO, Q8, tiny)
    hub.repos[REPO].gated = True
    monkeypatch.setenv("HF_TOKEN", "hf_good")
    code, out, err = run_cli(capsys, "pull", REPO)
    assert code == 0, err
    assert "size checked (the Hub gave no sha256)" in out
    assert sha(models_dir(tmp_path) / "acme" / "Tiny-GGUF" / Q8) == sha(tiny)
    assert hub.cdn_requests() == []


def test_a_pull_asked_to_stop_keeps_its_partial_file(hub: HubLookalike, tiny: Path, tmp_path: Path) -> None:
    from app.hub.client import list_files
    from app.hub.files import group_files
    from app.hub.transfer import Progress, PullStopped, choose, pull

    hub.add_file(REPO, Q8, tiny)
    hub.faults[Q8] = Fault(chunk=8192)
    seen: list[Progress] = []
    group = choose(group_files(list_files(REPO)), repo=REPO)
    with pytest.raises(PullStopped, match="partial file is kept"):
        pull(REPO, group, progress=seen.append, stop=lambda: len(seen) >= 3)
    part = models_dir(tmp_path) / "acme" / "Tiny-GGUF" / f"{Q8}.part"
    assert 0 < part.stat().st_size == seen[-1].done < tiny.stat().st_size
    assert tiny.read_bytes().startswith(part.read_bytes())

    done = pull(REPO, group, progress=seen.append)
    assert done.verified
    assert done.paths == (part.with_name(Q8),)
    assert cdn_ranges(hub, Q8)[-1] == f"bytes={seen[2].done}-"
    assert seen[-1].done == seen[-1].total == tiny.stat().st_size


def test_drafters_from_other_repositories_share_the_tokenizer(hub: HubLookalike, tiny: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    small = dict(n_embd=32, n_ff=64)
    same = write_tiny_model(tmp_path / "same.gguf", name="tiny-small", **small)  # type: ignore[arg-type]
    other = write_tiny_model(tmp_path / "alt.gguf", vocab="bytes-alt", name="tiny-alt", **small)  # type: ignore[arg-type]
    assert same.stat().st_size < tiny.stat().st_size
    hub.add_file(REPO, Q8, tiny)
    hub.add_file("acme/Tiny-Small-GGUF", "Tiny-Small-Q8_0.gguf", same)
    hub.add_file("acme/Tiny-Small-GGUF", "Tiny-Small-F16.gguf", tiny)  # larger: its smallest quant is the one
    hub.add_file("acme/Tiny-Alt-GGUF", "Tiny-Alt-Q8_0.gguf", other)  # another tokenizer
    hub.add_file("acme/Tiny-Broken-GGUF", "Tiny-Broken-Q4_0.gguf", b"not a GGUF file at all")
    hub.add_file("acme/Tiny-Huge-GGUF", "Tiny-Huge-F32.gguf", tiny)  # no quant smaller than the target
    hub.repos["acme/Tiny-Broken-GGUF"].downloads = 99  # looked at first: its failure must not stop the rest

    code, out, err = run_cli(capsys, "search", REPO, "--json", "--ctx", "512")
    assert code == 0, err
    (row,) = [r for r in json.loads(out)["files"] if r["kind"] == "model"]
    found = row["drafters_from_other_repositories"]
    assert [(d["repo"], d["file"], d["size_bytes"]) for d in found] == [
        ("acme/Tiny-Small-GGUF", "Tiny-Small-Q8_0.gguf", same.stat().st_size)]
    assert any("file=Tiny-Broken-Q4_0.gguf" in r.path for r in hub.cdn_requests())  # tried, and skipped
    assert not any("file=Tiny-Huge-F32.gguf" in r.path for r in hub.cdn_requests())  # never read

    code, out, err = run_cli(capsys, "search", REPO, "--ctx", "512")
    assert code == 0, err
    drafters = out.split("Drafters from other repositories")[1]
    assert "acme/Tiny-Small-GGUF" in drafters
    assert "Tiny-Alt" not in drafters
    assert "Tiny-Broken" not in drafters
