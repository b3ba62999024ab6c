"""The `vulkan` tests run on a real Vulkan device (Mesa's llvmpipe where there is no GPU), against llama.cpp
built with -DGGML_VULKAN=ON: `packaging/vulkan_tests` builds that (once, cached) into .venv-vulkan and runs
them with SPECDECK_VULKAN_TESTS=1. Without that variable they are skipped; with it, a build or machine
without a Vulkan device fails them instead of skipping."""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ENABLED = os.environ.get("SPECDECK_VULKAN_TESTS") == "1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vulkan: needs llama.cpp built with Vulkan (run packaging/vulkan_tests)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    skip = pytest.mark.skip(reason="Vulkan tests: run packaging/vulkan_tests (SPECDECK_VULKAN_TESTS=1)")
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.vulkan)
            if not ENABLED:
                item.add_marker(skip)


@dataclass
class LlamaLog:
    """Every line llama.cpp logs, debug lines included, while installed."""

    lines: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def buffers(self, kind: str) -> dict[str, float]:
        """MiB per buffer name from lines like 'Vulkan0 model buffer size =     1.23 MiB' (kind: model, KV)."""
        found: dict[str, float] = {}
        for name, mib in re.findall(rf"(\S+) {kind} buffer size =\s+([0-9.]+) MiB", self.text):
            found[name] = found.get(name, 0.0) + float(mib)
        return found

    def layer_devices(self) -> dict[int, str]:
        """Which device llama.cpp assigned each repeating layer to ('layer   3 assigned to device Vulkan0')."""
        return {int(i): dev for i, dev in re.findall(r"layer\s+(\d+) assigned to device (\S+?),", self.text)}


@pytest.fixture
def llama_log() -> Iterator[LlamaLog]:
    import llama_cpp as lc

    from app.engine.llama import init_backend

    init_backend(None)
    log = LlamaLog()

    @lc.llama_log_callback  # type: ignore[untyped-decorator]
    def sink(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        log.lines.append(text.decode("utf-8", errors="replace"))

    lc.llama_log_set(sink, ctypes.c_void_p(0))
    try:
        yield log
    finally:
        init_backend(None)  # back to SpecDeck's own callback before `sink` is freed
