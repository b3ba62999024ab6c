"""The About box names SpecDeck's version and the llama.cpp build (version, commit, backend, CPU features)."""

from __future__ import annotations

import re

from pytestqt.qtbot import QtBot

import app


def test_about_box_shows_version_and_llama_cpp_build(qtbot: QtBot, make_window: object) -> None:
    window = make_window(start_engine=False)  # type: ignore[operator]
    window._on_about_action_triggered()
    box = window._about_box
    assert box is not None
    assert f"SpecDeck {app.__version__}" in box.text()
    qtbot.waitUntil(lambda: "Backend:" in box.text(), timeout=60_000)
    text = box.text()
    assert "llama.cpp 0." in text
    assert "commit" in text
    assert re.search(r"Backend: (cpu|cuda|vulkan|metal)\b", text)  # every build the README supports
    assert "CPU features:" in text
    box.close()


def test_about_box_says_in_one_line_why_a_gpu_build_runs_on_the_cpu(qtbot: QtBot, make_window: object) -> None:
    """The window gets the build info from the probe child; a CUDA bundle on a machine without a driver."""
    from app.ceiling.backend import BackendDevice, BackendInfo

    window = make_window(start_engine=False)  # type: ignore[operator]
    reason = "CUDA: no NVIDIA driver is installed (libcuda not found); llama.cpp runs on the CPU"
    window._on_build_info_ready(BackendInfo(
        available=True, llama_cpp="0.5.0", ggml_version="0.9.4", ggml_commit="abc1234", backend="cpu",
        gpu_offload=True, cpu_features=("AVX2",), modules=("libggml-cpu.so", "libggml-cuda.so"),
        devices=(BackendDevice("CPU", "AMD EPYC", "cpu", "CPU", 20 << 30, 24 << 30),), gpu_fallback=reason))
    window._on_about_action_triggered()
    box = window._about_box
    assert box is not None
    lines = box.text().splitlines()
    assert f"No GPU: {reason}" in lines
    assert "Backend: cpu (GPU offload)" in lines
    box.close()
