"""Before a download: does a quant fit this machine at the chosen context, and how fast would plain decoding
be. The remote headers feed the same fit and roofline as `specdeck doctor` (``app.ceiling``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from app.ceiling.builder import ceiling_model, pair_fit
from app.ceiling.roofline import Device
from app.errors import AppError
from app.hub.files import ModelFiles
from app.hub.remote_header import read_remote_info
from app.library.gguf_reader import GGUFInfo

DEFAULT_CTX = 4096


@dataclass(frozen=True)
class QuantVerdict:
    group: ModelFiles
    info: GGUFInfo | None
    ctx: int
    fits: bool | None  # None: the header could not be read
    fit_message: str
    tokens_per_second: float | None
    error: str = ""


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
        speed = ceiling_model(info, devices=devices).plain(n_ctx).tokens_per_second
    except ValueError as exc:
        return QuantVerdict(group, info, n_ctx, None, "", None, f"no estimate: {exc}")
    return QuantVerdict(group, info, n_ctx, fit.fits, fit.message, speed)
