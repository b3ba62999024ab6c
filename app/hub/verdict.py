"""Before a download: does a quant fit this machine at the chosen context, and how fast would plain decoding
be. The remote headers feed the same fit and roofline as `specdeck doctor` (``app.ceiling``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from app.ceiling.builder import ceiling_model, pair_fit
from app.ceiling.roofline import Device
from app.errors import AppError
from app.hub.efficiency import MeasuredEfficiency, efficiency_for
from app.hub.files import ModelFiles
from app.hub.remote_header import read_remote_info
from app.library.gguf_reader import GGUFInfo

DEFAULT_CTX = 4096
CEILING_ONLY = "the ceiling; run specdeck doctor --decode-check to measure this machine"


@dataclass(frozen=True)
class QuantVerdict:
    group: ModelFiles
    info: GGUFInfo | None
    ctx: int
    fits: bool | None  # None: the header could not be read
    fit_message: str
    tokens_per_second: float | None  # the prediction: the ceiling times the measured efficiency when there is one
    error: str = ""
    ceiling_tokens_per_second: float | None = None  # the roofline's alone
    efficiency: MeasuredEfficiency | None = None  # what the prediction was scaled by

    @property
    def speed_basis(self) -> str:
        """What the predicted tok/s is, in words (the CLI and the window say the same)."""
        if self.tokens_per_second is None:
            return ""
        return self.efficiency.describe() if self.efficiency is not None else CEILING_ONLY


def model_info(repo: str, group: ModelFiles, revision: str = "main") -> GGUFInfo:
    """The first part's header, with the weights and parameters of every part of a split model."""
    first = read_remote_info(repo, group.parts[0].path, group.parts[0].size, revision)
    if len(group.parts) == 1:
        return first
    tensor_bytes, n_params = first.tensor_bytes, first.n_params
    for part in group.parts[1:]:
        info = read_remote_info(repo, part.path, part.size, revision)
        tensor_bytes += info.tensor_bytes
        n_params += info.n_params
    return replace(first, tensor_bytes=tensor_bytes, n_params=n_params)


def judge(repo: str, group: ModelFiles, devices: Sequence[Device], ctx: int | None = None,
          revision: str = "main") -> QuantVerdict:
    """The verdict for one model group; a header that cannot be read gives a verdict with its reason."""
    try:
        info = model_info(repo, group, revision)
    except AppError as exc:
        return QuantVerdict(group, None, ctx or DEFAULT_CTX, None, "", None, str(exc))
    n_ctx = ctx or min(DEFAULT_CTX, info.context_length or DEFAULT_CTX)
    try:
        fit = pair_fit(info, None, n_ctx, devices=devices)
        plain = ceiling_model(info, devices=devices).plain(n_ctx)
    except ValueError as exc:
        return QuantVerdict(group, info, n_ctx, None, "", None, f"no estimate: {exc}")
    ceiling = plain.tokens_per_second
    measured = _measured(devices, plain.binding_device)
    speed = ceiling * measured.efficiency if measured is not None else ceiling
    return QuantVerdict(group, info, n_ctx, fit.fits, fit.message, speed, "", ceiling, measured)


def _measured(devices: Sequence[Device], binding: str) -> MeasuredEfficiency | None:
    """Doctor's measurement for the device that bounds this quant's pass; a store that cannot be read is
    no measurement (the prediction falls back to the ceiling and says so)."""
    device = next((d for d in devices if d.key == binding), None)
    if device is None:
        return None
    try:
        return efficiency_for(device)
    except (OSError, ValueError):
        return None
