"""The picker's fit estimate comes from the ceiling package without measuring the CPU: a fit needs free
memory, not rates, so asking it on every change of a setting costs no probe."""

from __future__ import annotations

from pathlib import Path

from app.ceiling.builder import pair_fit
from app.ceiling.cpu import PROBE_CACHE_FILE
from app.ceiling.fit import fit_estimate
from app.ceiling.roofline import Device, ModelShape
from app.library.gguf_reader import read_gguf_info
from app.paths import cache_dir


def test_pair_fit_measures_nothing_and_counts_both_models(specdeck_home: Path, tiny_target: Path,
                                                          tiny_drafter_same: Path) -> None:
    target, drafter = read_gguf_info(tiny_target), read_gguf_info(tiny_drafter_same)
    alone = pair_fit(target, None, 2048, n_gpu_layers=0)
    both = pair_fit(target, drafter, 2048, n_gpu_layers=0)
    assert not (cache_dir() / PROBE_CACHE_FILE).exists()  # a probe writes its cache: none was taken
    assert [d.device for d in alone.devices] == ["cpu"]
    assert alone.devices[0].free is not None  # this machine's free memory
    assert alone.fits
    assert both.devices[0].weights > alone.devices[0].weights
    assert both.devices[0].kv > alone.devices[0].kv
    # The same estimate as the roofline's own, for the same device.
    cpu = Device("cpu", "cpu", "cpu", 1.0, free_bytes=alone.devices[0].free)
    direct = fit_estimate(ModelShape.from_gguf(target), [cpu], 2048, n_gpu_layers=0)
    assert (direct.devices[0].weights, direct.devices[0].kv, direct.devices[0].compute) == (
        alone.devices[0].weights, alone.devices[0].kv, alone.devices[0].compute)
