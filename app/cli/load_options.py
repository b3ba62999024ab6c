"""How to load a model, said the same way to every command (chat, bench, serve, tune, doctor): one option per
``LoadSettings`` field, with that field's own default, and llama-server's spellings as aliases.

The options take any text: a bad value is refused by ``LoadSettings.validate()`` in its own sentence, so a
command, the window and a saved setting are refused alike.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from app.engine_limits import KV_TYPES
from app.params import (
    FLASH_ATTN_MODES,
    GPU_LAYER_WORDS,
    RECURRENT_ROLLBACKS,
    DraftSettings,
    LoadSettings,
    parse_rpc_servers,
)

LOAD = LoadSettings(target_path="")  # every option's default is this field's

# LoadSettings field -> the option's name (argparse dest) and its llama-server spellings.
OPTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "n_ctx": ("ctx", ("-c", "--ctx-size")),
    "n_batch": ("batch", ("-b", "--batch-size")),
    "n_threads": ("threads", ("-t",)),
    "n_gpu_layers": ("gpu_layers", ("-ngl", "--n-gpu-layers")),
    "main_gpu": ("main_gpu", ("-mg",)),
    "kv_type": ("kv_type", ("-ctk", "--cache-type-k")),
    "flash_attn": ("flash_attn", ("-fa",)),
    "rpc_servers": ("rpc", ()),
    "recurrent_rollback": ("recurrent_rollback", ()),
}
# The fields each command sets its own way: the model with --target (doctor: --model), the drafting options.
NOT_LOAD_OPTIONS = ("target_path", "draft")


def _number_or_text(value: str) -> int | str:
    """A whole number, or the text as given, for LoadSettings.validate() to name."""
    try:
        return int(value)
    except ValueError:
        return value


def _gpu_layers(value: str) -> int | str:
    word = value.strip().lower()
    named = [count for count, name in GPU_LAYER_WORDS.items() if name == word]
    return named[0] if named else _number_or_text(value)


def add_load_arguments(parser: argparse.ArgumentParser, *, ctx_help: str | None = None) -> None:
    """The load options, in a group of their own. ``ctx_help``: what --ctx means for this command, where its
    default is not LoadSettings' (doctor: the model's own context when smaller)."""
    group = parser.add_argument_group("loading the model (llama-server's spellings work too)")

    def option(field: str, **kw: object) -> None:
        dest, aliases = OPTIONS[field]
        group.add_argument("--" + dest.replace("_", "-"), *aliases, dest=dest, **kw)  # type: ignore[arg-type]

    option("n_ctx", type=_number_or_text, default=LOAD.n_ctx, metavar="N",
           help=ctx_help or f"context size in tokens (default {LOAD.n_ctx})")
    option("n_batch", type=_number_or_text, default=LOAD.n_batch, metavar="N",
           help=f"tokens per llama_decode call, prompt and drafts alike (default {LOAD.n_batch})")
    option("n_threads", type=_number_or_text, default=LOAD.n_threads, metavar="N",
           help=f"CPU threads (default {LOAD.n_threads}: the physical cores)")
    option("n_gpu_layers", type=_gpu_layers, default=LOAD.n_gpu_layers, metavar="auto|all|N",
           help="layers on the GPU: auto (as many as fit in its free memory with the KV cache, the rest on the "
           f"CPU), all, or N (default {GPU_LAYER_WORDS.get(LOAD.n_gpu_layers, LOAD.n_gpu_layers)})")
    option("main_gpu", type=_number_or_text, default=LOAD.main_gpu, metavar="I",
           help="put every offloaded layer on llama.cpp's GPU I alone (default: spread over all GPUs)")
    option("kv_type", default=LOAD.kv_type, metavar="T",
           help=f"KV cache type, K and V alike: {', '.join(KV_TYPES)} (default {LOAD.kv_type}; a quantized one "
           "needs flash attention)")
    option("flash_attn", default=LOAD.flash_attn, metavar="|".join(FLASH_ATTN_MODES),
           help=f"flash attention (default {LOAD.flash_attn})")
    option("rpc_servers", default=",".join(LOAD.rpc_servers), metavar="HOST:PORT,...",
           help="llama.cpp RPC servers (rpc-server) that take the model's layers, split by their free memory; "
           "needs llama.cpp built with RPC (python3 bootstrap.py --build rpc)")
    option("recurrent_rollback", default=LOAD.recurrent_rollback, metavar="|".join(RECURRENT_ROLLBACKS),
           help="how a recurrent or hybrid target takes back rejected drafts: llama.cpp's state snapshots where "
           "it has them (auto), or always a checkpoint")


def load_settings(args: argparse.Namespace, target_path: str, draft: DraftSettings | None = None) -> LoadSettings:
    """The load options as LoadSettings, validated: SettingsError says what is wrong in one sentence."""
    chosen = {field: getattr(args, dest) for field, (dest, _) in OPTIONS.items() if field != "rpc_servers"}
    settings = replace(LOAD, target_path=target_path, draft=draft if draft is not None else LOAD.draft,
                       rpc_servers=parse_rpc_servers(args.rpc), **chosen)
    return settings.validate()
