"""SpecDeck on a real Vulkan device: offload, memory per device, the roofline's split, exactness, refusal.

On a machine without a GPU the device is Mesa's llvmpipe (slow but real to llama.cpp: its own buffers, its
own memory report, layers and KV cache on it). What llama.cpp allocates is read from its load log
('Vulkan0 model buffer size = ...', 'layer 3 assigned to device Vulkan0') and from ggml_backend_dev_memory;
what SpecDeck reports comes from doctor's JSON and the engine session's Loaded event.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.ceiling.backend import BackendDevice, probe_backend
from app.engine.llama import Context, ContextParams, Model
from app.library.gguf_reader import read_gguf_info
from tests.gguf_fixtures import write_tiny_model
from tests.vulkan.conftest import LlamaLog

MIB = 1024 * 1024
N_LAYER = 4
N_CTX = 256
# llama.cpp logs buffer sizes in MiB with two decimals.
LOG_RESOLUTION = 0.005 * MIB


@pytest.fixture(scope="module")
def vulkan_device() -> BackendDevice:
    info = probe_backend()
    devices = [d for d in info.devices if d.backend.lower() == "vulkan" or d.name.startswith("Vulkan")]
    if not devices:
        pytest.fail(f"SPECDECK_VULKAN_TESTS is set, but this llama.cpp ({info.backend}) lists no Vulkan device: "
                    f"{[d.name for d in info.devices]}. On llvmpipe set GGML_VK_VISIBLE_DEVICES=0.")
    return devices[0]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four layers, so that a partial offload splits them two and two."""
    return write_tiny_model(tmp_path_factory.mktemp("vk") / "tiny-4-layers.gguf", n_layer=N_LAYER, n_embd=128,
                            n_head=4, n_head_kv=2, n_ff=256, name="tiny-4-layers")


def tensor_bytes(path: Path) -> dict[str, int]:
    from gguf import GGUFReader

    return {t.name: int(t.n_bytes) for t in GGUFReader(path).tensors}


def layer_bytes(sizes: dict[str, int], layers: range) -> int:
    return sum(n for name, n in sizes.items() if any(name.startswith(f"blk.{i}.") for i in layers))


def doctor_json(*args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "app.cli.doctor", "--json", "-", *args], capture_output=True,
                         text=True, timeout=300, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def load(path: Path, n_gpu_layers: int) -> tuple[Model, Context]:
    model = Model(path, n_gpu_layers=n_gpu_layers)
    return model, Context(model, ContextParams(n_ctx=N_CTX, n_batch=64, n_threads=1))


@pytest.fixture
def loaded(request: pytest.FixtureRequest, model_path: Path, llama_log: LlamaLog) -> Iterator[tuple[Model, LlamaLog]]:
    model, ctx = load(model_path, request.param)
    yield model, llama_log
    ctx.close()
    model.close()


def test_doctor_reports_the_device_its_memory_and_the_fit_as_llama_cpp_allocates(
        vulkan_device: BackendDevice, model_path: Path, llama_log: LlamaLog) -> None:
    report = doctor_json("--model", str(model_path), "--ctx", str(N_CTX), "--gpu-bandwidth", "20")
    backend = report["backend"]
    assert backend["backend"] == "vulkan"
    assert backend["gpu_offload"] is True
    listed = {d["name"]: d for d in backend["devices"]}
    dev = listed[vulkan_device.name]
    assert dev["description"] == vulkan_device.description
    # ggml_backend_dev_memory, asked in doctor's probe child and here: the same device, the same memory.
    assert dev["memory_total"] == vulkan_device.memory_total
    assert dev["memory_total"]
    assert 0 < dev["memory_free"] <= dev["memory_total"]
    gpu = next(g for g in report["gpus"] if g["backend_device"] == vulkan_device.name)
    assert gpu["memory_total"] == vulkan_device.memory_total

    # The fit doctor reports for all layers on the device, against what llama.cpp then allocates there.
    model, ctx = load(model_path, -1)
    try:
        fit = {d["device"]: d for d in report["fit"]["devices"]}
        on_device = fit["gpu0"]
        assert on_device["name"] == vulkan_device.description
        kv = llama_log.buffers("KV")[vulkan_device.name] * MIB
        assert abs(on_device["kv"] - kv) <= LOG_RESOLUTION, (on_device, kv)
        weights = llama_log.buffers("model")[vulkan_device.name] * MIB
        # The fit keeps the token embeddings (the input layer) in host memory, as llama.cpp does.
        assert abs(on_device["weights"] - weights) <= LOG_RESOLUTION + 4096, (on_device, weights)
        assert fit["cpu"]["weights"] == tensor_bytes(model_path)["token_embd.weight"]
    finally:
        ctx.close()
        model.close()


@pytest.mark.parametrize("loaded", [-1], indirect=True, ids=["all-layers"])
def test_full_offload_puts_every_layer_and_the_kv_cache_on_the_device(
        loaded: tuple[Model, LlamaLog], model_path: Path, vulkan_device: BackendDevice) -> None:
    model, log = loaded
    name = vulkan_device.name
    assert f"offloaded {N_LAYER + 1}/{N_LAYER + 1} layers to GPU" in log.text
    assert set(log.layer_devices().values()) == {name}
    sizes = tensor_bytes(model_path)
    # Everything but the token embeddings (llama.cpp keeps the input layer on the CPU) is on the device.
    on_device = sum(sizes.values()) - sizes["token_embd.weight"]
    weights = log.buffers("model")
    assert abs(weights[name] * MIB - on_device) <= LOG_RESOLUTION + 4096, (weights, on_device)
    kv = log.buffers("KV")
    assert set(kv) == {name}
    assert model.size_bytes == sum(sizes.values())


@pytest.mark.parametrize("loaded", [2], indirect=True, ids=["2-of-5-layers"])
def test_partial_offload_splits_layers_and_kv_as_the_roofline_places_them(
        loaded: tuple[Model, LlamaLog], model_path: Path, vulkan_device: BackendDevice) -> None:
    """Two of five layers offloaded: llama.cpp puts the output layer and the last repeating layer on the
    device. The roofline must place the same layers there, and its bytes per pass on the device must be those
    layers' weights plus their KV cache."""
    from app.ceiling.roofline import Device, ModelShape, estimate_pass, kv_bytes_read, place

    _, log = loaded
    name = vulkan_device.name
    assert f"offloaded 2/{N_LAYER + 1} layers to GPU" in log.text
    assert "offloading output layer to GPU" in log.text
    on_device = sorted(i for i, dev in log.layer_devices().items() if dev == name)
    assert on_device == [N_LAYER - 1, N_LAYER]  # the last repeating layer, and the output layer
    sizes = tensor_bytes(model_path)
    device_weights = (layer_bytes(sizes, range(N_LAYER - 1, N_LAYER)) + sizes["output.weight"]
                      + sizes["output_norm.weight"])
    weights = log.buffers("model")
    assert abs(weights[name] * MIB - device_weights) <= LOG_RESOLUTION + 4096, (weights, device_weights)
    kv = log.buffers("KV")
    assert kv[name] == pytest.approx(sum(kv.values()) / N_LAYER, abs=0.01)  # one layer of four

    shape = ModelShape.from_gguf(read_gguf_info(model_path))
    devices = [Device("cpu", "CPU", "cpu", 50e9),
               Device("gpu0", vulkan_device.description, "gpu", 50e9, free_bytes=vulkan_device.memory_free)]
    shares = {s.device.key: s for s in place(shape, devices, n_gpu_layers=2)}
    assert shares["gpu0"].layers == (N_LAYER - 1,)
    assert shares["gpu0"].output
    assert shares["cpu"].layers == tuple(range(N_LAYER - 1))
    # Bytes per pass on the device: the roofline spreads weights evenly over the n_layer + 1 slices (GGUFInfo
    # has no per-layer sizes), so it is compared with the device's real weights within that approximation.
    context = 64
    part = next(p for p in estimate_pass(shape, devices, context, n_gpu_layers=2).parts if p.device == "gpu0")
    kv_on_device = kv_bytes_read(shape, context, "f16", layers=(N_LAYER - 1,))
    even = shape.weight_bytes * 2 / (N_LAYER + 1)
    assert part.bytes == pytest.approx(even + kv_on_device)
    print(f"\n{name}: llama.cpp holds {device_weights} bytes of weights for 2 of 5 layers; the roofline counts "
          f"{even:.0f} (even spread) + {kv_on_device} of KV per pass")


def test_the_engine_reports_the_device_weights_and_kv_as_llama_cpp_allocates_them(
        model_path: Path, vulkan_device: BackendDevice, llama_log: LlamaLog) -> None:
    """What the dashboard is told at load (the Loaded event): backend, offload, weights and KV cache size."""
    from app.engine.session import EngineSession
    from app.params import LoadSettings

    # The session installs its own log sink (llama.cpp's log without debug lines): hand it the test's.
    session = EngineSession(LoadSettings(str(model_path), n_ctx=N_CTX, n_batch=64, n_gpu_layers=-1, n_threads=1),
                            log=llama_log.lines.append)
    try:
        loaded = session.loaded_event()
        assert loaded.backend == "vulkan"
        assert loaded.gpu_offload is True
        assert loaded.target.size_bytes == sum(tensor_bytes(model_path).values())
        kv = llama_log.buffers("KV")
        assert set(kv) == {vulkan_device.name}
        assert abs(loaded.kv_bytes_total - kv[vulkan_device.name] * MIB) <= LOG_RESOLUTION, (loaded, kv)
    finally:
        session.close()


def _greedy(decoder: Any, prompt: list[int], n: int) -> tuple[list[int], int]:
    from app.engine.speculative import RunTotals, StopReason
    from app.events import Token
    from app.params import SamplingSettings

    decoder.reset_cache()
    totals = RunTotals()
    out: list[int] = []
    for event in decoder.generate(prompt, SamplingSettings(temperature=0.0, max_tokens=n), totals=totals,
                                  stop=StopReason()):
        if isinstance(event, Token):
            out += event.token_ids
    return out, totals.drafted


def _batched_vs_single(model: Model, prefix: list[int]) -> tuple[np.ndarray, float]:
    """Single-token logits after ``prefix`` and their largest difference from the same row computed in a batch."""
    single_ctx, batch_ctx = load_context(model), load_context(model)
    try:
        single_ctx.prefill(prefix[:-1])
        single = np.array(single_ctx.decode([prefix[-1]])[-1], dtype=np.float64)
        batch_ctx.prefill(prefix[:-4])
        batched = np.array(batch_ctx.decode(prefix[-4:], all_logits=True)[-1], dtype=np.float64)
    finally:
        single_ctx.close()
        batch_ctx.close()
    return single, float(np.abs(single - batched).max())


def load_context(model: Model) -> Context:
    return Context(model, ContextParams(n_ctx=N_CTX, n_batch=64, n_threads=1))


def test_greedy_speculative_equals_plain_on_the_device(model_path: Path, vulkan_device: BackendDevice,
                                                      llama_log: LlamaLog) -> None:
    """The model drafts for itself (identical weights, so every verify pass is k + 1 = 6 wide) on the device;
    where the answers diverge, the plain token must win by less than batched and single-token logits differ."""
    from app.engine.adaptive import DepthController
    from app.engine.drafters import ModelDrafter
    from app.engine.speculative import SpeculativeDecoder

    model = Model(model_path, n_gpu_layers=-1)
    target_ctx, draft_ctx = load_context(model), load_context(model)
    try:
        assert f"offloaded {N_LAYER + 1}/{N_LAYER + 1} layers" in llama_log.text
        prompt = model.tokenize("The quick brown fox jumps over the lazy dog, again and again", add_special=True)
        plain, _ = _greedy(SpeculativeDecoder(model, target_ctx), prompt, 48)
        spec, drafted = _greedy(
            SpeculativeDecoder(model, target_ctx, drafter=ModelDrafter(model, draft_ctx, p_min=0.0),
                               controller=DepthController(k_max=5, fixed=5)), prompt, 48)
        assert drafted > 0
        assert len(plain) == 48
        agree = next((i for i in range(min(len(plain), len(spec))) if plain[i] != spec[i]), len(plain))
        if agree < len(plain):
            single, noise = _batched_vs_single(model, prompt + plain[:agree])
            gap = float(single[plain[agree]] - single[spec[agree]])
            assert 0.0 <= gap <= noise + 1e-6, f"diverged at {agree}: gap {gap}, batched-vs-single {noise}"
        else:
            assert spec == plain
    finally:
        target_ctx.close()
        draft_ctx.close()
        model.close()


def test_a_model_bigger_than_the_device_gives_a_clear_message(vulkan_device: BackendDevice,
                                                             tmp_path: Path) -> None:
    """Weights beyond the memory the device reports (a sparse GGUF: no disk, nothing read) are refused by the
    engine in one sentence before llama.cpp allocates anything; the process lives on."""
    from app.engine.session import EngineSession
    from app.errors import EngineLoadError
    from app.params import LoadSettings
    from tests.setup.test_device_fit import gpu_check_module

    g = gpu_check_module()
    assert vulkan_device.memory_total
    base = g.SHAPES["1gb"]
    per_layer = base.n_params / base.n_layer
    n_layer = int(vulkan_device.memory_total * 1.5 / per_layer) + 1
    shape = g.Shape(base.n_embd, base.n_ff, n_layer, base.n_head, base.n_head_kv, base.n_vocab)
    path = g.write_model(tmp_path / "bigger-than-the-device.gguf", shape, sparse=True)
    assert path.stat().st_size > vulkan_device.memory_total
    with pytest.raises(EngineLoadError) as err:
        EngineSession(LoadSettings(str(path), n_ctx=512, n_gpu_layers=-1, n_threads=1))
    message = str(err.value)
    assert f"of weights on {vulkan_device.name}" in message
    assert "GPU layers" in message
    assert "\n" not in message


def test_memory_per_device_reports_the_device_and_what_is_placed_on_it(
        model_path: Path, vulkan_device: BackendDevice, llama_log: LlamaLog) -> None:
    """The one place doctor and the dashboard read memory per device: the Vulkan device's total as
    ggml_backend_dev_memory reports it (in this process and in the window's child probe alike), and the
    weights + KV cache the fit places there against what llama.cpp allocates."""
    from app.ceiling.memory import LoadedModels, MemoryProbe, device_memory

    here = {m.device: m for m in device_memory((), probe_backend().devices)}
    assert here[vulkan_device.name].total == vulkan_device.memory_total
    assert here[vulkan_device.name].source == "llama.cpp"
    assert here["CPU"].kind == "cpu"

    model, ctx = load(model_path, -1)
    try:
        weights = llama_log.buffers("model")[vulkan_device.name] * MIB
        kv = llama_log.buffers("KV")[vulkan_device.name] * MIB
        probe = MemoryProbe(nvidia=lambda: ())  # the window's probe: llama.cpp asked in a child process
        probe.follow(LoadedModels(str(model_path), None, N_CTX, round(kv), gpu_offload=True))
        probe.refresh_llama(wait=True)
        (gpu,) = probe.read().gpus
        assert gpu.device == vulkan_device.name
        assert gpu.total == vulkan_device.memory_total
        if vulkan_device.memory_free == vulkan_device.memory_total:  # no memory-budget report (llvmpipe)
            assert gpu.used is None
        else:
            assert gpu.used is not None
            assert 0 <= gpu.used <= gpu.total
        assert gpu.placed is not None
        assert abs(gpu.placed - (weights + kv)) <= 2 * LOG_RESOLUTION + 4096, (gpu, weights, kv)
    finally:
        ctx.close()
        model.close()


def test_the_dashboard_plots_the_devices_memory_and_the_models_share(
        model_path: Path, vulkan_device: BackendDevice, qtbot: Any) -> None:
    """The dashboard's memory rows for a real GPU device: its memory in use and the weights + KV on it."""
    from app.ceiling.memory import MemoryProbe
    from app.engine.session import EngineSession
    from app.params import LoadSettings
    from ui.dashboard.panel import DashboardPanel

    session = EngineSession(LoadSettings(str(model_path), n_ctx=N_CTX, n_batch=64, n_gpu_layers=-1, n_threads=1))
    try:
        loaded = session.loaded_event()
        probe = MemoryProbe(nvidia=lambda: ())
        panel = DashboardPanel(ceiling_provider=lambda _loaded: None, memory_probe=probe)
        qtbot.addWidget(panel)
        panel.on_loaded(loaded)
        probe.refresh_llama(wait=True)
        panel._poll_memory(force=True)
        name = vulkan_device.name
        # The panel reads memory on its worker thread: wait for the reading taken after the refresh.
        qtbot.waitUntil(lambda: f"{name} weights+KV" in dict(panel.memory_rows()), timeout=30_000)
        rows = dict(panel.memory_rows())
        if vulkan_device.memory_free == vulkan_device.memory_total:  # llvmpipe: no memory-budget report
            assert f"{name} in use" not in rows
            assert "use not reported by the device" in panel.mem_label.text()
        else:
            assert 0 <= rows[f"{name} in use"] <= (vulkan_device.memory_total or 0)
        assert rows[f"{name} weights+KV"] >= loaded.kv_bytes_total
        assert f"{name} {vulkan_device.description}:" in panel.mem_label.text()
    finally:
        session.close()


def test_a_chosen_gpu_loads_the_model_alone_and_a_missing_one_is_refused(
        model_path: Path, vulkan_device: BackendDevice, llama_log: LlamaLog) -> None:
    """main_gpu with split mode NONE: every layer on the chosen device; an index llama.cpp lacks is named."""
    from app.errors import EngineLoadError

    model = Model(model_path, n_gpu_layers=-1, main_gpu=0)
    try:
        assert f"using device {vulkan_device.name} (" in llama_log.text
        assert f"offloaded {N_LAYER + 1}/{N_LAYER + 1} layers to GPU" in llama_log.text
        assert set(llama_log.layer_devices().values()) == {vulkan_device.name}
    finally:
        model.close()
    with pytest.raises(EngineLoadError, match=r"GPU 1 does not exist; llama\.cpp's GPUs here are 0: "):
        Model(model_path, n_gpu_layers=-1, main_gpu=1)


def test_the_dashboards_ceiling_counts_the_vulkan_device(model_path: Path, vulkan_device: BackendDevice,
                                                          specdeck_home: Path) -> None:
    """The dashboard's roof for a model on the device: llama.cpp's device list (a child probe) makes the
    Vulkan GPU count although NVML cannot see it; its bandwidth is the saved override."""
    from app.ceiling.builder import ceiling_for_loaded
    from app.events import Loaded, ModelSummary
    from app.storage.settings import AppSettings, save_settings

    save_settings(AppSettings(bandwidth_override_gbps=20.0))
    info = read_gguf_info(model_path)
    summary = ModelSummary(str(model_path), "tiny", "llama", info.n_params, info.tensor_bytes, info.context_length,
                           N_LAYER, info.n_vocab)
    ceiling = ceiling_for_loaded(Loaded(summary, None, 0, N_CTX, "vulkan", True, 1024, 1024 * N_CTX, 1.0))
    assert ceiling is not None
    assert ceiling.device == f"{vulkan_device.description} (20 GB/s)"


ROLLBACK_CHILD = """
import sys
from app.params import DraftSettings, LoadSettings, SamplingSettings
from app.engine.session import EngineSession
from app.events import Token

said = []
session = EngineSession(LoadSettings(sys.argv[1], n_ctx=512, n_batch=64, n_gpu_layers=-1,
                                     draft=DraftSettings(ngram=1, k_max=2)), log=said.append)
print("\\n".join(said))
messages = [{"role": "user", "content": "Say a b a b a b a b a b a b."}]
tokens = [e for e in session.generate(1, messages, SamplingSettings(temperature=0.0, max_tokens=6))
          if isinstance(e, Token)]
print("tokens", sum(len(t.token_ids) for t in tokens))
"""


def test_speculative_decoding_on_the_device_survives_kv_rollbacks(vulkan_device: BackendDevice) -> None:
    """llama.cpp's Vulkan flash attention, which "auto" turns on there, crashed SmolLM2 on a pass after a
    rollback of the KV cache (8 tokens, +1, rolled back, +3): the load's pass timing did exactly that. On Vulkan
    "auto" is off now. In a child process, so that a crash fails this test rather than ending the run."""
    from tests.gguf_fixtures import smollm2_path

    out = subprocess.run([sys.executable, "-c", ROLLBACK_CHILD, str(smollm2_path())], capture_output=True,
                         text=True, timeout=900, env=dict(os.environ))
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr[-1500:]}"
    assert "flash attention: off on Vulkan" in out.stdout
    assert "tokens 6" in out.stdout
