"""llama.cpp objects are freed after everything that borrows them, whatever order they are dropped in.

Each case runs tests/lifetime_child.py in a child process, so a crash fails that case and not the suite,
with glibc's MALLOC_PERTURB_ and PYTHONMALLOC=malloc: freed memory is overwritten at once, so a use after
free reads garbage on every CPU instead of the old contents on some.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref
from pathlib import Path

import pytest

from app.engine.native import Native, own
from app.errors import EngineLoadError
from tests.gguf_fixtures import write_dflash_drafter, write_eagle3_drafter, write_tiny_model

ROOT = Path(__file__).resolve().parents[2]
KINDS = ["model", "recurrent", "mtp", "eagle3", "dflash"]


@pytest.fixture(scope="module")
def lifetime_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("lifetime-models")
    write_tiny_model(d / "target.gguf", n_layer=4, name="target")
    write_tiny_model(d / "drafter.gguf", n_layer=2, perturb=0.15, name="drafter")
    write_tiny_model(d / "other-vocab.gguf", n_layer=2, vocab="bytes-alt", name="other-vocab")
    write_tiny_model(d / "mamba.gguf", arch="mamba", n_layer=2, name="mamba")
    write_tiny_model(d / "mamba-drafter.gguf", arch="mamba", n_layer=2, perturb=0.15, name="mamba-drafter")
    write_tiny_model(d / "mtp.gguf", arch="qwen35", n_layer=4, mtp_layers=1, name="mtp")
    write_eagle3_drafter(d / "eagle3.gguf")
    write_dflash_drafter(d / "dflash.gguf", block_size=4)
    return d


def run_child(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONMALLOC="malloc", MALLOC_PERTURB_="165", PYTHONFAULTHANDLER="1")
    return subprocess.run([sys.executable, "-m", "tests.lifetime_child", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def check(result: subprocess.CompletedProcess[str]) -> None:
    lines = result.stdout.splitlines()
    assert result.returncode == 0, (f"exit {result.returncode} in {lines[-1] if lines else 'setup'}\n"
                                    f"{result.stderr[-3000:]}")
    assert lines, result.stderr[-3000:]
    assert lines[-1].startswith("all "), result.stdout[-2000:]
    assert lines[-1].endswith(" scenarios done"), result.stdout[-2000:]


@pytest.mark.parametrize("kind", KINDS)
def test_a_target_and_its_drafter_dropped_in_every_order(lifetime_models: Path, kind: str) -> None:
    """Closed by hand, dropped, dropped in cycles of their own or in one cycle, half closed and half dropped:
    each in every order (tests/lifetime_child.py, SCENARIOS); a crash names the scenario it happened in."""
    check(run_child(kind, str(lifetime_models)))


def test_a_load_that_fails_after_the_drafter_context_exists_frees_everything(lifetime_models: Path) -> None:
    check(run_child("failed-load", str(lifetime_models)))


# --- the ownership order itself, without llama.cpp ------------------------------------------------


class Holder:
    def __init__(self, native: Native) -> None:
        self.native = own(self, native)


def natives(freed: list[str]) -> tuple[Native, Native, Native, Native]:
    """model <- ctx <- draft ctx (which also borrows the draft model), as a DFlash drafter has them."""
    def free(name: str) -> Native:
        return lambda _ptr: freed.append(name)  # type: ignore[return-value]

    model = Native(1, free("model"), "model")  # type: ignore[arg-type]
    draft_model = Native(2, free("draft model"), "draft model")  # type: ignore[arg-type]
    ctx = Native(3, free("ctx"), "ctx", (model,))  # type: ignore[arg-type]
    draft_ctx = Native(4, free("draft ctx"), "draft ctx", (draft_model, ctx))  # type: ignore[arg-type]
    return model, draft_model, ctx, draft_ctx


@pytest.mark.parametrize("first", ["model", "draft model", "ctx", "draft ctx"])
def test_closing_any_object_closes_its_borrowers_first_and_each_once(first: str) -> None:
    freed: list[str] = []
    pieces = dict(zip(["model", "draft model", "ctx", "draft ctx"], natives(freed), strict=True))
    pieces[first].close()
    for native in pieces.values():
        native.close()
    assert sorted(freed) == sorted(pieces)  # each freed once
    assert freed.index("draft ctx") < freed.index("ctx") < freed.index("model")
    assert freed.index("draft ctx") < freed.index("draft model")


def test_the_collector_frees_in_borrowing_order_whatever_order_it_finalizes_in() -> None:
    freed: list[str] = []
    holders = [Holder(n) for n in natives(freed)]
    for holder in holders:  # every holder in one cycle, newest last: the collector's own order decides
        holder.cycle = holders  # type: ignore[attr-defined]
    alive = [weakref.ref(h) for h in holders]
    del holders, holder
    gc.collect()
    assert all(ref() is None for ref in alive)
    assert freed.index("draft ctx") < freed.index("ctx") < freed.index("model")
    assert freed.index("draft ctx") < freed.index("draft model")


def test_a_closed_object_says_so_instead_of_handing_out_a_freed_pointer() -> None:
    freed: list[str] = []
    model, _, ctx, _ = natives(freed)
    model.close()
    with pytest.raises(EngineLoadError, match="already closed"):
        ctx.get()
    with pytest.raises(EngineLoadError, match="already closed"):
        Native(5, lambda _ptr: None, "late ctx", (model,))


# --- a crash in the suite ---------------------------------------------------------------------------


def test_a_crash_fails_its_test_by_name_and_the_run_reaches_its_summary(pytester: pytest.Pytester) -> None:
    from bootstrap import PYTEST_ISOLATION

    pytester.makepyfile(test_crashes="""
        import ctypes

        def test_before():
            pass

        def test_segfault():
            ctypes.string_at(0)  # reads address 0: SIGSEGV

        def test_after():
            pass
    """)
    result = pytester.runpytest_subprocess(*PYTEST_ISOLATION, "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*crashed while running*test_crashes.py::test_segfault*"])
    result.assert_outcomes(passed=2, failed=1)
