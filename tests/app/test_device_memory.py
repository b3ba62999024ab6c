"""Memory per device, from one place for doctor and the dashboard: NVML for NVIDIA GPUs, llama.cpp's own
report (ggml_backend_dev_memory) for every other device. On this CPU build the CPU device is the ggml device
there is, and its report must come through; GPU devices come from the llvmpipe capture and `tests/vulkan`."""

from __future__ import annotations

import os
from pathlib import Path

from app.ceiling.backend import BackendDevice, probe_backend
from app.ceiling.gpus import GPUInfo
from app.ceiling.hardware import probe_hardware
from app.ceiling.memory import LoadedModels, MemoryProbe, device_memory, placed_bytes
from app.library.gguf_reader import read_gguf_info
from app.measure.doctor_report import hardware_block

GIB = 1 << 30
PHYSICAL = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
# llama.cpp's report of Mesa's llvmpipe as it lists it (ggml_backend_dev_memory: 2 GiB, 1.5 GiB free).
LLVMPIPE = BackendDevice("Vulkan0", "llvmpipe (LLVM 15.0.6, 256 bits)", "gpu", "Vulkan", 3 * GIB // 2, 2 * GIB)


def nvml_gpu(name: str, total: int, used: int, ours: int | None) -> GPUInfo:
    return GPUInfo(0, name, "nvidia", total, used, total - used, ours, 384, 10501, 1e12, "nvml", None, "550")


def test_the_cpu_device_report_comes_through_from_llama_cpp() -> None:
    devices = probe_backend().devices
    found = device_memory((), devices)
    cpu = next(m for m in found if m.device == "CPU")
    assert cpu.kind == "cpu"
    assert cpu.source == "llama.cpp"
    assert cpu.total == PHYSICAL  # ggml's CPU device: the physical pages, as sysconf counts them
    reported = next(d for d in devices if d.name == "CPU")
    if reported.memory_free == reported.memory_total:  # Linux: all of RAM "free", no use reported
        assert cpu.used is None
        assert cpu.free == cpu.total
    else:
        assert cpu.used is not None
        assert 0 <= cpu.used <= cpu.total
    assert [m.device for m in found] == [d.name for d in devices if d.memory_total]


def test_llama_cpp_devices_join_nvml_gpus_without_counting_one_twice() -> None:
    cuda = BackendDevice("CUDA0", "NVIDIA GeForce RTX 4090", "gpu", "CUDA", 20 * GIB, 24 * GIB)
    cpu = BackendDevice("CPU", "AMD EPYC", "cpu", "CPU", 64 * GIB, 64 * GIB)
    nvml = nvml_gpu("NVIDIA GeForce RTX 4090", 24 * GIB, 5 * GIB, 3 * GIB)
    found = device_memory([nvml], [cpu, cuda, LLVMPIPE])
    assert [(m.device, m.source, m.kind) for m in found] == [
        ("CUDA0", "nvml", "gpu"), ("CPU", "llama.cpp", "cpu"), ("Vulkan0", "llama.cpp", "gpu")]
    assert (found[0].total, found[0].used, found[0].ours) == (24 * GIB, 5 * GIB, 3 * GIB)  # NVML's figures
    vulkan = found[2]
    assert (vulkan.total, vulkan.used, vulkan.free) == (2 * GIB, GIB // 2, 3 * GIB // 2)
    assert vulkan.name == LLVMPIPE.description


def test_a_device_that_reports_all_its_memory_free_reports_no_use() -> None:
    """A Vulkan driver without the memory-budget extension (llvmpipe) says free = total with a model on it:
    that is no report of use, and it is never shown as 0 in use."""
    silent = BackendDevice("Vulkan0", "llvmpipe (LLVM 15.0.6, 256 bits)", "gpu", "Vulkan", 2 * GIB, 2 * GIB)
    (only,) = device_memory((), [silent])
    assert only.used is None
    assert only.free == only.total == 2 * GIB


def test_cuda_without_nvml_is_read_from_llama_cpp() -> None:
    cuda = BackendDevice("CUDA0", "NVIDIA H200", "gpu", "CUDA", 100 * GIB, 140 * GIB)
    (only,) = device_memory((), [cuda])
    assert (only.device, only.source, only.total, only.used) == ("CUDA0", "llama.cpp", 140 * GIB, 40 * GIB)


def test_doctor_and_the_dashboard_read_the_same_memory_per_device() -> None:
    backend = probe_backend()
    hw = probe_hardware(backend=backend, measure=False)
    doctor = hardware_block(hw, [])["memory"]
    probe = MemoryProbe(llama_devices=lambda: backend.devices, nvidia=lambda: ())
    probe.refresh_llama(wait=True)
    dashboard = probe.devices()
    assert [(m["device"], m["total"], m["source"]) for m in doctor] == [
        (m.device, m.total, m.source) for m in dashboard]
    assert any(m["device"] == "CPU" and m["total"] == PHYSICAL for m in doctor)


def test_the_window_asks_a_child_for_llama_cpp_devices(specdeck_home: Path) -> None:
    """The default probe never loads llama.cpp in the window's process: a child reports the devices."""
    probe = MemoryProbe(nvidia=lambda: ())
    probe.refresh_llama(wait=True)
    cpu = next(m for m in probe.devices() if m.device == "CPU")
    assert cpu.total == PHYSICAL
    assert probe.read().gpus == ()  # no GPU on a CPU build: the CPU device is not listed as one


def test_the_loaded_models_weights_and_kv_are_placed_on_their_devices(tiny_target: Path) -> None:
    info = read_gguf_info(tiny_target)
    kv = 123_456
    probe = MemoryProbe(llama_devices=lambda: probe_backend().devices, nvidia=lambda: ())
    probe.refresh_llama(wait=True)
    probe.follow(LoadedModels(str(tiny_target), None, 256, kv, gpu_offload=False))
    cpu = next(m for m in probe.devices() if m.device == "CPU")
    assert cpu.placed == info.tensor_bytes + kv
    probe.follow(None)
    assert next(m for m in probe.devices() if m.device == "CPU").placed is None


def test_a_full_offload_places_all_but_the_token_embeddings_on_the_gpu(tiny_target: Path) -> None:
    from gguf import GGUFReader

    sizes = {t.name: int(t.n_bytes) for t in GGUFReader(tiny_target).tensors}
    cpu = BackendDevice("CPU", "AMD EPYC", "cpu", "CPU", 64 * GIB, 64 * GIB)
    devices = device_memory((), [cpu, LLVMPIPE])
    placed = placed_bytes(str(tiny_target), None, 256, 1000, True, devices)
    assert placed["Vulkan0"] == sum(sizes.values()) - sizes["token_embd.weight"] + 1000  # all KV on the GPU
    assert placed["CPU"] == sizes["token_embd.weight"]


def test_a_probe_that_fails_keeps_the_last_report() -> None:
    answers: list[tuple[BackendDevice, ...] | Exception] = [(LLVMPIPE,), RuntimeError("child died")]

    def devices() -> tuple[BackendDevice, ...]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    probe = MemoryProbe(llama_devices=devices, nvidia=lambda: ())
    probe.refresh_llama(wait=True)
    probe.refresh_llama(wait=True)
    assert [m.device for m in probe.read().gpus] == ["Vulkan0"]


def test_llama_cpp_is_asked_no_more_once_it_lists_only_the_cpu() -> None:
    asked: list[int] = []

    def devices() -> tuple[BackendDevice, ...]:
        asked.append(1)
        return (BackendDevice("CPU", "AMD EPYC", "cpu", "CPU", 64 * GIB, 64 * GIB),)

    probe = MemoryProbe(llama_devices=devices, nvidia=lambda: ())
    probe.refresh_llama(wait=True)
    probe.refresh_llama(wait=True)
    assert asked == [1]


def test_llama_cpp_is_asked_only_while_a_model_is_offloaded(tiny_target: Path) -> None:
    """A CPU-only load has no device to show: no child is started for it."""
    asked: list[int] = []

    def devices() -> tuple[BackendDevice, ...]:
        asked.append(1)
        return (LLVMPIPE,)

    probe = MemoryProbe(llama_devices=devices, nvidia=lambda: ())
    probe.read()
    probe.follow(LoadedModels(str(tiny_target), None, 256, 1000, gpu_offload=False))
    probe.read()
    assert asked == []
    probe.follow(LoadedModels(str(tiny_target), None, 256, 1000, gpu_offload=True))
    probe.read()
    probe.refresh_llama(wait=True)  # joins the refresh the read started (or asks once more)
    assert asked
    (vulkan,) = probe.read().gpus
    assert vulkan.device == "Vulkan0"
    assert vulkan.placed is not None
    assert vulkan.placed > 1000


def test_a_partial_offload_places_only_the_chosen_layers_on_the_gpu(tiny_target: Path) -> None:
    """--gpu-layers auto put part of the model on the GPU: the chart shows that split, not all of it there."""
    from gguf import GGUFReader

    sizes = {t.name: int(t.n_bytes) for t in GGUFReader(tiny_target).tensors}
    cpu = BackendDevice("CPU", "AMD EPYC", "cpu", "CPU", 64 * GIB, 64 * GIB)
    devices = device_memory((), [cpu, LLVMPIPE])
    whole = placed_bytes(str(tiny_target), None, 256, 1000, True, devices)
    half = placed_bytes(str(tiny_target), None, 256, 1000, True, devices, n_gpu_layers=1)
    block = sum(n for name, n in sizes.items() if name.startswith("blk.1."))
    assert half["Vulkan0"] < whole["Vulkan0"]
    assert half["CPU"] > whole["CPU"]
    assert half["CPU"] - whole["CPU"] >= block  # one layer's weights stayed on the CPU
    assert sum(half.values()) == sum(whole.values())  # the same bytes, split otherwise
