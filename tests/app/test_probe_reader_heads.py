"""EAGLE-3 and DFlash heads whose own file llama.cpp refuses (a key it requires missing, of another type or out of
range; an ``fc`` of the wrong shape): `specdeck models --target` no longer says "fits" for them but gives the reason
the load gives, in the same sentence, from the one header check both use (``app.library.heads``).

The heads are tiny real GGUF files: the fixtures' heads (tests/gguf_fixtures.py), copied with one key dropped or
replaced. Each refusal is pinned to llama.cpp's own: the load of every such file fails (or, for the mask token,
llama.cpp loads no mask), so what the listing says is what the load does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.engine.llama import Model, init_backend
from app.engine.session import EngineSession
from app.errors import EngineLoadError, IncompatibleDrafterError, ModelFileError
from app.library.gguf_reader import read_gguf_info
from app.library.heads import head_file_refusal, head_refusal
from app.library.model_file import check_model_file
from app.params import DraftSettings, LoadSettings
from tests.gguf_fixtures import save, write_dflash_drafter, write_eagle3_drafter, write_tiny_model

ROOT = Path(__file__).resolve().parents[2]


def rewritten(src: Path, dst: Path, drop: tuple[str, ...] = (), **keys: tuple[Any, str, str | None]) -> Path:
    """A copy of the GGUF ``src`` with the keys ``drop`` left out and ``keys`` (key with "__" for ".": value, GGUF
    value type name, element type name for arrays) set, its tensors unchanged."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    extra = {k.replace("__", "."): v for k, v in keys.items()}
    reader = GGUFReader(src)
    writer = GGUFWriter(dst, reader.fields["general.architecture"].contents())
    for name, fld in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in drop or name in extra:
            continue
        vtype = fld.types[0]
        writer.add_key_value(name, fld.contents(), vtype, fld.types[-1] if vtype == GGUFValueType.ARRAY else None)
    for name, (value, vtype, sub) in extra.items():
        writer.add_key_value(name, value, GGUFValueType[vtype], GGUFValueType[sub] if sub else None)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.array(tensor.data))
    save(writer)
    return dst


# name -> (the fixture head it is copied from, keys dropped, keys set, words of the refusal)
BROKEN: dict[str, tuple[str, tuple[str, ...], dict[str, tuple[Any, str, str | None]], str]] = {
    "e3-no-layers": ("eagle3", ("eagle3.target_layers",), {}, "its eagle3.target_layers key (the target layers "
                                                              "it reads) is missing"),
    "e3-two-layers": ("eagle3", (), {"eagle3__target_layers": ([1, 2], "ARRAY", "INT32")},
                      "lists 2 layers, but llama.cpp's EAGLE-3 reads exactly 3"),
    "e3-four-layers": ("eagle3", (), {"eagle3__target_layers": ([0, 1, 2, 3], "ARRAY", "UINT32")},
                       "lists 4 layers, but llama.cpp's EAGLE-3 reads exactly 3"),
    "e3-float-layers": ("eagle3", (), {"eagle3__target_layers": ([1.0, 2.0, 3.0], "ARRAY", "FLOAT32")},
                        "is an array of float32, but llama.cpp reads layer ids only as int32 or uint32"),
    "e3-u64-layers": ("eagle3", (), {"eagle3__target_layers": ([1, 2, 3], "ARRAY", "UINT64")},
                      "is an array of uint64"),
    "e3-no-width": ("eagle3", ("eagle3.target_hidden_size",), {}, "it has no eagle3.target_hidden_size key"),
    "e3-float-width": ("eagle3", (), {"eagle3__target_hidden_size": (64.0, "FLOAT32", None)},
                       "its eagle3.target_hidden_size is stored as float32, but llama.cpp reads it only as a uint32"),
    "e3-i32-width": ("eagle3", (), {"eagle3__target_hidden_size": (64, "INT32", None)}, "is stored as int32"),
    "df-no-mask": ("dflash", ("tokenizer.ggml.mask_token_id",), {}, "it has no tokenizer.ggml.mask_token_id key"),
    "df-mask-out-of-range": ("dflash", (), {"tokenizer__ggml__mask_token_id": (269, "UINT32", None)},
                             "its mask token 269 is outside its vocabulary of 269 tokens"),
    "df-i32-mask": ("dflash", (), {"tokenizer__ggml__mask_token_id": (268, "INT32", None)},
                    "its tokenizer.ggml.mask_token_id is stored as int32"),
    "df-no-layers": ("dflash", ("dflash.target_layers",), {}, "its dflash.target_layers key (the target layers it "
                                                              "reads) is missing"),
    "df-u8-layers": ("dflash", (), {"dflash__target_layers": ([1, 3], "ARRAY", "UINT8")}, "is an array of uint8"),
    "df-three-layers": ("dflash", (), {"dflash__target_layers": ([0, 1, 3], "ARRAY", "INT32")},
                        "its fc.weight is 128 × 64, where its 3 target layers of width 64 call for 192 × 64"),
}
# Out-of-range layer ids: the files load; the pairing with this 4-layer target is refused.
OUT_OF_RANGE = {
    "e3-layer-4": ("eagle3", {"eagle3__target_layers": ([1, 2, 4], "ARRAY", "INT32")}, "[1, 2, 4]"),
    "e3-layer-minus-1": ("eagle3", {"eagle3__target_layers": ([-1, 2, 3], "ARRAY", "INT32")}, "[-1, 2, 3]"),
    "df-layer-4": ("dflash", {"dflash__target_layers": ([1, 4], "ARRAY", "INT32")}, "[1, 4]"),
    "df-layer-2-to-the-32": ("dflash", {"dflash__target_layers": ([1, (1 << 32) - 1], "ARRAY", "UINT32")},
                             "[1, 4294967295]"),
}


@pytest.fixture(scope="module")
def heads(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("heads")
    base = {"eagle3": write_eagle3_drafter(d / "fitting-eagle3.gguf"),
            "dflash": write_dflash_drafter(d / "fitting-dflash.gguf")}
    out = {"target": write_tiny_model(d / "target.gguf", n_layer=4, name="target"), **base}
    for name, (head, drop, keys, _) in BROKEN.items():
        out[name] = rewritten(base[head], d / f"{name}.gguf", drop, **keys)
    for name, (head, keys, _) in OUT_OF_RANGE.items():
        out[name] = rewritten(base[head], d / f"{name}.gguf", **keys)
    return out


@pytest.fixture(scope="module")
def listing(heads: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    env = dict(os.environ, SPECDECK_HOME=str(tmp_path_factory.mktemp("home")))
    cmd = [sys.executable, "-m", "app", "models", "--folder", str(heads["target"].parent), "--target",
           str(heads["target"])]
    runs = [subprocess.run([*cmd, *extra], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
            for extra in (["--json"], [])]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
        assert "Traceback" not in run.stderr
    return json.loads(runs[0].stdout), runs[1].stdout


def _offers(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {Path(h["path"]).stem: h for h in doc["heads"] if h["path"]}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_models_says_why_a_head_llama_cpp_will_not_load_cannot_draft(listing: tuple[dict[str, Any], str],
                                                                      heads: dict[str, Path], name: str) -> None:
    doc, text = listing
    offer = _offers(doc)[name]
    words = BROKEN[name][3]
    assert not offer["fits"]
    assert offer["reason"] == f"{name}.gguf cannot draft: {offer['reason'].split(': ', 1)[1]}"
    assert words in offer["reason"]
    assert "\n" not in offer["reason"]
    assert offer["reason"].endswith(".")
    line = next(ln for ln in text.split("Trained heads for it", 1)[1].splitlines() if f"{name}.gguf" in ln)
    assert f"{name}.gguf cannot draft: " in line
    assert not line.endswith(": fits")


@pytest.mark.parametrize("name", sorted(OUT_OF_RANGE))
def test_models_says_a_head_reading_layers_the_target_lacks_cannot_draft(listing: tuple[dict[str, Any], str],
                                                                         name: str) -> None:
    offer = _offers(listing[0])[name]
    assert not offer["fits"]
    assert offer["reason"] == f"{name}.gguf reads target layers {OUT_OF_RANGE[name][2]}, but target.gguf has " \
                              "layers 0 to 3."


def test_the_fitting_heads_still_fit(listing: tuple[dict[str, Any], str]) -> None:
    offers = _offers(listing[0])
    assert offers["fitting-eagle3"]["fits"]
    assert offers["fitting-dflash"]["fits"]
    assert offers["fitting-eagle3"]["reason"] is None
    models = {Path(m["path"]).stem: m for m in listing[0]["models"]}
    assert all(models[name]["error"] is None for name in BROKEN)  # listed as files, as before


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_the_load_refuses_it_before_llama_cpp_in_the_listings_sentence(heads: dict[str, Path], name: str) -> None:
    """check_model_file (the check every load goes through, the session's first step) gives the listing's
    sentence, where llama.cpp would fail with no reason."""
    reason = head_refusal(read_gguf_info(heads["target"]), read_gguf_info(heads[name]))
    assert reason is not None
    assert head_file_refusal(read_gguf_info(heads[name])) == reason
    with pytest.raises(ModelFileError) as caught:
        check_model_file(heads[name], "drafter")
    assert str(caught.value) == reason


@pytest.mark.parametrize("name", ["e3-no-width", "e3-two-layers", "df-no-mask", "df-three-layers"])
def test_a_session_with_such_a_head_is_refused_in_that_sentence(heads: dict[str, Path], name: str) -> None:
    settings = LoadSettings(target_path=str(heads["target"]), n_ctx=256, n_batch=64, n_threads=1,
                            draft=DraftSettings(drafter_path=str(heads[name])))
    with pytest.raises(ModelFileError) as caught:
        EngineSession(settings.validate()).close()
    assert str(caught.value) == head_file_refusal(read_gguf_info(heads[name]))


@pytest.mark.parametrize("name", ["e3-layer-4", "df-layer-4"])
def test_a_session_with_a_head_reading_missing_layers_is_refused_in_the_listings_sentence(
        heads: dict[str, Path], name: str) -> None:
    settings = LoadSettings(target_path=str(heads["target"]), n_ctx=256, n_batch=64, n_threads=1,
                            draft=DraftSettings(drafter_path=str(heads[name])))
    with pytest.raises(IncompatibleDrafterError) as caught:
        EngineSession(settings.validate()).close()
    assert str(caught.value) == head_refusal(read_gguf_info(heads["target"]), read_gguf_info(heads[name]))


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_llama_cpp_itself_refuses_each_of_these_files(heads: dict[str, Path], name: str) -> None:
    """The header check claims nothing llama.cpp does not: each file fails its load, or loads without a mask."""
    import llama_cpp as lc

    init_backend(None)
    try:
        model = Model(heads[name], n_gpu_layers=0)
    except EngineLoadError:
        return
    try:
        assert name.startswith("df-"), f"llama.cpp loaded {name}"
        assert "mask" in name, f"llama.cpp loaded {name}"
        assert int(lc.llama_vocab_mask(lc.llama_model_get_vocab(model._ptr))) < 0
    finally:
        model.close()
