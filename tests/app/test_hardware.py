"""The hardware probe: NVML (faked, and absent as on this machine), the table of known cards, the CPU
probe and its cache, and what llama.cpp's build reports about itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from app.ceiling.backend import (
    BackendDevice,
    BackendInfo,
    cpu_features_from_system_info,
    parse_system_info,
    probe_backend,
    probe_backend_isolated,
)
from app.ceiling.child import SIGILL_MESSAGE, describe_exit
from app.ceiling.cpu import PROBE_REPEATS, SINGLE_THREAD_ENV, probe_cpu
from app.ceiling.gpus import lookup_gpu, nvml_bandwidth, probe_nvidia
from app.ceiling.hardware import probe_hardware, roofline_devices

GB = 1e9

# (NVML name, memory bus width in bits, max memory clock in MHz, spec-sheet bandwidth in GB/s)
RECORDED = [
    ("NVIDIA GeForce RTX 4090", 384, 10501, 1008),
    ("NVIDIA H200", 6144, 3201, 4917),
    ("NVIDIA GeForce RTX 3090", 384, 9751, 936),
    ("NVIDIA H100 80GB HBM3", 5120, 2619, 3352),
    ("NVIDIA A100-SXM4-80GB", 5120, 1593, 2039),
    ("Tesla T4", 256, 5001, 320),
    ("NVIDIA GeForce RTX 3060", 192, 7501, 360),
]


@pytest.mark.parametrize(("name", "bus", "clock", "gbps"), RECORDED)
def test_nvml_bandwidth_formula(name: str, bus: int, clock: int, gbps: float) -> None:
    assert nvml_bandwidth(bus, clock) / GB == pytest.approx(gbps, rel=0.001)


@pytest.mark.parametrize(
    ("name", "gbps"),
    [
        ("AMD Radeon RX 7900 XTX", 960),
        ("AMD Radeon RX 7900 XT", 800),
        ("NVIDIA GeForce RTX 3090", 936),
        ("NVIDIA GeForce RTX 3090 Ti", 1008),
        ("NVIDIA GeForce RTX 4090", 1008),
        ("NVIDIA GeForce RTX 4090 Laptop GPU", 576),
        ("Apple M2 Ultra", 800),
        ("Apple M2", 100),
        ("Apple M3 Max", 400),
        ("Apple M4 Pro", 273),
        ("Apple M1", 68),
        ("NVIDIA H100 80GB HBM3", 3350),
        ("NVIDIA H100 PCIe", 2000),
        ("NVIDIA H200", 4800),
        ("NVIDIA A100-SXM4-80GB", 2039),
        ("Intel(R) Arc(TM) A770 Graphics", 560),
        ("AMD Instinct MI300X", 5300),
    ],
)
def test_known_cards(name: str, gbps: float) -> None:
    known = lookup_gpu(name)
    assert known is not None
    assert known.bandwidth / GB == gbps


def test_unknown_card() -> None:
    assert lookup_gpu("Matrox Millennium G200") is None
    assert lookup_gpu("AMD EPYC 9654") is None  # "m2"-like keys match whole words only


# --- NVML, faked --------------------------------------------------------------------------------


class NVMLError(Exception):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class FakeNVML:
    """pynvml's calls, answering from recorded values."""

    NVMLError = NVMLError
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVML_CLOCK_MEM = 2

    def __init__(self, cards: list[dict[str, Any]], init_error: Exception | None = None) -> None:
        self.cards = cards
        self.init_error = init_error
        self.shut = False

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return "570.86.15"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> dict[str, Any]:
        return self.cards[i]

    def nvmlDeviceGetName(self, h: dict[str, Any]) -> bytes:
        return str(h["name"]).encode()  # older pynvml returns bytes

    def nvmlDeviceGetMemoryInfo(self, h: dict[str, Any]) -> SimpleNamespace:
        return SimpleNamespace(total=h["total"], used=h["used"], free=h["total"] - h["used"])

    def nvmlDeviceGetMemoryBusWidth(self, h: dict[str, Any]) -> int:
        if h["bus"] is None:
            raise NVMLError_NotSupported()
        return int(h["bus"])

    def nvmlDeviceGetMaxClockInfo(self, h: dict[str, Any], which: int) -> int:
        assert which == self.NVML_CLOCK_MEM
        return int(h["clock"])

    def nvmlDeviceGetComputeRunningProcesses(self, h: dict[str, Any]) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in h["procs"]]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: dict[str, Any]) -> list[SimpleNamespace]:
        raise NVMLError_NotSupported()


def card(
    name: str, bus: int | None, clock: int, total_gb: int, used_gb: float, procs: list[Any]
) -> dict[str, Any]:
    return {"name": name, "bus": bus, "clock": clock, "total": int(total_gb * 2**30),
            "used": int(used_gb * 2**30), "procs": procs}


def test_probe_reads_every_gpu() -> None:
    me = os.getpid()
    fake = FakeNVML([
        card("NVIDIA GeForce RTX 4090", 384, 10501, 24, 3.5, [(me, 3 * 2**30), (1, 2**29)]),
        card("NVIDIA H200", 6144, 3201, 141, 0, []),
    ])
    probe = probe_nvidia(fake)
    assert probe.status == "ok"
    assert probe.driver_version == "570.86.15"
    a, b = probe.gpus
    assert a.name == "NVIDIA GeForce RTX 4090"
    assert a.vendor == "nvidia"
    assert a.bandwidth == pytest.approx(1.008e12, rel=1e-3)
    assert a.bandwidth_source == "nvml"
    assert a.memory_total == 24 * 2**30
    assert a.memory_free == int(20.5 * 2**30)
    assert a.process_memory == 3 * 2**30  # only this process (and its children), not pid 1
    assert a.bus_width_bits == 384
    assert a.max_memory_clock_mhz == 10501
    assert b.bandwidth == pytest.approx(4.917e12, rel=1e-3)
    assert b.peak_flops is not None  # from the table
    assert fake.shut


def test_probe_falls_back_to_the_table_when_nvml_cannot_say() -> None:
    probe = probe_nvidia(FakeNVML([card("NVIDIA GeForce RTX 3090", None, 9751, 24, 1, [])]))
    (g,) = probe.gpus
    assert g.bandwidth_source == "table"
    assert g.bandwidth == 936 * GB
    assert g.bus_width_bits is None


def test_user_override_wins() -> None:
    probe = probe_nvidia(FakeNVML([card("NVIDIA GeForce RTX 4090", 384, 10501, 24, 1, [])]),
                         bandwidth_override=900 * GB)
    assert probe.gpus[0].bandwidth == 900 * GB
    assert probe.gpus[0].bandwidth_source == "override"


def test_no_nvml_library_is_a_normal_answer() -> None:
    fake = FakeNVML([], init_error=NVMLError_LibraryNotFound("NVML Shared Library Not Found"))
    probe = probe_nvidia(fake)
    assert probe.gpus == ()
    assert probe.status == "no NVIDIA driver (NVML library not found)"


def test_no_gpu_is_a_normal_answer() -> None:
    probe = probe_nvidia(FakeNVML([]))
    assert probe.gpus == ()
    assert probe.status == "no NVIDIA GPU"


def test_pynvml_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    probe = probe_nvidia()
    assert probe.gpus == ()
    assert probe.status == "nvidia-ml-py is not installed"


def test_real_nvml_on_this_machine() -> None:
    probe = probe_nvidia()
    if probe.status == "ok":
        assert all(g.bandwidth and g.bandwidth > 100 * GB for g in probe.gpus)
    else:  # this machine has no GPU: NVML's library is missing, or it finds no device
        assert probe.gpus == ()
        assert probe.status


# --- merging in llama.cpp's devices -------------------------------------------------------------


@pytest.fixture(scope="module")
def probe_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One measured CPU probe shared by the tests that are about something else."""
    path = tmp_path_factory.mktemp("probe") / "probe.json"
    probe_cpu(cache_path=path)
    return path


def backend_with(*devices: BackendDevice, offload: bool = True, name: str = "vulkan") -> BackendInfo:
    cpu = BackendDevice("CPU", "AMD Ryzen 9 7950X", "cpu", "CPU", 60 * 2**30, 64 * 2**30)
    return BackendInfo(available=True, backend=name, gpu_offload=offload, devices=(cpu, *devices))


def test_a_gpu_only_the_backend_sees_gets_its_bandwidth_from_the_table(probe_cache: Path) -> None:
    amd = BackendDevice("Vulkan0", "AMD Radeon RX 7900 XTX", "gpu", "Vulkan", 20 * 2**30, 24 * 2**30)
    report = probe_hardware(backend=backend_with(amd), nvml=FakeNVML([]), cache_path=probe_cache)
    (g,) = report.gpus
    assert g.vendor == "amd"
    assert g.bandwidth == 960 * GB
    assert g.bandwidth_source == "table"
    assert g.memory_free == 20 * 2**30
    assert g.backend_device == "Vulkan0"
    devices = roofline_devices(report)
    assert [d.kind for d in devices] == ["cpu", "gpu"]
    assert devices[1].bandwidth == 960 * GB


def test_an_nvidia_gpu_seen_by_both_is_listed_once(probe_cache: Path) -> None:
    cuda = BackendDevice("CUDA0", "NVIDIA GeForce RTX 4090", "gpu", "CUDA", 20 * 2**30, 24 * 2**30)
    fake = FakeNVML([card("NVIDIA GeForce RTX 4090", 384, 10501, 24, 1, [])])
    report = probe_hardware(backend=backend_with(cuda, name="cuda"), nvml=fake, cache_path=probe_cache)
    (g,) = report.gpus
    assert g.source == "nvml"
    assert g.backend_device == "CUDA0"
    assert len(roofline_devices(report)) == 2


def test_a_cpu_only_build_does_not_use_the_gpu(probe_cache: Path) -> None:
    fake = FakeNVML([card("NVIDIA GeForce RTX 4090", 384, 10501, 24, 1, [])])
    report = probe_hardware(backend=backend_with(offload=False, name="cpu"), nvml=fake,
                            cache_path=probe_cache)
    assert [d.kind for d in roofline_devices(report)] == ["cpu"]
    assert any("GGML_CUDA" in note for note in report.notes)


def test_unknown_gpu_asks_for_an_override(probe_cache: Path) -> None:
    odd = BackendDevice("Vulkan0", "Moore Threads MTT S80", "gpu", "Vulkan", 8 * 2**30, 16 * 2**30)
    report = probe_hardware(backend=backend_with(odd), nvml=FakeNVML([]), cache_path=probe_cache)
    assert report.gpus[0].bandwidth is None
    assert any("not known" in n for n in report.notes)
    assert [d.kind for d in roofline_devices(report)] == ["cpu"]
    report = probe_hardware(backend=backend_with(odd), nvml=FakeNVML([]), cache_path=probe_cache,
                            gpu_bandwidth_override=448 * GB)
    assert roofline_devices(report)[1].bandwidth == 448 * GB


# --- the CPU ------------------------------------------------------------------------------------


@pytest.mark.process
def test_cpu_probe_measures_and_caches(tmp_path: Path) -> None:
    path = tmp_path / "cache" / "probe.json"
    first = probe_cpu(cache_path=path)
    assert not first.cached
    assert first.physical_cores >= 1
    assert first.ram_total > 0
    assert first.bandwidth > 1 * GB  # any machine that runs an LLM reads faster than this
    assert first.peak_flops > 1e9
    assert 0 < first.probe_seconds < 5 * PROBE_REPEATS  # the best of PROBE_REPEATS probes
    saved = json.loads(path.read_text())
    assert saved["bandwidth"] == first.bandwidth
    assert saved["runs"] == 1
    assert not list(path.parent.glob("*.tmp"))  # written atomically


@pytest.mark.process
def test_a_quiet_probe_is_reused(tmp_path: Path) -> None:
    path = tmp_path / "probe.json"
    probe_cpu(cache_path=path)
    saved = json.loads(path.read_text())
    path.write_text(json.dumps({**saved, "bandwidth": 123e9, "peak_flops": 456e9, "quiet": True}))
    again = probe_cpu(cache_path=path)
    assert again.cached
    assert again.probe_seconds == 0
    assert (again.bandwidth, again.peak_flops) == (123e9, 456e9)


@pytest.mark.process
def test_a_busy_probe_is_taken_again_and_the_best_kept(tmp_path: Path) -> None:
    path = tmp_path / "probe.json"
    probe_cpu(cache_path=path)
    saved = json.loads(path.read_text())
    path.write_text(json.dumps({**saved, "bandwidth": 1e15, "peak_flops": 1.0, "quiet": False}))
    again = probe_cpu(cache_path=path)
    assert not again.cached  # measured again: a busy machine reads low
    assert again.bandwidth == 1e15  # load only lowers a measurement, so the best one stands
    assert again.peak_flops > 1e9
    assert json.loads(path.read_text())["runs"] == saved["runs"] + 1


@pytest.mark.process
def test_refresh_starts_over(tmp_path: Path) -> None:
    path = tmp_path / "probe.json"
    probe_cpu(cache_path=path)
    saved = json.loads(path.read_text())
    path.write_text(json.dumps({**saved, "bandwidth": 1e15, "quiet": True}))
    assert probe_cpu(cache_path=path, refresh=True).bandwidth < 1e15


@pytest.mark.process
def test_cpu_probe_survives_a_damaged_cache(tmp_path: Path) -> None:
    path = tmp_path / "probe.json"
    path.write_text("{not json")
    info = probe_cpu(cache_path=path)
    assert not info.cached
    assert info.bandwidth > 0
    assert json.loads(path.read_text())["peak_flops"] == info.peak_flops


def test_cpu_bandwidth_override(probe_cache: Path) -> None:
    info = probe_cpu(cache_path=probe_cache, bandwidth_override=12.5 * GB)
    assert info.bandwidth == 12.5 * GB
    assert info.bandwidth_source == "override"


# --- llama.cpp ----------------------------------------------------------------------------------

SYSTEM_INFO = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | AVX512 = 0 | LLAMAFILE = 1 | "
               "OPENMP = 1 | REPACK = 1 | CUDA : ARCHS = 890 | USE_GRAPHS = 1 |")


def test_system_info_is_parsed_per_backend() -> None:
    sections = parse_system_info(SYSTEM_INFO)
    assert sections["CPU"]["AVX2"] == "1"
    assert sections["CPU"]["AVX512"] == "0"
    assert sections["CUDA"]["ARCHS"] == "890"
    assert cpu_features_from_system_info(SYSTEM_INFO) == ("SSE3", "SSSE3", "AVX", "AVX2", "LLAMAFILE",
                                                          "OPENMP", "REPACK")


def test_sigill_gets_the_rebuild_advice() -> None:
    assert describe_exit(-signal.SIGILL) == SIGILL_MESSAGE
    assert "SPECDECK_CMAKE_ARGS" in SIGILL_MESSAGE
    assert describe_exit(0xC000001D) == SIGILL_MESSAGE  # Windows' STATUS_ILLEGAL_INSTRUCTION
    assert describe_exit(-signal.SIGABRT) == "crashed with SIGABRT"
    assert describe_exit(3) == "exited with status 3"


def test_backend_info_round_trips_through_json() -> None:
    info = backend_with(BackendDevice("Metal", "Apple M2 Ultra", "gpu", "Metal", None, None), name="metal")
    again = BackendInfo.from_dict(json.loads(json.dumps(info.to_dict())))
    assert again == info


def test_this_build_describes_itself() -> None:
    info = probe_backend()
    assert info.available
    assert info.error is None
    assert info.llama_cpp_python
    assert info.llama_cpp
    assert info.system_info.startswith("CPU")
    assert any(d.type == "cpu" for d in info.devices)
    assert info.backend in ("cpu", "cuda", "vulkan", "metal")
    # A GPU backend with a GPU offloads; the CPU runs everything else, also a GPU build on a machine without
    # its GPU, which then says why.
    assert (info.backend == "cpu") == (not info.gpu_offload or not info.gpu_devices)
    assert (info.gpu_fallback is not None) <= (info.backend == "cpu")
    assert info.cpu_features  # every build lists the CPU features it was compiled for
    isolated = probe_backend_isolated()
    assert isolated == info  # the child process sees the same build


# --- the saved bandwidth override is applied ------------------------------------------------------------


@pytest.mark.process
def test_the_saved_bandwidth_override_sets_the_gpu_ceiling(specdeck_home: Path) -> None:
    from app.ceiling.builder import probe_machine, saved_gpu_bandwidth
    from app.storage.settings import AppSettings, save_settings

    fake = FakeNVML([card("NVIDIA GeForce RTX 4090", 384, 10501, 24, 1, [])])
    assert saved_gpu_bandwidth() is None
    _, devices = probe_machine(nvml=fake)
    assert [d.bandwidth for d in devices if d.kind == "gpu"] == [pytest.approx(1.008e12, rel=1e-3)]

    save_settings(AppSettings(bandwidth_override_gbps=850.0))
    assert saved_gpu_bandwidth() == 850 * GB
    report, devices = probe_machine(nvml=fake)
    assert [d.bandwidth for d in devices if d.kind == "gpu"] == [850 * GB]
    assert report.gpus[0].bandwidth_source == "override"
    # An explicit figure (doctor --gpu-bandwidth) wins over the saved one.
    _, devices = probe_machine(nvml=fake, gpu_bandwidth_override=700 * GB)
    assert [d.bandwidth for d in devices if d.kind == "gpu"] == [700 * GB]


def test_an_unknown_card_names_the_setting_to_set() -> None:
    backend = BackendInfo(available=True, backend="vulkan", gpu_offload=True, devices=(
        BackendDevice("Vulkan0", "Matrox Millennium G200", "gpu", "Vulkan", 2**30, 2**31),))
    report = probe_hardware(backend=backend, nvml=FakeNVML([]))
    assert any("bandwidth_override_gbps" in note and "settings.json" in note for note in report.notes)


# --- the probes' own entry point --------------------------------------------------------------------------


@pytest.mark.process
def test_the_frozen_app_runs_the_probe_through_its_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.ceiling import child

    monkeypatch.setattr(sys, "frozen", True, raising=False)
    cmd = child.probe_command("cpu", "--threads", "1")
    assert cmd == [sys.executable, child.PROBE_FLAG, "cpu", "--threads", "1"]
    monkeypatch.delattr(sys, "frozen")
    # What the frozen executable runs: packaging/entry.py, given that flag, answers as the probe module does.
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(root / "packaging" / "entry.py"), *cmd[1:], "--bytes",
                           str(32 << 20)], capture_output=True, text=True, timeout=120,
                          env={**child.specdeck_env(), **SINGLE_THREAD_ENV})
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["bandwidth_single"] > 0
    assert answer["peak_flops_core"] > 0
    assert "PySide6" not in done.stderr


def test_a_probe_child_that_fails_is_one_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.ceiling import child

    with pytest.raises(child.ProbeFailed) as caught:
        child.run_probe("no-such-probe", timeout_s=60, what="the test probe")
    assert str(caught.value).startswith("the test probe exited with status 2 (")  # argparse's last line
    if sys.platform == "win32":
        return
    trap = f"import os, signal; os.kill(os.getpid(), {int(signal.SIGILL)})"
    monkeypatch.setattr(child, "probe_command", lambda *args: [sys.executable, "-c", trap])
    info = probe_backend_isolated()
    assert not info.available
    assert info.error == SIGILL_MESSAGE
    silent = "print('no json here')"
    monkeypatch.setattr(child, "probe_command", lambda *args: [sys.executable, "-c", silent])
    with pytest.raises(child.ProbeFailed, match="gave no readable answer"):
        child.run_probe("cpu", timeout_s=60, what="the CPU probe")


@pytest.mark.process
def test_the_first_probe_is_the_best_of_several(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.ceiling import cpu

    taken: list[tuple[float, float]] = []
    real = cpu.measure_cpu

    def counted(*args: object, **kwargs: object) -> tuple[float, float]:
        result = real(*args, **kwargs)  # type: ignore[arg-type]
        taken.append(result)
        return result

    monkeypatch.setattr(cpu, "measure_cpu", counted)
    info = probe_cpu(cache_path=tmp_path / "probe.json")
    assert len(taken) == PROBE_REPEATS
    assert info.bandwidth == max(b for b, _ in taken)
    assert info.peak_flops == max(p for _, p in taken)


@pytest.mark.process
def test_a_busy_probe_is_kept_where_it_must_not_move(tmp_path: Path) -> None:
    path = tmp_path / "probe.json"
    probe_cpu(cache_path=path)
    saved = json.loads(path.read_text())
    path.write_text(json.dumps({**saved, "bandwidth": 1e9, "quiet": False}))
    again = probe_cpu(cache_path=path, retake_busy=False)
    assert again.cached
    assert again.bandwidth == 1e9
