"""Counts a GGUF header claims (layers, experts, vocabulary, shape values) are checked against llama.cpp's own
bounds before anything is sized from them: a 1 MB file claiming 2^31 layers is refused in one sentence, with the
reader's MalformedError, within a small address space and in well under a minute, and the library lists the
files beside it as before.

The claims are made in real GGUF files written with the gguf package; every read that could exhaust memory runs
in a child process capped with RLIMIT_AS, so the test process is never at risk.
"""

from __future__ import annotations

import json
import os
import resource
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.library.gguf_format import LimitError, MalformedError
from app.library.gguf_reader import MAX_LAYERS, read_gguf_info, read_token_texts
from tests.gguf_fixtures import write_small_gguf, write_tiny_model

ROOT = Path(__file__).resolve().parents[2]
READER_LIMIT = 2 << 30  # address space of the child that reads one header
CLI_LIMIT = 4 << 30  # `specdeck models` (numpy, llama.cpp's libraries and their threads reserve more)
TIMEOUT_S = 120

READ_ONE = """
import sys
from app.library.gguf_format import GGUFError
from app.library.gguf_reader import read_gguf_info
try:
    info = read_gguf_info(sys.argv[1])
except GGUFError as exc:
    print(f"{type(exc).__name__}: {exc}")
else:
    print(f"read: {info.n_layer} layers")
"""


def _limited(limit: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return apply


def run_capped(args: list[str], limit: int, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python args`` in a child whose address space is capped at ``limit`` bytes, killed after TIMEOUT_S."""
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S,
                          preexec_fn=_limited(limit), env=env)


def read_capped(path: Path) -> str:
    proc = run_capped(["-c", READ_ONE, str(path)], READER_LIMIT)
    assert proc.returncode == 0, f"the reader failed (rc {proc.returncode}): {proc.stderr[-1500:]}"
    return proc.stdout.strip()


def claiming(path: Path, arch: str, **keys: tuple[str, int]) -> Path:
    """A small real GGUF of ``arch`` whose ``{arch}.<key>`` hyperparameters are the given (writer, value)."""
    def prepare(w: Any) -> None:
        w.add_uint32(f"{arch}.embedding_length", 64)
        w.add_uint32(f"{arch}.attention.head_count", 4)
        w.add_uint32(f"{arch}.attention.sliding_window", 512)
        for key, (kind, value) in keys.items():
            getattr(w, f"add_{kind}")(f"{arch}.{key.replace('__', '.')}", value)
    return write_small_gguf(path, arch, prepare)


@pytest.mark.parametrize("arch", ["llama", "gemma3", "mamba", "qwen35", "falcon-h1"])
@pytest.mark.parametrize(("kind", "n_layer"), [("uint32", 1 << 31), ("uint32", 1 << 28), ("uint64", 1 << 40)])
def test_a_fake_layer_count_is_refused_before_any_per_layer_table(tmp_path: Path, arch: str, kind: str,
                                                                  n_layer: int) -> None:
    path = claiming(tmp_path / "fake-layers.gguf", arch, block_count=(kind, n_layer))
    assert path.stat().st_size < 1 << 20
    line = read_capped(path)
    assert line.startswith("MalformedError: "), line
    assert f"claims {n_layer:,} layers (2^{n_layer.bit_length() - 1})" in line
    assert f"at most {MAX_LAYERS}" in line
    assert line.endswith(".")
    assert ". " not in line  # one sentence


def test_the_refusal_is_the_readers_own_error_in_one_sentence(tmp_path: Path) -> None:
    path = claiming(tmp_path / "fake-layers.gguf", "llama", block_count=("uint32", MAX_LAYERS + 1))
    with pytest.raises(MalformedError, match=r"^fake-layers\.gguf is corrupt: it claims 513 layers; llama\.cpp "
                                             r"loads at most 512\.$") as caught:
        read_gguf_info(path)
    assert caught.value.path == str(path)


def test_the_largest_layer_count_llama_cpp_loads_is_read(tmp_path: Path) -> None:
    info = read_gguf_info(claiming(tmp_path / "deep.gguf", "gemma3", block_count=("uint32", MAX_LAYERS)))
    assert info.n_layer == MAX_LAYERS
    assert len(info.swa_layers) == MAX_LAYERS
    assert info.swa_layers == tuple(il % 6 < 5 for il in range(MAX_LAYERS))  # gemma3's period of 6


@pytest.mark.parametrize(("keys", "words"), [
    ({"expert_count": ("uint32", 1 << 31), "expert_used_count": ("uint32", 8)}, "claims 2,147,483,648 experts"),
    ({"expert_count": ("uint32", 1025), "expert_used_count": ("uint32", 8)}, "claims 1,025 experts"),
    ({"expert_count": ("uint32", 8), "expert_used_count": ("uint32", 9)}, "routes each token to 9 of its 8"),
    ({"expert_count": ("uint32", 8)}, "routes each token to 0 of its 8"),
    ({"expert_used_count": ("uint32", 2)}, "routes each token to 2 of its 0"),
    ({"vocab_size": ("uint32", 1 << 31)}, "a vocabulary of 2,147,483,648 tokens (2^31)"),
    ({"context_length": ("uint64", 1 << 40)}, "llama.context_length is 1,099,511,627,776 (2^40)"),
    ({"attention__head_count_kv": ("uint64", 1 << 33)}, "llama.attention.head_count_kv is 8,589,934,592"),
    ({"nextn_predict_layers": ("uint32", 1 << 31), "block_count": ("uint32", 4)}, "MTP layers of 4"),
])
def test_other_impossible_counts_are_refused_in_one_sentence(tmp_path: Path, keys: dict[str, tuple[str, int]],
                                                             words: str) -> None:
    """llama.cpp aborts the process on the expert counts (GGML_ASSERT) and reads the others as uint32."""
    keys = {"block_count": ("uint32", 2), **keys}
    line = read_capped(claiming(tmp_path / "odd.gguf", "llama", **keys))
    assert line.startswith("MalformedError: odd.gguf is corrupt: "), line
    assert words in line
    assert line.endswith(".")


def test_a_real_mixture_of_experts_header_is_read(tmp_path: Path) -> None:
    info = read_gguf_info(claiming(tmp_path / "moe.gguf", "llama", block_count=("uint32", 2),
                                   expert_count=("uint32", 1024), expert_used_count=("uint32", 8)))
    assert info.n_layer == 2


def test_models_lists_the_fake_file_as_unusable_and_keeps_the_others(tmp_path: Path) -> None:
    """`specdeck models --folder`: the file claiming 2^31 layers is listed with its reason, the real model beside
    it as before, in a capped address space (it grew past 23 GB)."""
    folder = tmp_path / "models"
    claiming(folder / "fake-layers.gguf", "llama", block_count=("uint32", 1 << 31))
    write_tiny_model(folder / "real.gguf", name="real")
    env = dict(os.environ, SPECDECK_HOME=str(tmp_path / "home"))
    for _ in range(2):  # the second run reads the header cache the first one wrote
        proc = run_capped(["-m", "app", "models", "--folder", str(folder), "--json"], CLI_LIMIT, env)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr
        by_name = {Path(m["path"]).name: m for m in json.loads(proc.stdout)["models"]}
        assert by_name["real.gguf"]["error"] is None
        assert by_name["real.gguf"]["n_layer"] == 2
        fake = by_name["fake-layers.gguf"]
        assert fake["error_type"] == "MalformedError"
        assert "claims 2,147,483,648 layers (2^31)" in fake["error"]
        assert "\n" not in fake["error"]


def test_token_texts_read_into_memory_are_bounded(tmp_path: Path) -> None:
    """read_token_texts keeps every text it reads: six 16 MB token texts are refused, not held (96 MB)."""
    path = tmp_path / "long-tokens.gguf"

    def s(data: bytes) -> bytes:
        return struct.pack("<Q", len(data)) + data

    big = b"x" * (1 << 24)
    with path.open("wb") as fh:
        fh.write(b"GGUF" + struct.pack("<IQQ", 3, 0, 2))
        fh.write(s(b"general.architecture") + struct.pack("<I", 8) + s(b"llama"))
        fh.write(s(b"tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 6))
        for i in range(6):
            fh.write(s(big[:-1] + bytes([65 + i])))
    with pytest.raises(LimitError, match=r"long-tokens\.gguf is corrupt: the texts of .* take more than "):
        read_token_texts(path)
    assert read_gguf_info(path).n_vocab == 6  # the walk that only hashes them reads nothing into memory
