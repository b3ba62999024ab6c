"""Shared fixtures: tiny GGUF models written once per session, the demo models, a scratch SPECDECK_HOME."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.gguf_fixtures import write_tiny_model

pytest_plugins = ["tests.logfail", "pytester"]

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def _scratch_home() -> None:
    """Every test, and every process a test starts, keeps its config, measurements and logs in a scratch
    SPECDECK_HOME: what one run measured for a temporary path must not reach a later run whose temporary
    folders have the same names, nor the user's own data. The models folder stays the real one."""
    from app.paths import models_dir

    os.environ["SPECDECK_MODELS_DIR"] = str(models_dir())
    home = tempfile.mkdtemp(prefix="specdeck-tests-")
    os.environ["SPECDECK_HOME"] = home
    atexit.register(shutil.rmtree, home, ignore_errors=True)


_scratch_home()

# Relative noise of the perturbed drafter. Measured with seed 0: greedy agreement with the target is about
# 50 % per position on short English/code/chat prompts (0.1 gives ~65 %, 0.2 ~45 %, 0.3 ~30 %).
PERTURBED_DRAFTER_SCALE = 0.15


@pytest.fixture(scope="session")
def tiny_models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny-models")


@pytest.fixture(scope="session")
def tiny_target(tiny_models_dir: Path) -> Path:
    """A 269-token byte-level BPE llama model (seed 0)."""
    return write_tiny_model(tiny_models_dir / "tiny-target.gguf", name="tiny-target")


@pytest.fixture(scope="session")
def tiny_drafter_same(tiny_models_dir: Path) -> Path:
    """Same seed, no noise: weights identical to `tiny_target`'s, so greedy acceptance is 1."""
    return write_tiny_model(tiny_models_dir / "tiny-drafter-same.gguf", name="tiny-drafter-same")


@pytest.fixture(scope="session")
def tiny_drafter_perturbed(tiny_models_dir: Path) -> Path:
    """`tiny_target`'s weights plus noise: a drafter that agrees with the target about half the time."""
    return write_tiny_model(
        tiny_models_dir / "tiny-drafter-perturbed.gguf", perturb=PERTURBED_DRAFTER_SCALE, perturb_seed=1,
        name="tiny-drafter-perturbed",
    )


@pytest.fixture(scope="session")
def tiny_drafter_other_vocab(tiny_models_dir: Path) -> Path:
    """Same size and weights as `tiny_target`, but one token text differs (id 268): fails the vocab check."""
    return write_tiny_model(
        tiny_models_dir / "tiny-drafter-other-vocab.gguf", vocab="bytes-alt", name="tiny-drafter-other-vocab"
    )


@pytest.fixture
def tiny_model_factory(tmp_path: Path) -> Callable[..., Path]:
    """`make(filename=None, **kwargs) -> Path`: write_tiny_model(**kwargs) into this test's tmp dir."""
    counter = 0

    def make(filename: str | None = None, **kwargs: Any) -> Path:
        nonlocal counter
        counter += 1
        folder = tmp_path / "tiny-models"
        return write_tiny_model(folder / (filename or f"tiny-{counter}.gguf"), **kwargs)

    return make


@pytest.fixture(scope="session")
def demo_models() -> tuple[Path, Path]:
    """(smollm2_path, gemma_path), installing the demo models first if missing (a no-op when present)."""
    from app.library.demo_install import install_demo_models

    paths = install_demo_models()
    smollm2 = next(p for p in paths if "smollm2" in p.name.lower())
    gemma = next(p for p in paths if "gemma" in p.name.lower())
    return smollm2, gemma


@pytest.fixture
def specdeck_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point SPECDECK_HOME (config, data, logs, cache) at a scratch folder; models stay in the real folder."""
    from app.paths import models_dir

    real_models = models_dir()
    home = tmp_path / "specdeck-home"
    home.mkdir()
    monkeypatch.setenv("SPECDECK_MODELS_DIR", str(real_models))
    monkeypatch.setenv("SPECDECK_HOME", str(home))
    return home



# Markers from the fixtures a test uses (directly or through other fixtures), so that `-m "not window and ..."`
# (`bootstrap.py test --fast`) leaves out what starts a window, a process or a server. A test that starts one
# by itself carries the marker explicitly.
WINDOW_FIXTURES = {"qtbot", "qapp", "make_window"}
PROCESS_FIXTURES = {
    "client",  # an EngineClient: the engine worker process (test_bad_input, test_engine_worker, rpc)
    "cli_run", "report",  # `specdeck tune` and `specdeck bench` as subprocesses (test_tune, test_engine_bench)
    "chat_factory",  # `specdeck chat` as a subprocess (test_terminal_chat)
    "probe_cache",  # the CPU probe, measured in a child process
    "rpc_servers",
}
SERVER_FIXTURES = {
    "served", "oai", "claude", "family_server", "plain_server",  # `specdeck serve`: HTTP and its engine worker
    "http_server", "vllm_like", "dying_server", "hub",  # HTTP servers in threads (hub: tests.hub_lookalike)
    "llama_server", "llama_server_plain",  # llama.cpp's llama-server process
}

# Tests that took 10 s or more each in the fast subset (statistical sampling checks, every drop order of every
# drafter kind): marked slow here, by function name, so that `--fast` stays a few minutes.
SLOW_TESTS = {
    "test_ngram_drafter_is_lossless", "test_model_drafter_is_lossless",
    "test_model_drafter_is_lossless_with_every_filter_and_penalties", "test_target_alone_fits_its_exact_distribution",
    "test_broken_acceptance_rule_is_detected",  # test_engine_sampling
    "test_sampled_block_drafts_keep_the_target_distribution",  # test_dflash
    "test_sampled_eagle3_drafts_keep_the_target_distribution",  # test_eagle3
    "test_sampled_mtp_drafts_keep_the_target_distribution",  # test_mtp
    "test_a_target_and_its_drafter_dropped_in_every_order",  # test_lifetimes
    "test_sampled_speculation_keeps_the_target_distribution",  # test_recurrent: 22-52 s each
    "test_speculation_keeps_the_adjusted_distribution",  # test_sampling_contract: about 10 s each
    "test_a_measuring_read_probes_again_and_replaces_the_cache",  # test_probe_reader_cache: a probe each, 4 s
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & WINDOW_FIXTURES:
            item.add_marker(pytest.mark.window)
        if used & PROCESS_FIXTURES:
            item.add_marker(pytest.mark.process)
        if used & SERVER_FIXTURES:
            item.add_marker(pytest.mark.server)
        if "demo_models" in used:
            item.add_marker(pytest.mark.demo)
        if getattr(item, "originalname", None) in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
