"""Builds with loadable backends (GGML_BACKEND_DL): which modules a process mapped, and its CPU variant."""

from __future__ import annotations

from app.ceiling.backend import probe_backend
from app.ceiling.backend_modules import cpu_variant, describe_modules, load_backend_modules, loaded_modules

# /proc/self/maps lines of a process running a module build on an AVX2 machine with a Vulkan driver.
MAPS_MODULE_BUILD = """\
7f2a10000000-7f2a10200000 r-xp 00000000 fd:01 131 /opt/SpecDeck/_internal/llama_cpp/lib/libggml-base.so
7f2a10400000-7f2a10500000 r-xp 00000000 fd:01 132 /opt/SpecDeck/_internal/llama_cpp/lib/libggml.so
7f2a10600000-7f2a10900000 r-xp 00000000 fd:01 140 /opt/SpecDeck/_internal/llama_cpp/lib/libggml-cpu-haswell.so
7f2a10900000-7f2a10a00000 r--p 00300000 fd:01 140 /opt/SpecDeck/_internal/llama_cpp/lib/libggml-cpu-haswell.so
7f2a11000000-7f2a12000000 r-xp 00000000 fd:01 150 /opt/SpecDeck/_internal/llama_cpp/lib/libggml-vulkan.so
7f2a13000000-7f2a13100000 r-xp 00000000 fd:01 160 /usr/lib/x86_64-linux-gnu/libvulkan.so.1.3.239
7f2a14000000-7f2a14001000 rw-p 00000000 00:00 0
"""


def test_the_modules_and_cpu_variant_a_process_mapped() -> None:
    modules = loaded_modules(MAPS_MODULE_BUILD)
    assert modules == ("libggml-cpu-haswell.so", "libggml-vulkan.so")
    assert cpu_variant(modules) == "haswell"
    assert describe_modules(modules) == (
        "CPU variant haswell; backend modules loaded: libggml-cpu-haswell.so, libggml-vulkan.so")
    assert describe_modules(()) is None
    assert cpu_variant(("libggml-cpu.so.0",)) is None


def test_a_build_with_linked_in_backends_is_left_alone_and_reports_no_modules() -> None:
    import llama_cpp

    before = llama_cpp.llama_print_system_info()
    modular = load_backend_modules()
    info = probe_backend()
    if modular:  # this venv holds a module build: it must have loaded a CPU variant from llama_cpp/lib
        assert any("ggml-cpu" in m for m in info.modules), info.modules
        assert info.devices
    else:
        assert info.modules == ()
        assert llama_cpp.llama_print_system_info() == before
        assert any(d.type == "cpu" for d in info.devices)
