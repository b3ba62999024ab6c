"""RPC servers and the device choice without the RPC build: the server list as users write it, the probe's
sentences for a server that refuses or does not answer, the abort a dead server causes turned into one
sentence, llama.cpp's device order with RPC servers, the network's part of the roofline, the fit's flash
attention, and the worker's device list. The split itself runs in tests/rpc (packaging/rpc_tests)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from app.ceiling.backend import BackendDevice
from app.ceiling.device_fit import fit_devices
from app.ceiling.memory import offload_devices, placed_bytes, placement
from app.ceiling.roofline import CeilingModel, Device, ModelShape
from app.ceiling.rpc import (
    ServerProbe,
    add_rpc_servers,
    network_seconds_per_pass,
    probe_server,
    rpc_available,
    rpc_failure,
)
from app.engine.client import EngineClient
from app.errors import EngineLoadError, SettingsError
from app.events import Devices
from app.library.gguf_reader import read_gguf_info
from app.params import LoadSettings, fit_flash_attention, parse_rpc_servers
from app.storage.settings import AppSettings, load_settings, save_settings, with_settings

GIB = 1 << 30
CPU = BackendDevice("CPU", "AMD EPYC", "cpu", "CPU", 60 * GIB, 64 * GIB)
IGPU = BackendDevice("Vulkan0", "AMD Radeon 780M", "igpu", "Vulkan", 8 * GIB, 8 * GIB)
GPU = BackendDevice("Vulkan1", "AMD Radeon RX 7900 XTX", "gpu", "Vulkan", 20 * GIB, 24 * GIB)
RPC0 = BackendDevice("RPC0", "10.0.0.2:50052", "gpu", "RPC", 6 * GIB, 8 * GIB)
RPC1 = BackendDevice("RPC1", "10.0.0.3:50052", "gpu", "RPC", 2 * GIB, 8 * GIB)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_servers_are_written_host_port_and_normalised() -> None:
    assert parse_rpc_servers("") == ()
    assert parse_rpc_servers(" 10.0.0.2:50052 , gpu-box.local:1,") == ("10.0.0.2:50052", "gpu-box.local:1")
    assert parse_rpc_servers(["10.0.0.2:08080"]) == ("10.0.0.2:8080",)


@pytest.mark.parametrize("text", ["10.0.0.2", "10.0.0.2:", ":50052", "host:0", "host:70000", "ho st:1",
                                  "host:port", "a;rm -rf /:1", "[::1]:50052",
                                  "host:\u0663"])
def test_a_server_written_wrong_is_named_in_one_sentence(text: str) -> None:
    with pytest.raises(SettingsError) as err:
        parse_rpc_servers(text)
    message = str(err.value)
    assert message.startswith("An RPC server is written host:port")
    assert message.count(". ") == 0


def test_a_server_listed_twice_or_too_many_are_refused() -> None:
    with pytest.raises(SettingsError, match="listed twice"):
        parse_rpc_servers("a:1,a:1")
    with pytest.raises(SettingsError, match="at most 16"):
        parse_rpc_servers(",".join(f"h{i}:1" for i in range(17)))


def test_load_settings_take_servers_but_not_with_one_gpu() -> None:
    LoadSettings("m.gguf", rpc_servers=("a:1", "b:2")).validate()
    with pytest.raises(SettingsError, match="choose all GPUs"):
        LoadSettings("m.gguf", rpc_servers=("a:1",), main_gpu=0).validate()
    with pytest.raises(SettingsError):
        LoadSettings("m.gguf", rpc_servers=("a:1", "a:1")).validate()


def test_the_gpu_choice_and_the_servers_are_saved_and_restored(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    save_settings(with_settings(AppSettings(), {"load.main_gpu": 1}), path)
    assert load_settings(path)[0].load.main_gpu == 1
    servers = ("10.0.0.2:50052", "10.0.0.3:50052")
    save_settings(with_settings(AppSettings(), {"load.rpc_servers": servers}), path)
    restored, warning = load_settings(path)
    assert warning is None
    assert restored.load.rpc_servers == servers
    assert restored.load.main_gpu is None
    loaded = with_settings(restored, {"load.target_path": "m.gguf"}).to_load_settings()
    assert loaded is not None
    assert loaded.rpc_servers == servers


def test_a_bad_saved_server_list_falls_back_alone(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text('{"schema_version": 2, "load": {"rpc_servers": "not a list", "main_gpu": 2, "n_ctx": 2048}}')
    settings, warning = load_settings(path)
    assert settings.load.rpc_servers == ()
    assert settings.load.main_gpu == 2
    assert settings.load.n_ctx == 2048
    assert warning is not None
    assert "An RPC server is written host:port" in warning


def test_nothing_listening_is_one_sentence() -> None:
    port = _free_port()
    with pytest.raises(EngineLoadError) as err:
        probe_server(f"127.0.0.1:{port}")
    assert str(err.value) == f"Nothing listens at 127.0.0.1:{port}: start rpc-server there, or correct the address."


def test_a_server_that_never_answers_times_out_in_one_sentence() -> None:
    """An rpc-server serving another client accepts the connection and says nothing: the probe gives up."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        endpoint = f"127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(EngineLoadError) as err:
            probe_server(endpoint, timeout_s=0.3)
    assert f"The RPC server {endpoint} did not answer within 0.3 s" in str(err.value)


def test_a_dead_server_abort_becomes_one_sentence() -> None:
    tail = ("llama_decode: ...", "/ggml-rpc.cpp:566: Remote RPC server crashed or returned malformed response")
    message = rpc_failure(tail, "generate")
    assert message is not None
    assert message.startswith("An RPC server stopped answering while answering")
    assert message.count(". ") == 0
    assert message.endswith("restart the engine.")
    assert rpc_failure(("GGML_ASSERT(n_tokens > 0) failed",), "generate") is None


def test_llama_cpp_puts_rpc_servers_first_and_one_gpu_means_a_local_one() -> None:
    devices = [CPU, IGPU, GPU, RPC0, RPC1]
    assert offload_devices(devices) == (RPC0, RPC1, GPU)
    assert offload_devices(devices, ["10.0.0.3:50052"]) == (RPC1, GPU)  # a server registered before, not asked
    assert offload_devices(devices, ()) == (GPU,)
    assert offload_devices([CPU, IGPU, RPC0]) == (RPC0, IGPU)
    assert placement((RPC0, RPC1)) == ("layers split by free memory over RPC0 (10.0.0.2:50052), "
                                       "RPC1 (10.0.0.3:50052)")
    assert placement((GPU,), one_gpu=True) == "layers on Vulkan1 (AMD Radeon RX 7900 XTX) alone (one GPU chosen)"
    assert placement(()) == "layers on the CPU"


def test_the_fit_counts_memory_per_server(tiny_target: Path) -> None:
    info = read_gguf_info(tiny_target)
    devices = fit_devices([CPU, RPC0, RPC1], rpc_servers=("10.0.0.2:50052", "10.0.0.3:50052"))
    assert [d.key for d in devices] == ["cpu", "RPC0", "RPC1"]
    assert [d.free_bytes for d in devices[1:]] == [6 * GIB, 2 * GIB]
    from app.ceiling.builder import pair_fit

    fit = pair_fit(info, None, 256, devices=devices)
    names = {d.name for d in fit.devices}
    assert {"RPC0 (10.0.0.2:50052)", "RPC1 (10.0.0.3:50052)"} <= names
    # Layers split by free memory (llama.cpp's default split): three times as many on RPC0.
    by = {d.device: d.weights for d in fit.devices}
    assert by["RPC0"] > by["RPC1"] > 0
    one = fit_devices([CPU, GPU, RPC0], main_gpu=0, rpc_servers=())
    assert [d.key for d in one] == ["cpu", "Vulkan1"]


def test_the_dashboard_places_weights_on_the_servers_used(tiny_target: Path) -> None:
    from app.ceiling.memory import GpuMemory

    rows = [GpuMemory(0, "10.0.0.2:50052", 8 * GIB, 2 * GIB, device="RPC0", source="llama.cpp"),
            GpuMemory(1, "10.0.0.3:50052", 8 * GIB, 6 * GIB, device="RPC1", source="llama.cpp"),
            GpuMemory(2, "AMD Radeon", 24 * GIB, 4 * GIB, device="Vulkan1", source="llama.cpp")]
    placed = placed_bytes(str(tiny_target), None, 256, 1 << 20, True, rows, used=["RPC0", "RPC1"])
    assert placed["RPC0"] > 0
    assert placed["RPC1"] > 0
    assert "Vulkan1" not in placed


def test_the_ceiling_adds_the_network_to_every_pass(tiny_target: Path) -> None:
    shape = ModelShape.from_gguf(read_gguf_info(tiny_target))
    devices = (Device("cpu", "CPU", "cpu", 20e9),)
    local = CeilingModel(shape, devices)
    remote = CeilingModel(shape, devices, drafter=shape, network_seconds=0.002)
    assert remote.plain(100).seconds == pytest.approx(local.plain(100).seconds + 0.002)
    # A verify pass after three drafter steps crosses the network four times (each step is a decode).
    assert remote.speculative(100, 3).network_seconds == pytest.approx(0.008)
    assert remote.speculative(100, 3, with_drafter=False).network_seconds == pytest.approx(0.002)
    probes = [ServerProbe("a:1", 1, 0.001), ServerProbe("b:1", 1, 0.0015)]
    assert network_seconds_per_pass(probes) == pytest.approx(0.0025)


def test_the_fit_uses_the_flash_attention_the_load_will_use() -> None:
    """On Vulkan "auto" runs without flash attention (its crash after a rollback): so does the fit."""
    assert fit_flash_attention("auto", "cpu", -1) is True
    assert fit_flash_attention("auto", "vulkan", -1) is False
    assert fit_flash_attention("auto", "vulkan", 0) is True
    assert fit_flash_attention("auto", "vulkan", -1, "q8_0") is True
    assert fit_flash_attention("on", "vulkan", -1) is True
    assert fit_flash_attention("off", "cpu", -1) is False


def test_the_worker_lists_its_devices_and_names_a_server_it_cannot_use() -> None:
    port = _free_port()
    client = EngineClient()
    client.start()
    try:
        client.list_devices()
        plain = _devices(client)
        assert plain.error is None
        assert any(d.type == "cpu" and d.memory_total for d in plain.devices)
        client.list_devices((f"127.0.0.1:{port}",))
        refused = _devices(client)
        assert refused.error == f"Nothing listens at 127.0.0.1:{port}: start rpc-server there, or correct the address."
        assert [d.name for d in refused.devices] == [d.name for d in plain.devices]  # the local ones still listed
        assert refused.rpc_available == rpc_available()
        assert client.alive
    finally:
        client.close()


def _devices(client: EngineClient) -> Devices:
    events = list(client.events(timeout=120))
    assert isinstance(events[-1], Devices), events[-1]
    return events[-1]


def test_without_the_rpc_build_servers_are_refused_in_one_sentence() -> None:
    if rpc_available():
        pytest.skip("this llama.cpp has the RPC backend: tests/rpc covers it (packaging/rpc_tests)")
    with pytest.raises(EngineLoadError) as err:
        add_rpc_servers(["127.0.0.1:1"])
    assert str(err.value).startswith("This llama.cpp was built without the RPC backend: set it up with")
