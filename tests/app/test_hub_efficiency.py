"""The predicted plain tok/s of a quant on the Hub: the roofline ceiling times the efficiency `specdeck doctor`
measured on this machine when there is one (kept in SPECDECK_HOME), else the ceiling alone, and `specdeck search`
says which."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.ceiling.roofline import Device
from app.cli import main
from app.hub.efficiency import default_path, device_id, efficiency_for, load_all, record_doctor_report, save_efficiency
from app.hub.verdict import CEILING_ONLY
from tests.gguf_fixtures import write_tiny_model
from tests.hub_lookalike import HubLookalike

REPO = "acme/Tiny-GGUF"
Q8 = "Tiny-Q8_0.gguf"
CPU = Device("cpu", "Test CPU 9000", "cpu", 40e9, None, 8 << 30)
GPU = Device("gpu0", "Test GPU", "gpu", 900e9, None, 24 << 30)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("hub-src") / "tiny.gguf", name="tiny")


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("SPECDECK_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, home: Path) -> Iterator[HubLookalike]:
    server = HubLookalike()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("SPECDECK_MODELS_DIR", str(tmp_path / "models"))
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    # Fixed devices: the prediction's arithmetic, not this machine's probe.
    monkeypatch.setattr("app.cli.hub._devices", lambda: [CPU])
    yield server
    server.close()


def doctor_report(efficiency: object, *, ok: bool = True, binding: str = "gpu0") -> dict[str, object]:
    """The parts of `doctor --json` that the store reads."""
    return {
        "backend": {"backend": "cuda"},
        "devices": [{"key": "cpu", "name": CPU.name, "kind": "cpu"}, {"key": "gpu0", "name": GPU.name, "kind": "gpu"}],
        "target": {"path": "/models/x.gguf"},
        "ceiling": {"binding_device": binding},
        "decode_check": {"ok": ok, "calibration": {"efficiency": efficiency}},
    }


def test_doctor_report_is_kept_per_binding_device(home: Path) -> None:
    assert efficiency_for(GPU) is None
    kept = record_doctor_report(doctor_report(0.62))
    assert kept is not None
    assert (kept.device, kept.backend, kept.model) == (device_id("gpu", GPU.name), "cuda", "/models/x.gguf")
    assert default_path().is_relative_to(home)
    got = efficiency_for(GPU)
    assert got is not None
    assert got.efficiency == pytest.approx(0.62)
    assert got.describe().startswith("predicted from doctor's measured 62 % of the ceiling (")
    assert efficiency_for(CPU) is None  # another device: not measured
    assert efficiency_for(Device("gpu0", "Another GPU", "gpu", 1e12)) is None  # same key, another card

    # A failed check, no efficiency or an absurd one keep nothing; a later measurement replaces the earlier.
    assert record_doctor_report(doctor_report(None)) is None
    assert record_doctor_report(doctor_report(0.9, ok=False)) is None
    with pytest.raises(ValueError, match="efficiency"):
        record_doctor_report(doctor_report(7.0))
    record_doctor_report(doctor_report(0.4))
    assert efficiency_for(GPU).efficiency == pytest.approx(0.4)  # type: ignore[union-attr]

    # A damaged store is no measurement, never an error.
    default_path().write_text(json.dumps({device_id("gpu", GPU.name): {"efficiency": "fast"}, "x": 3}))
    assert load_all() == {}
    default_path().write_text("{not json")
    assert efficiency_for(GPU) is None


def test_search_predicts_from_the_measured_efficiency(hub: HubLookalike, tiny: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    hub.add_file(REPO, Q8, tiny)

    assert main(["search", REPO, "--json", "--ctx", "512"]) == 0
    (row,) = [r for r in json.loads(capsys.readouterr().out)["files"] if r["kind"] == "model"]
    ceiling = row["ceiling_tokens_per_second"]
    assert ceiling > 0
    assert row["tokens_per_second"] == ceiling
    assert row["efficiency"] is None
    assert row["speed_basis"] == CEILING_ONLY
    assert main(["search", REPO, "--ctx", "512"]) == 0
    assert f"PLAIN TOK/S: {CEILING_ONLY}." in capsys.readouterr().out

    save_efficiency(device_id("cpu", CPU.name), 0.25, backend="cpu")
    assert main(["search", REPO, "--json", "--ctx", "512"]) == 0
    (row,) = [r for r in json.loads(capsys.readouterr().out)["files"] if r["kind"] == "model"]
    assert row["ceiling_tokens_per_second"] == pytest.approx(ceiling)
    assert row["tokens_per_second"] == pytest.approx(ceiling * 0.25)
    assert row["efficiency"] == pytest.approx(0.25)
    assert row["speed_basis"].startswith("predicted from doctor's measured 25 % of the ceiling")
    assert main(["search", REPO, "--ctx", "512"]) == 0
    out = capsys.readouterr().out
    assert "PLAIN TOK/S: predicted from doctor's measured 25 % of the ceiling (" in out
    assert ", cpu)." in out
    speed = f"{ceiling * 0.25:.{0 if ceiling * 0.25 >= 100 else 1}f}"
    assert any(line.startswith("Q8_0") and line.endswith(speed) for line in out.splitlines()), out
