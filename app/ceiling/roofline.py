"""The ceiling: how fast a decode pass can possibly be on given hardware. Arithmetic on a model's shape.

A pass reads the weights of every layer it runs plus the KV cache at the current context, and does
2 FLOPs per parameter per token in the pass (plus attention over the context). On each device the pass
takes at least max(bytes / bandwidth, FLOPs / peak); devices run one after another (layers are a
pipeline for one sequence), so the times add up. Ceiling = 1 / that time. Every input is an upper bound
on what the hardware delivers and every byte and FLOP counted is work llama.cpp really does, so the
ceiling is a true upper bound on the measured rate, never an estimate of it.

The one read is ``ModelShape.from_gguf``'s look at the model's tensor table (``app.ceiling.tensor_split``),
for the bytes llama.cpp places per layer. Sizes in bytes, rates in bytes/s and FLOP/s, times in seconds.
The memory fit (``app.ceiling.fit``) and the calibration against a measured rate (``app.ceiling.calibration``)
build on this module's one model of what a pass reads and where its layers run; what drafting gains per pass
is ``app.ceiling.speculation``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from app.engine_limits import kv_cache_type
from app.library.gguf_reader import GGUFInfo

# llama.cpp pads the context (and the SWA cache) to a multiple of 256 cells.
KV_PAD = 256

MEMORY = "memory"
COMPUTE = "compute"


def padded(n: int, to: int) -> int:
    """n rounded up to a multiple of `to` (llama.cpp's GGML_PAD)."""
    return (n + to - 1) // to * to


def kv_row_bytes(kv_type: str, n_elements: int) -> int:
    """Bytes of one cache row of n_elements values (ggml_row_size)."""
    return kv_cache_type(kv_type).row_bytes(n_elements)


# --- models -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """What the roofline needs to know about a model (see ``from_gguf``)."""

    name: str
    weight_bytes: int  # all tensor data: what one pass streams from memory
    n_params: int
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_vocab: int = 0
    sliding_window: int = 0
    swa_layers: tuple[bool, ...] = ()  # per layer; empty = no sliding-window layers
    # Where llama.cpp puts the weights (from the tensor table; all empty when it could not be read):
    input_bytes: int = 0  # the input layer (token embeddings), which llama.cpp keeps in host memory
    output_bytes: int = 0  # the output layer's own tensors, and every other tensor outside the layers
    layer_bytes: tuple[int, ...] = ()  # per repeating layer
    tied_output_bytes: int = 0  # no output matrix: llama.cpp copies the token embeddings to the output layer
    kv_layers: tuple[bool, ...] = ()  # per layer: keeps an attention KV cache; empty = every layer does
    state_bytes: int = 0  # one sequence's recurrent state (recurrent and hybrid models), read and written per pass
    kv_has_v: bool = True  # False with multi-head latent attention: llama.cpp keeps K only (GGUFInfo.mla)

    @classmethod
    def from_gguf(cls, info: GGUFInfo) -> ModelShape:
        from app.ceiling.tensor_split import tensor_split

        # Untied token embeddings are counted in full in a pass although it reads one row of them: for an 8B
        # model that overstates bytes per pass by ~6%.
        split = tensor_split(info)
        return cls(
            name=info.name or info.path,
            weight_bytes=info.tensor_bytes,
            n_params=info.n_params,
            n_layer=info.n_layer,
            n_embd=info.n_embd,
            n_head=info.n_head,
            n_head_kv=info.n_head_kv,
            head_dim_k=info.head_dim_k,
            head_dim_v=info.head_dim_v,
            n_vocab=info.n_vocab,
            sliding_window=info.sliding_window,
            swa_layers=tuple(info.swa_layers) if info.sliding_window > 0 else (),
            input_bytes=split.input_bytes if split else 0,
            output_bytes=split.output_bytes if split else 0,
            layer_bytes=split.layer_bytes if split else (),
            tied_output_bytes=split.tied_output_bytes if split else 0,
            kv_layers=tuple(info.kv_layers),
            state_bytes=info.recurrent_state_bytes,
            kv_has_v=not info.mla,
        )

    def has_kv(self, layer: int) -> bool:
        return not self.kv_layers or (layer < len(self.kv_layers) and self.kv_layers[layer])

    @property
    def n_kv_layers(self) -> int:
        return sum(1 for il in range(self.n_layer) if self.has_kv(il))

    def is_swa(self, layer: int) -> bool:
        return self.sliding_window > 0 and layer < len(self.swa_layers) and self.swa_layers[layer]

    def kv_layer_bytes_per_cell(self, type_k: str = "f16", type_v: str | None = None) -> int:
        """K + V bytes one layer stores per context cell (K alone with multi-head latent attention)."""
        k = kv_row_bytes(type_k, self.n_head_kv * self.head_dim_k)
        v = kv_row_bytes(type_v or type_k, self.n_head_kv * self.head_dim_v) if self.kv_has_v else 0
        return k + v


def kv_bytes_per_token(shape: ModelShape, type_k: str = "f16", type_v: str | None = None) -> int:
    """KV bytes one more token of context adds, all layers (SWA layers only until their window fills)."""
    return shape.n_kv_layers * shape.kv_layer_bytes_per_cell(type_k, type_v)


def kv_layer_cells_read(shape: ModelShape, layer: int, context: int) -> int:
    """Cells a pass attends to in one layer: the whole context, at most the window on SWA layers, none on a
    recurrent layer."""
    if not shape.has_kv(layer):
        return 0
    if shape.is_swa(layer):
        return min(context, shape.sliding_window)
    return context


def kv_bytes_read(
    shape: ModelShape, context: int, type_k: str = "f16", type_v: str | None = None,
    layers: Sequence[int] | None = None,
) -> int:
    """KV bytes one pass reads at this context (optionally only for some layers)."""
    per_cell = shape.kv_layer_bytes_per_cell(type_k, type_v)
    chosen = range(shape.n_layer) if layers is None else layers
    return sum(kv_layer_cells_read(shape, il, context) for il in chosen) * per_cell


def kv_cache_bytes(
    shape: ModelShape, n_ctx: int, type_k: str = "f16", type_v: str | None = None, *,
    swa_full: bool = True, n_ubatch: int = 512, n_batch: int = 512,
) -> int:
    """KV bytes llama.cpp allocates for one sequence (llama-kv-cache-iswa.cpp).

    The context is padded to 256 cells. SWA layers get their own cache of
    pad(min(n_ctx, window + n_ubatch), 256) cells unless ``swa_full`` (llama.cpp's default, which the
    high-level ``Llama`` keeps) gives them the full context.
    """
    kv_size = padded(n_ctx, KV_PAD)
    ubatch = min(n_ubatch, n_batch, n_ctx)
    swa_size = kv_size if swa_full else padded(min(kv_size, shape.sliding_window + ubatch), KV_PAD)
    per_cell = shape.kv_layer_bytes_per_cell(type_k, type_v)
    total = 0
    for il in range(shape.n_layer):
        if shape.has_kv(il):
            total += (swa_size if shape.is_swa(il) else kv_size) * per_cell
    return total


# Architectures for which llama.cpp keeps recurrent-state snapshots (llm_arch_supports_rs_rollback); for any
# other it silently keeps none.
RS_SNAPSHOT_ARCHS = frozenset(("kimi-k3", "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "glm5-next", "nemotron_h",
                               "nemotron_h_moe", "lfm2", "lfm2moe", "bailingmoe3"))
# At most this much memory goes to snapshots: each is a whole copy of the state, and a Mamba-2-sized hybrid's
# state is 100-200 MiB, so one snapshot per draft position (17 copies) would cost gigabytes.
RS_SNAPSHOT_BUDGET = 256 << 20


@dataclass(frozen=True)
class RecurrentRollback:
    """How a recurrent or hybrid model takes back rejected drafts, and what that costs in memory."""

    mechanism: str  # "snapshots" (llama.cpp's n_rs_seq) or "checkpoints" (a copy before a pass, then re-decode)
    snapshots: int  # n_rs_seq asked of llama.cpp
    state_bytes: int  # one copy of one sequence's state
    allocated_bytes: int  # state + snapshots + checkpoint


def recurrent_rollback(shape: ModelShape, architecture: str, k_max: int, setting: str = "auto") -> RecurrentRollback:
    """Snapshots where llama.cpp has them for this architecture (as many as the depth cap and the memory budget
    allow), checkpoints for deeper drafts and everywhere else."""
    snapshots = 0
    if setting == "auto" and architecture in RS_SNAPSHOT_ARCHS and k_max > 0:
        affordable = RS_SNAPSHOT_BUDGET // shape.state_bytes if shape.state_bytes else k_max
        snapshots = max(0, min(k_max, affordable))
    checkpoint = snapshots < k_max  # deeper drafts than the snapshots reach take a checkpoint
    return RecurrentRollback("snapshots" if snapshots else "checkpoints", snapshots, shape.state_bytes,
                             recurrent_state_allocated(shape, snapshots, checkpoint))


def recurrent_state_allocated(shape: ModelShape, snapshots: int = 0, checkpoint: bool = False) -> int:
    """Bytes of recurrent state llama.cpp allocates for one sequence: the state and ``snapshots`` rollback
    copies of it (n_rs_seq), plus SpecDeck's checkpoint copy in host memory where it uses one."""
    return shape.state_bytes * (1 + snapshots + (1 if checkpoint else 0))


def compute_buffer_bytes(shape: ModelShape, n_ctx: int, *, n_ubatch: int = 512, n_batch: int = 512,
                         flash_attn: bool = True) -> int:
    """Estimate of llama.cpp's compute buffer: the worst-case graph holds logits for a whole ubatch.

    Fitted to llama.cpp's own "compute buffer size" on the demo models (within 1 %). Without flash
    attention the attention scores of a ubatch against the whole context may be larger.
    """
    ubatch = min(n_ubatch, n_batch, n_ctx)
    per_token = shape.n_vocab + 2 * shape.n_embd
    if not flash_attn:
        per_token = max(per_token, shape.n_head * padded(n_ctx, KV_PAD) + 2 * shape.n_embd)
    return 4 * ubatch * per_token + 4 * shape.n_vocab  # + the output buffer for one row of logits


def attention_flops_per_token(shape: ModelShape, context: int) -> int:
    """QK^T and AV over the attended cells, all layers."""
    per_cell = 2 * shape.n_head * (shape.head_dim_k + shape.head_dim_v)
    return sum(kv_layer_cells_read(shape, il, context) for il in range(shape.n_layer)) * per_cell


# --- devices and placement ----------------------------------------------------------------------


@dataclass(frozen=True)
class Device:
    """One place a model's layers can run, with the two roofs."""

    key: str  # "cpu", "gpu0", ...
    name: str
    kind: str  # "cpu" or "gpu"
    bandwidth: float  # bytes/s
    peak_flops: float | None = None  # None: unknown, so the compute roof is left out
    free_bytes: int | None = None  # for the fit estimate; None: unknown


@dataclass(frozen=True)
class Share:
    """The part of a model one device runs: its repeating layers, and maybe the output layer."""

    device: Device
    layers: tuple[int, ...]
    output: bool

    def weight_fraction(self, n_layer: int) -> float:
        # Weights taken as spread evenly over n_layer + 1 slices (the last is the output layer):
        # GGUFInfo has no per-layer sizes.
        return (len(self.layers) + (1 if self.output else 0)) / (n_layer + 1)


def place(shape: ModelShape, devices: Sequence[Device], n_gpu_layers: int = -1) -> tuple[Share, ...]:
    """Which layers run where, as llama.cpp places them: the output layer first, then the last
    n_gpu_layers - 1 repeating layers, on the GPUs, split by free memory; the rest on the CPU (llama.cpp's
    i_gpu_start = n_layer + 1 - n_gpu_layers, the output layer counting as layer n_layer)."""
    cpu = next((d for d in devices if d.kind == "cpu"), None)
    gpus = [d for d in devices if d.kind != "cpu"]
    n = shape.n_layer
    n_off = 0 if not gpus else (n + 1 if n_gpu_layers < 0 else min(n_gpu_layers, n + 1))
    if cpu is None and n_off < n + 1:
        if not gpus:
            raise ValueError("no device to run the model on")
        n_off = n + 1  # no CPU device given: everything on the GPUs
    first_gpu_layer = n + 1 - n_off if n_off > 0 else n
    shares: list[Share] = []
    if first_gpu_layer > 0 or n_off == 0:
        assert cpu is not None
        shares.append(Share(cpu, tuple(range(first_gpu_layer)), output=n_off == 0))
    if gpus and n_off > 0:
        weights = [float(g.free_bytes) if g.free_bytes else 1.0 for g in gpus]
        total = sum(weights)
        gpu_layers = list(range(first_gpu_layer, n))
        start = 0
        acc = 0.0
        for i, g in enumerate(gpus):
            acc += weights[i]
            end = len(gpu_layers) if i == len(gpus) - 1 else round(len(gpu_layers) * acc / total)
            last = i == len(gpus) - 1
            shares.append(Share(g, tuple(gpu_layers[start:end]), output=last))
            start = end
    return tuple(s for s in shares if s.layers or s.output)


# --- time per pass ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RoofTime:
    """One device's share of one phase of a pass."""

    device: str  # Device.key
    phase: str  # "target" or "drafter"
    bytes: float
    flops: float
    memory_seconds: float
    compute_seconds: float  # 0 when the device's peak is unknown

    @property
    def seconds(self) -> float:
        return max(self.memory_seconds, self.compute_seconds)

    @property
    def binding(self) -> str:
        return COMPUTE if self.compute_seconds > self.memory_seconds else MEMORY


def roof(device: Device, nbytes: float, flops: float, phase: str = "target") -> RoofTime:
    """The roofline for one device: bytes over bandwidth against FLOPs over peak."""
    if device.bandwidth <= 0:
        raise ValueError(f"{device.name}: memory bandwidth must be positive")
    compute = flops / device.peak_flops if device.peak_flops else 0.0
    return RoofTime(device.key, phase, nbytes, flops, nbytes / device.bandwidth, compute)


@dataclass(frozen=True)
class PassEstimate:
    """The ceiling of one decode pass: `tokens` verified by the target after `draft_steps` drafter steps."""

    tokens: int
    draft_steps: int
    context: int
    target_weight_bytes: float
    target_kv_bytes: float
    drafter_bytes: float  # drafter weights + its KV, times draft steps
    flops: float
    parts: tuple[RoofTime, ...]
    # Round trips to RPC servers in this pass (the target's and each drafter step's), measured at load.
    network_seconds: float = 0.0

    @property
    def bytes(self) -> float:
        return self.target_weight_bytes + self.target_kv_bytes + self.drafter_bytes

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.parts) + self.network_seconds

    @property
    def passes_per_second(self) -> float:
        return 1.0 / self.seconds if self.seconds > 0 else math.inf

    @property
    def tokens_per_second(self) -> float:
        """The ceiling at one emitted token per pass (plain decoding when tokens == 1)."""
        return self.passes_per_second

    @property
    def memory_seconds(self) -> float:
        return sum(p.memory_seconds for p in self.parts)

    @property
    def compute_seconds(self) -> float:
        return sum(p.compute_seconds for p in self.parts)

    @property
    def binding(self) -> str:
        """The roof that holds the most time: "memory" or "compute"."""
        mem = sum(p.seconds for p in self.parts if p.binding == MEMORY)
        comp = sum(p.seconds for p in self.parts if p.binding == COMPUTE)
        return COMPUTE if comp > mem else MEMORY

    @property
    def binding_device(self) -> str:
        return max(self.parts, key=lambda p: p.seconds).device if self.parts else ""

    def speculative_tokens_per_second(self, tokens_per_pass: float) -> float:
        """The speculative ceiling: measured tokens per pass times passes per second."""
        return tokens_per_pass * self.passes_per_second


def _model_roofs(
    shape: ModelShape, shares: Sequence[Share], context: int, tokens: int, type_k: str, type_v: str | None,
    phase: str,
) -> tuple[list[RoofTime], float, float]:
    parts: list[RoofTime] = []
    weights_total = 0.0
    kv_total = 0.0
    attn_per_token = attention_flops_per_token(shape, context)
    for share in shares:
        frac = share.weight_fraction(shape.n_layer)
        w = shape.weight_bytes * frac
        kv = float(kv_bytes_read(shape, context, type_k, type_v, layers=share.layers))
        layer_frac = len(share.layers) / shape.n_layer if shape.n_layer else 0.0
        kv += 2.0 * shape.state_bytes * layer_frac  # a recurrent state is read and written once per pass
        flops = tokens * (2.0 * shape.n_params * frac + attn_per_token * layer_frac)
        parts.append(roof(share.device, w + kv, flops, phase))
        weights_total += w
        kv_total += kv
    return parts, weights_total, kv_total


def estimate_pass(
    target: ModelShape,
    devices: Sequence[Device],
    context: int,
    *,
    tokens: int = 1,
    type_k: str = "f16",
    type_v: str | None = None,
    n_gpu_layers: int = -1,
    drafter: ModelShape | None = None,
    draft_steps: int = 0,
    drafter_gpu_layers: int = -1,
    network_seconds: float = 0.0,
) -> PassEstimate:
    """The ceiling of one pass at this context: the target verifying `tokens` tokens in one decode,
    after `draft_steps` single-token drafter decodes (each a full pass over the drafter's weights).
    ``network_seconds``: the RPC servers' round trips of one decode (each drafter step is a decode too)."""
    if tokens < 1:
        raise ValueError("a pass verifies at least one token")
    context = max(context, 0)
    parts, w, kv = _model_roofs(target, place(target, devices, n_gpu_layers), context, tokens,
                                type_k, type_v, "target")
    flops = sum(p.flops for p in parts)
    drafter_bytes = 0.0
    if drafter is not None and draft_steps > 0:
        d_parts, dw, dkv = _model_roofs(drafter, place(drafter, devices, drafter_gpu_layers), context, 1,
                                        type_k, type_v, "drafter")
        # Draft steps run one after another, each streaming the drafter's weights again.
        for p in d_parts:
            parts.append(RoofTime(p.device, p.phase, p.bytes * draft_steps, p.flops * draft_steps,
                                  p.memory_seconds * draft_steps, p.compute_seconds * draft_steps))
        drafter_bytes = (dw + dkv) * draft_steps
        flops += sum(p.flops for p in d_parts) * draft_steps
    steps = draft_steps if drafter is not None else 0
    return PassEstimate(tokens, steps, context, w, kv, drafter_bytes, flops, tuple(parts),
                        network_seconds * (1 + steps))


def ceiling(
    target: ModelShape, devices: Sequence[Device], context: int, *, type_k: str = "f16",
    type_v: str | None = None, n_gpu_layers: int = -1,
) -> PassEstimate:
    """Plain decoding's ceiling at this context (one token per pass): what the dashboard plots."""
    return estimate_pass(target, devices, context, type_k=type_k, type_v=type_v, n_gpu_layers=n_gpu_layers)


@dataclass(frozen=True)
class CeilingModel:
    """A loaded model's ceiling as a function of context: built once, asked on every stats update."""

    target: ModelShape
    devices: tuple[Device, ...]
    type_k: str = "f16"
    type_v: str | None = None
    n_gpu_layers: int = -1
    drafter: ModelShape | None = None
    drafter_gpu_layers: int = -1
    network_seconds: float = 0.0  # per decode: the RPC servers' round trips measured at load

    def plain(self, context: int) -> PassEstimate:
        """Plain decoding at this context (one token per pass)."""
        return estimate_pass(self.target, self.devices, context, type_k=self.type_k, type_v=self.type_v,
                             n_gpu_layers=self.n_gpu_layers, network_seconds=self.network_seconds)

    def speculative(self, context: int, k: int, *, with_drafter: bool = True) -> PassEstimate:
        """A verify pass of k + 1 tokens after k drafter steps (n-gram drafting: with_drafter=False)."""
        drafter = self.drafter if with_drafter else None
        return estimate_pass(self.target, self.devices, context, tokens=k + 1, type_k=self.type_k,
                             type_v=self.type_v, n_gpu_layers=self.n_gpu_layers, drafter=drafter,
                             draft_steps=k, drafter_gpu_layers=self.drafter_gpu_layers,
                             network_seconds=self.network_seconds)
