"""packaging/gpu_check.py's dry run: the same steps as on a GPU, at sizes a CPU runs in seconds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.engine.llama import Model, init_backend
from app.engine.mtp import check_mtp_target
from app.library.gguf_reader import read_gguf_info
from tests.setup.test_device_fit import ROOT, gpu_check_module


def test_the_synthetic_qwen35_loads_with_its_mtp_block(tmp_path: Path) -> None:
    g = gpu_check_module()
    shape = g.MTP_SHAPES["mtp-tiny"]
    path = g.write_model(tmp_path / "mtp.gguf", shape)
    info = read_gguf_info(path)
    assert (info.architecture, info.n_layer, info.mtp_layers) == ("qwen35", shape.n_layer + 1, 1)
    # Every fourth trunk layer is gated attention, the others Gated DeltaNet.
    assert info.kv_layers == (False, False, False, True, False)
    assert info.recurrent_layers == 3
    init_backend(None)
    model = Model(path, n_gpu_layers=0, load_mtp=True)
    try:
        check_mtp_target(model, info)  # llama.cpp reads the one MTP block the header names
    finally:
        model.close()


@pytest.mark.process
def test_the_dry_run_reports_every_step(tmp_path: Path) -> None:
    """In a process of its own, as the GPU run starts it: the imports it makes are then its own, and each must
    come from the GPU machine's Python or the kit."""
    kit = tmp_path / "kit"
    kit.mkdir()
    (kit / "wheel.whl").write_bytes(b"\0" * 1000)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(ROOT / "packaging" / "gpu_check.py"), "--cpu", "--models", "tiny,mtp-tiny",
         "--out", str(out), "--kit", str(kit), "--decode-tokens", "8", "--exact-tokens", "16", "--max-width", "4"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["ok"]
    assert report["imports_outside_kit"] == []
    assert report["travel"]["kit_bytes"] == 1000
    assert report["travel"]["ok"]
    tiny, mtp = report["models"]["tiny"], report["models"]["mtp-tiny"]
    assert tiny["exactness"]["ok"]
    assert set(tiny["verify"]["ms"]) == {"1", "2", "3", "4"}
    assert tiny["ceiling"]["tokens_per_second"] > 0
    assert mtp["exactness"]["ok"]
    assert mtp["exactness"]["drafted"] > 0
    assert mtp["mtp"]["c"] > 0
    assert mtp["mtp"]["mirror_ms_per_pass"] > 0
