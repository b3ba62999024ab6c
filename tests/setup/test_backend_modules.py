"""Builds with loadable backends (GGML_BACKEND_DL): which modules a process mapped, and its CPU variant."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.ceiling.backend import probe_backend
from app.ceiling.backend_modules import (
    cpu_variant,
    describe_modules,
    load_backend_modules,
    loaded_modules,
    module_files,
    unused_modules,
)

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


def test_the_amx_variant_is_left_out_and_said_so(tmp_path: Path) -> None:
    """ggml's AMX kernels trap on a CPU that lists AMX in a virtual machine: the sapphirerapids variant is never
    loaded, and doctor's line names it."""
    names = ["libggml-base.so", "libggml-base.so.0", "libggml.so.0", "libggml-cpu-haswell.so",
             "libggml-cpu-zen4.so", "libggml-cpu-sapphirerapids.so", "libggml-vulkan.so", "libllama.so"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    assert {k: [p.name for p in v] for k, v in module_files(tmp_path).items()} == {
        "cpu": ["libggml-cpu-haswell.so", "libggml-cpu-sapphirerapids.so", "libggml-cpu-zen4.so"],
        "vulkan": ["libggml-vulkan.so"]}
    assert unused_modules(tmp_path) == ("libggml-cpu-sapphirerapids.so",)
    (tmp_path / "libggml-cpu-sapphirerapids.so").unlink()
    assert unused_modules(tmp_path) == ()
    assert describe_modules(("libggml-cpu-zen4.so",), ("libggml-cpu-sapphirerapids.so",)) == (
        "CPU variant zen4; backend modules loaded: libggml-cpu-zen4.so; AMX variant left out: "
        "libggml-cpu-sapphirerapids.so")


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


def test_the_library_libllama_links_is_chosen_over_the_wheels_copies(tmp_path: Path) -> None:
    from app.ceiling.backend_modules import linked_library

    for name in ("libggml.so", "libggml.so.0", "libggml.so.0.25.3", "libggml-base.so", "libggml-base.so.0"):
        (tmp_path / name).write_bytes(b"")
    assert linked_library(tmp_path, "ggml") == tmp_path / "libggml.so.0"
    assert linked_library(tmp_path, "ggml-base") == tmp_path / "libggml-base.so.0"
    assert linked_library(tmp_path, "llama") is None
    (tmp_path / "ggml.dll").write_bytes(b"")
    mac = tmp_path / "mac"
    mac.mkdir()
    for name in ("libggml.dylib", "libggml.0.dylib"):
        (mac / name).write_bytes(b"")
    assert linked_library(mac, "ggml") == mac / "libggml.0.dylib"


@pytest.mark.process
def test_asking_llama_cpp_for_its_devices_loads_no_second_copy_of_ggml() -> None:
    """Two copies of libggml in one process have two backend registries: backends loaded through the wrong
    one would be invisible to llama.cpp. A fresh process maps each ggml library once."""
    code = ("from app.ceiling.backend import probe_backend\n"
            "info = probe_backend()\n"
            "assert info.devices\n"
            "print('\\n'.join(line.rsplit('/', 1)[-1] for line in open('/proc/self/maps') if 'llama_cpp' in line))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    mapped = set(out.stdout.split())
    for base in ("libggml", "libggml-base"):
        copies = {name for name in mapped if name == f"{base}.so" or name.startswith(f"{base}.so.")}
        assert len(copies) == 1, mapped
