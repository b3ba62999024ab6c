"""`specdeck doctor` takes every load option the other commands take, and works its ceiling and fit out for the
GPU layers a load of those options would get: ``--gpu-layers auto`` resolved as chat, bench and serve resolve
it (``choose_gpu_layers`` on llama.cpp's device list), not assumed to be every layer. The devices are that list
as data (free and total memory as llama.cpp reports them), the model a real GGUF (a sparse 7.7 GB file)."""

from __future__ import annotations

import argparse
import socket
import struct
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from app.ceiling.backend import BackendDevice, BackendInfo
from app.ceiling.device_fit import load_gpu_layers
from app.ceiling.rpc import RPC_PROTO_MAJOR, rpc_available
from app.cli import doctor
from app.cli.load_options import OPTIONS
from app.errors import AppError
from app.library.gguf_reader import read_gguf_info
from app.measure.doctor_report import DoctorOptions, DoctorReport, build_report
from app.params import ALL_GPU_LAYERS, AUTO_GPU_LAYERS, LoadSettings
from tests.setup.test_device_fit import gpu_check_module

GIB = 1 << 30
RAM = 60 * GIB
CPU = BackendDevice("CPU", "AMD EPYC", "cpu", "CPU", RAM, 64 * GIB)
CARD = "NVIDIA GeForce RTX 4090"  # in the known-cards table: the roofline has its bandwidth


def gpu(name: str, free_gib: float, total_gib: float = 24) -> BackendDevice:
    return BackendDevice(name, CARD, "gpu", "CUDA", int(free_gib * GIB), int(total_gib * GIB))


def cuda_build(*devices: BackendDevice) -> BackendInfo:
    return BackendInfo(available=True, backend="cuda", gpu_offload=any(d.type == "gpu" for d in devices),
                       devices=(CPU, *devices))


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """32 layers, 7.7 GB of Q8_0 weights (a sparse file: almost no disk)."""
    g = gpu_check_module()
    return Path(g.write_model(tmp_path_factory.mktemp("big") / "big-8gb.gguf", g.SHAPES["8gb"], sparse=True))


def typed_report(model: Path, backend: BackendInfo, **load: Any) -> DoctorReport:
    options = DoctorOptions(model=model, ctx=4096, load=LoadSettings(target_path="", **load))
    r, ok = build_report(options, backend=backend, ram_free=RAM)
    assert ok
    return r


def report(model: Path, backend: BackendInfo, **load: Any) -> dict[str, Any]:
    """`doctor --json`'s document for this load."""
    return typed_report(model, backend, **load).as_json()


def parts_on(r: dict[str, Any]) -> set[str]:
    return {p["device"] for p in r["ceiling"]["parts"] if p["bytes"]}


def test_auto_is_the_choice_a_load_makes(big: Path, specdeck_home: Path) -> None:
    """4 GB free on a 24 GB card: part of the model, as chat's load would put it, and the ceiling and fit
    follow that split instead of all 33 layers on the GPU."""
    backend = cuda_build(gpu("CUDA0", 4))
    typed = typed_report(big, backend)
    r = typed.as_json()
    info = read_gguf_info(big)
    load = load_gpu_layers(info, LoadSettings(str(big), n_ctx=4096), backend.devices, ram_free=RAM)
    layers = r["gpu_layers"]
    assert 0 < load.n_gpu_layers < 33
    assert (layers["asked"], layers["chosen"], layers["on_gpus"], layers["total"]) == \
        ("auto", load.n_gpu_layers, load.n_gpu_layers, 33)
    assert layers["message"] == load.note.removeprefix("GPU layers ")
    assert layers["message"].startswith(f"auto: {load.n_gpu_layers} of 33 on CUDA0 ({CARD}) with their KV cache, "
                                        "the rest on the CPU; ")
    assert f"GPU layers   {layers['message']}" in doctor.render_text(typed)
    assert parts_on(r) == {"cpu", "gpu0"}  # the split, not every layer on the GPU
    assert r["fit"]["fits"] is True
    gpu_need = next(d for d in r["fit"]["devices"] if d["device"] == "gpu0")
    assert gpu_need["need"] < 4 * GIB


def test_auto_with_room_for_all_puts_all_on_the_gpu(big: Path, specdeck_home: Path) -> None:
    r = report(big, cuda_build(gpu("CUDA0", 20)))
    assert (r["gpu_layers"]["chosen"], r["gpu_layers"]["on_gpus"]) == (ALL_GPU_LAYERS, 33)
    assert r["gpu_layers"]["message"].startswith(f"auto: 33 of 33 on CUDA0 ({CARD}) with their KV cache; ")


def test_no_gpu_means_all_on_the_cpu(big: Path, specdeck_home: Path) -> None:
    r = report(big, cuda_build())
    assert (r["gpu_layers"]["chosen"], r["gpu_layers"]["on_gpus"]) == (0, 0)
    assert r["gpu_layers"]["message"] == "auto: all on the CPU: no GPU"
    assert parts_on(r) == {"cpu"}
    assert [d["device"] for d in r["fit"]["devices"]] == ["cpu"]


def test_an_explicit_count_that_does_not_fit_is_said_not_raised(big: Path, specdeck_home: Path) -> None:
    r = report(big, cuda_build(gpu("CUDA0", 4)), n_gpu_layers=ALL_GPU_LAYERS)
    error = r["gpu_layers"]["error"]
    assert error.startswith("big-8gb.gguf needs 7.56 GB of weights on CUDA0 ")
    assert "--gpu-layers auto" in error
    assert r["gpu_layers"]["message"] == error
    assert r["fit"]["fits"] is False  # the fit of what was asked


def test_the_one_gpu_chosen_takes_the_layers(big: Path, specdeck_home: Path) -> None:
    backend = cuda_build(gpu("CUDA0", 3), gpu("CUDA1", 20))
    both = report(big, backend)
    alone = report(big, backend, main_gpu=1)
    assert "CUDA0" in both["gpu_layers"]["message"]
    assert alone["gpu_layers"]["chosen"] == ALL_GPU_LAYERS
    assert "CUDA1" in alone["gpu_layers"]["message"]
    assert "CUDA0" not in alone["gpu_layers"]["message"]
    assert parts_on(alone) == {"gpu1"}  # every layer on the one chosen, none on CUDA0
    missing = report(big, backend, main_gpu=5)
    assert missing["gpu_layers"]["message"] == "auto: all on the CPU: llama.cpp has no GPU 5 (its GPUs: CUDA0, CUDA1)"


def test_the_batch_flash_attention_and_kv_type_reach_the_fit(big: Path, specdeck_home: Path) -> None:
    backend = cuda_build(gpu("CUDA0", 4))
    base = report(big, backend, n_gpu_layers=4)
    smaller = report(big, backend, n_gpu_layers=4, kv_type="q8_0", n_batch=128)
    assert base["gpu_layers"]["message"] == "4: 4 of 33 on the GPU"

    def kv_and_compute(r: dict[str, Any]) -> int:
        return sum(d["kv"] + d["compute"] for d in r["fit"]["devices"])

    assert kv_and_compute(smaller) < kv_and_compute(base)
    assert smaller["settings"]["kv_type"] == "q8_0"
    assert smaller["settings"]["batch"] == 128


def test_every_load_option_is_taken_and_reported(big: Path, specdeck_home: Path) -> None:
    """The shared options (app.cli.load_options) reach doctor's settings and its report whole: none is dropped."""
    parser = argparse.ArgumentParser()
    doctor.add_arguments(parser)
    args = parser.parse_args(["--model", str(big), "--ctx", "2048", "--batch", "256", "--threads", "3",
                              "--gpu-layers", "7", "--main-gpu", "0", "--kv-type", "q8_0", "--flash-attn", "on",
                              "--recurrent-rollback", "checkpoints"])
    options = doctor.options_from(args)
    assert options.load == LoadSettings(str(big), n_ctx=2048, n_batch=256, n_threads=3, n_gpu_layers=7,
                                        main_gpu=0, kv_type="q8_0", flash_attn="on",
                                        recurrent_rollback="checkpoints")
    r = build_report(options, backend=cuda_build(gpu("CUDA0", 20)), ram_free=RAM)[0].as_json()
    assert r["settings"] == {"ctx": 2048, "batch": 256, "threads": 3, "gpu_layers": 7, "main_gpu": 0,
                             "kv_type": "q8_0", "flash_attn": "on", "rpc_servers": [],
                             "recurrent_rollback": "checkpoints", "draft_k": 4}
    reported = {"n_ctx": "ctx", "n_batch": "batch", "n_threads": "threads", "rpc_servers": "rpc_servers"}
    assert {reported.get(field, dest) for field, (dest, _) in OPTIONS.items()} <= set(r["settings"])
    assert r["gpu_layers"]["message"] == "7: 7 of 33 on the GPU"


def test_the_decode_check_loads_with_the_options(big: Path, specdeck_home: Path) -> None:
    seen: list[LoadSettings] = []

    def check(path: Path, settings: LoadSettings) -> dict[str, Any]:
        seen.append(settings)
        return {"ok": True, "model": str(path), "message": "decoded", "tokens": 1, "seconds": 0.1,
                "tokens_per_second": 10.0, "context": 7}

    load = LoadSettings(target_path="", n_gpu_layers=AUTO_GPU_LAYERS, kv_type="q8_0", n_batch=64, main_gpu=0)
    build_report(DoctorOptions(model=big, load=load, decode_check=True), check,
                 backend=cuda_build(gpu("CUDA0", 20)), ram_free=RAM)
    build_report(DoctorOptions(model=big, ctx=1024, load=load, decode_check=True), check,
                 backend=cuda_build(gpu("CUDA0", 20)), ram_free=RAM)
    assert [s.n_ctx for s in seen] == [512, 1024]  # the check's own short context unless one was asked
    assert seen[0] == replace(load, target_path=str(big), n_ctx=512)


def test_an_rpc_server_is_probed_before_anything(big: Path, specdeck_home: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        options = DoctorOptions(model=big, load=LoadSettings(target_path="", rpc_servers=(f"127.0.0.1:{port}",)))
        with pytest.raises(AppError) as err:
            build_report(options, backend=cuda_build(), ram_free=RAM)
        assert str(err.value).startswith(f"Nothing listens at 127.0.0.1:{port}: ")


class HelloServer:
    """Answers rpc-server's handshake and device count (one device) on every connection: enough for the
    probe that runs before ggml, not for ggml itself."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.endpoint = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                try:
                    while head := conn.recv(9, socket.MSG_WAITALL):
                        cmd, size = struct.unpack("<BQ", head)
                        if size:
                            conn.recv(size, socket.MSG_WAITALL)
                        if cmd == 14:  # HELLO: protocol 7.0.0, no capabilities
                            conn.sendall(struct.pack("<Q", 28) + bytes([RPC_PROTO_MAJOR, 0, 0, 0]) + bytes(24))
                        else:  # DEVICE_COUNT
                            conn.sendall(struct.pack("<QI", 4, 1))
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


def test_the_rpc_servers_reach_llama_cpp_s_device_list(big: Path, specdeck_home: Path) -> None:
    """The servers go to the child that asks llama.cpp for its devices, which registers them first; a build
    without the RPC backend refuses them there in the sentence chat gives."""
    if rpc_available():
        pytest.skip("this llama.cpp has the RPC backend: tests/rpc covers a real server (packaging/rpc_tests)")
    server = HelloServer()
    try:
        options = DoctorOptions(model=big, load=LoadSettings(target_path="", rpc_servers=(server.endpoint,)))
        with pytest.raises(AppError) as err:
            build_report(options, ram_free=RAM)
        assert str(err.value).startswith("This llama.cpp was built without the RPC backend: set it up with")
    finally:
        server.close()
