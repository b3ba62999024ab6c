"""Build a target with a drafter, then drop or close the pieces in every order; run in a child process.

    python -m tests.lifetime_child KIND MODELS_DIR [SCENARIO]

KIND names a drafter (``model``, ``recurrent``, ``mtp``, ``eagle3``, ``dflash``) or ``failed-load``; SCENARIO
one of ``SCENARIOS`` (all of them by default). Each
scenario prints its name before it runs, so a crash names the scenario that caused it; the last line is
``all N scenarios done``. The parent runs it with glibc's MALLOC_PERTURB_ and PYTHONMALLOC=malloc, so a use
after free reads garbage and faults on every CPU.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from app.engine.dflash import DFlashContext, DFlashDrafter, block_size, check_dflash_pairing, is_dspark
from app.engine.drafters import ModelDrafter
from app.engine.eagle3 import Eagle3Context, Eagle3Drafter, check_eagle3_pairing
from app.engine.grammar import GrammarMask
from app.engine.llama import Context, ContextParams, Model, init_backend
from app.engine.mtp import MTPContext, MTPDrafter
from app.engine.speculative import SpeculativeDecoder
from app.errors import AppError
from app.library.gguf_reader import read_gguf_info
from app.params import JSON_OBJECT, SamplingSettings

PARAMS = ContextParams(n_ctx=256, n_batch=32, n_threads=1)
PROMPT = [1, 40, 41, 42, 43, 44]


def build(kind: str, models: Path) -> dict[str, Any]:
    """The pieces, in the order they were made, after one speculative answer (the drafter's context holds
    tokens and the target's last batch is the drafter's to read)."""
    pieces: dict[str, Any] = {}
    if kind == "mtp":
        target = pieces["target"] = Model(models / "mtp.gguf", n_gpu_layers=0, load_mtp=True)
        ctx = pieces["ctx"] = Context(target, PARAMS)
        dctx = pieces["draft ctx"] = MTPContext(target, ctx, PARAMS)
        pieces["drafter"] = MTPDrafter(ctx, dctx, p_min=0.0)
    else:
        recurrent = kind == "recurrent"
        target = pieces["target"] = Model(models / ("mamba.gguf" if recurrent else "target.gguf"), n_gpu_layers=0)
        ctx = pieces["ctx"] = Context(target, PARAMS)
        head = {"model": "drafter.gguf", "recurrent": "mamba-drafter.gguf"}.get(kind, f"{kind}.gguf")
        dmodel = pieces["draft model"] = Model(models / head, n_gpu_layers=0)
        if kind == "eagle3":
            ids = check_eagle3_pairing(target, read_gguf_info(target.path), dmodel, read_gguf_info(dmodel.path))
            dctx = pieces["draft ctx"] = Eagle3Context(dmodel, ctx, PARAMS)
            pieces["drafter"] = Eagle3Drafter(ctx, dctx, ids, p_min=0.0)
        elif kind == "dflash":
            info = read_gguf_info(dmodel.path)
            ids = check_dflash_pairing(target, read_gguf_info(target.path), dmodel, info)
            dctx = pieces["draft ctx"] = DFlashContext(dmodel, ctx, PARAMS)
            pieces["drafter"] = DFlashDrafter(ctx, dctx, ids, block_size(info), dspark=is_dspark(info))
        else:
            dctx = pieces["draft ctx"] = Context(dmodel, PARAMS)
            pieces["drafter"] = ModelDrafter(dmodel, dctx, p_min=0.0)
    pieces["grammar"] = GrammarMask(target.vocab, target.n_vocab, JSON_OBJECT, target.native)
    decoder = SpeculativeDecoder(target, ctx, drafter=pieces["drafter"])
    for _ in decoder.generate(PROMPT, SamplingSettings(temperature=0.0, max_tokens=6)):
        pass
    pieces["decoder"] = decoder
    return pieces


def close(piece: Any) -> None:
    if hasattr(piece, "close"):
        piece.close()
    elif hasattr(piece, "detach"):
        piece.detach()


def use(pieces: dict[str, Any]) -> None:
    """Whatever is left after some pieces were closed: each either works or says it was closed."""
    calls: dict[str, Callable[[Any], object]] = {
        "ctx": lambda p: p.decode([40]),
        "draft ctx": lambda p: p.truncate(0),
        "target": lambda p: p.n_layer,
        "grammar": lambda p: p.mask_rows(np.zeros((1, p.n_vocab), np.float32), []),
    }
    for name, call in calls.items():
        if name in pieces:
            with contextlib.suppress(AppError):  # "... was already closed": a sentence, not a crash
                call(pieces[name])


Scenario = Callable[[dict[str, Any], tuple[str, ...]], None]


def close_in_order(pieces: dict[str, Any], order: tuple[str, ...]) -> None:
    for name in order:
        close(pieces[name])
        use(pieces)


def drop_in_order(pieces: dict[str, Any], order: tuple[str, ...]) -> None:
    for name in order:
        del pieces[name]
        gc.collect()


def drop_in_cycles(pieces: dict[str, Any], order: tuple[str, ...]) -> None:
    """Each piece in a reference cycle of its own: freed by the cyclic collector, in its order, not by
    reference counts."""
    for name in order:
        piece = pieces[name]
        piece.cycle = [piece]
    for name in order:
        del pieces[name]
        gc.collect()


def drop_all_in_one_cycle(pieces: dict[str, Any], order: tuple[str, ...]) -> None:
    held = [pieces.pop(name) for name in order]
    held.append(held)
    del held
    gc.collect()


def close_some_drop_the_rest(pieces: dict[str, Any], order: tuple[str, ...]) -> None:
    """The first half closed by hand (a fixture's or a session's close), the rest left to the collector in a
    cycle: a drafter context whose target was closed under it is freed last."""
    half = len(order) // 2
    for name in order[:half]:
        close(pieces[name])
    drop_all_in_one_cycle(pieces, order[half:])


SCENARIOS: dict[str, Scenario] = {
    "close": close_in_order, "drop": drop_in_order, "drop in cycles": drop_in_cycles,
    "one cycle": drop_all_in_one_cycle, "close some": close_some_drop_the_rest,
}


def failed_loads(models: Path) -> int:
    """Sessions whose load fails half way: after every context exists (a progress callback that raises while
    the passes are timed, as a worker's does when the app's end of the pipe is gone), or at a drafter that is
    refused after both models are loaded. The error comes out, and nothing is left open."""
    from app.engine.session import EngineSession
    from app.errors import IncompatibleDrafterError
    from app.params import DraftSettings, LoadSettings

    def progress(name: str, fraction: float) -> bool:
        if name == "timing" and fraction > 0:
            raise BrokenPipeError("the app is gone")
        return True

    cases: list[tuple[str, DraftSettings, type[BaseException]]] = [
        *((f"{head}, while timing", DraftSettings(drafter_path=str(models / head), k_max=4), BrokenPipeError)
          for head in ("drafter.gguf", "mamba-drafter.gguf", "eagle3.gguf", "dflash.gguf")),
        ("other vocabulary, refused", DraftSettings(drafter_path=str(models / "other-vocab.gguf"), k_max=4),
         IncompatibleDrafterError),
    ]
    done = 0
    for what, draft, error in cases:
        print(f"failed load: {what}", flush=True)
        settings = LoadSettings(target_path=str(models / "target.gguf"), n_ctx=256, n_gpu_layers=0, n_threads=1,
                                draft=draft)
        try:
            EngineSession(settings, progress=progress)
        except error:
            pass
        else:
            raise SystemExit(f"the load ({what}) did not fail")
        gc.collect()
        left = [o for o in gc.get_objects() if isinstance(o, Model | Context | MTPContext) and not o.native.closed]
        if left:
            raise SystemExit(f"still open after the failed load: {left}")
        done += 1
    return done


def main(kind: str, models: Path, only: str | None = None) -> None:
    init_backend(None)
    if kind == "failed-load":
        print(f"all {failed_loads(models)} scenarios done", flush=True)
        return
    # The decoder holds every piece: it goes first. The rest go in every order, the grammar sampler (which
    # borrows the target alone) at a place that moves from one order to the next.
    names = [name for name in build(kind, models) if name not in ("decoder", "grammar")]
    orders = [(*order[: i % (len(order) + 1)], "grammar", *order[i % (len(order) + 1):])
              for i, order in enumerate(itertools.permutations(names))]
    done = 0
    for scenario, run in SCENARIOS.items():
        if only is not None and scenario != only:
            continue
        for order in orders:
            print(f"{kind}: {scenario}: {', '.join(order)}", flush=True)
            pieces = build(kind, models)
            del pieces["decoder"]
            run(pieces, order)
            done += 1
    gc.collect()
    print(f"all {done} scenarios done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
