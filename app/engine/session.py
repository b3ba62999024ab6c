"""A loaded target (and drafters) ready to answer chats: what the worker process and `specdeck bench` drive.

Loading checks every file with the bounded GGUF reader before llama.cpp sees it, checks the drafter
against the target as llama.cpp does, and measures what a target pass of each width costs here.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from app.ceiling.backend import backend_name, probe_backend
from app.ceiling.device_fit import available_ram, load_gpu_layers
from app.ceiling.memory import offload_devices
from app.ceiling.mtp_heads import mtp_heads_shape, mtp_kv_bytes
from app.ceiling.roofline import (
    ModelShape,
    kv_bytes_per_token,
    kv_cache_bytes,
    recurrent_rollback,
    recurrent_state_allocated,
)
from app.ceiling.rpc import ROUND_TRIPS, connect_servers, network_seconds_per_pass
from app.engine.adaptive import DepthController
from app.engine.chat_template import clean_messages, completion_text, render_chat, warm_renderer
from app.engine.dflash import DFLASH_ARCH, DFlashContext, DFlashDrafter, block_size, check_dflash_pairing, is_dspark
from app.engine.drafters import ModelDrafter, TrainedDrafter
from app.engine.eagle3 import EAGLE3_ARCH, Eagle3Context, Eagle3Drafter, check_eagle3_pairing
from app.engine.llama import ROLLBACK_KV, ROLLBACK_SNAPSHOTS, SWA_FULL, Context, ContextParams, Model, init_backend
from app.engine.mtp import MTPContext, MTPDrafter, check_mtp_target
from app.engine.speculative import RunTotals, SpeculativeDecoder, StopReason
from app.engine.suffix_tree import suffix_drafter
from app.errors import AppError, EngineLoadError, IncompatibleDrafterError, PromptTooLongError, TemplateError
from app.events import Event, Finished, Loaded, ModelSummary, PromptProcessed, PromptProgress, decode_rate
from app.library.compat import CompatResult, VocabInfo, check_compatible
from app.library.gguf_reader import GGUFInfo, fingerprint_texts
from app.library.heads import mtp_refusal
from app.library.model_file import check_model_file
from app.params import LoadSettings, SamplingSettings, flash_attention_mode

ProgressFn = Callable[[str, float], bool]


FileStamp = tuple[str, int, int, int, int] | tuple[str]


def _file_stamps(settings: LoadSettings) -> tuple[FileStamp, ...]:
    """Which files the settings' paths name now: device, inode, size and modification time, or that one is gone."""
    paths = [settings.target_path, *([settings.draft.drafter_path] if settings.draft.drafter_path else [])]
    stamps: list[FileStamp] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            stamps.append((path,))
        else:
            stamps.append((path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(stamps)


def vocab_info(model: Model) -> tuple[VocabInfo, list[str]]:
    texts = [model.token_text(i) for i in range(model.n_vocab)]
    info = VocabInfo(
        vocab_type=model.vocab_type,
        n_vocab=model.n_vocab,
        bos_id=model.bos,
        eos_id=model.eos,
        add_bos=model.add_bos,
        add_eos=model.add_eos,
        fingerprint=fingerprint_texts(texts),
    )
    return info, texts


_MARK_OPEN, _MARK_CLOSE = "\ue000", "\ue001"  # private-use characters around a content's index


def split_contents(text: str, messages: Sequence[dict[str, str]],
                   render: Callable[[list[dict[str, str]]], str]) -> list[tuple[str, bool]]:
    """``text`` (the rendered chat) cut into template text (False) and message contents (True).

    The chat is rendered again with a placeholder in place of each content, which says exactly where each
    content sits. Searching for the contents instead would find a content such as "<|im_end|>" inside the
    template's own text first, and then parse the user's copy as a control token. Only when the placeholder
    rendering does not reproduce ``text`` (a template that inspects or rewrites contents) are the contents
    searched for, in order.
    """
    contents = [m.get("content", "") for m in messages]
    if not any(_MARK_OPEN in c or _MARK_CLOSE in c for c in contents):
        marked = [{**m, "content": f"{_MARK_OPEN}{i}{_MARK_CLOSE}"} for i, m in enumerate(messages)]
        try:
            skeleton: str | None = render(marked)
        except AppError:
            skeleton = None
        if skeleton:
            parts = re.split(f"{_MARK_OPEN}(\\d+){_MARK_CLOSE}", skeleton)
            for strip in (False, True):
                out: list[tuple[str, bool]] = []
                for j, part in enumerate(parts):
                    if j % 2:
                        content = contents[int(part)]
                        out.append((content.strip() if strip else content, True))
                    elif part:
                        out.append((part, False))
                if "".join(piece for piece, _ in out) == text:
                    return out
    out = []
    cursor = 0
    for content in contents:
        for candidate in (content, content.strip()):
            at = text.find(candidate, cursor) if candidate else -1
            if at >= 0:
                out += [(text[cursor:at], False), (candidate, True)]
                cursor = at + len(candidate)
                break
    out.append((text[cursor:], False))
    return out


def check_drafter(target: Model, drafter: Model) -> CompatResult:
    t_info, t_texts = vocab_info(target)
    d_info, d_texts = vocab_info(drafter)
    return check_compatible(t_info, d_info, t_texts, d_texts)


def summarize(model: Model) -> ModelSummary:
    return ModelSummary(
        path=model.path,
        name=model.meta("general.name") or Path(model.path).stem,
        architecture=model.meta("general.architecture") or "unknown",
        n_params=model.n_params,
        size_bytes=model.size_bytes,
        n_ctx_train=model.n_ctx_train,
        n_layer=model.n_layer,
        n_vocab=model.n_vocab,
        has_chat_template=bool(model.chat_template()),
    )


@dataclass(frozen=True)
class ChatPrompt:
    tokens: list[int]
    warning: str | None  # what was replaced or repaired, for the user
    tool_format: str = ""  # with tools: how the answer's calls are written (app.engine.tool_calls)


def chat_prompt(model: Model, messages: Sequence[dict[str, Any]],
                tools: Sequence[dict[str, Any]] = ()) -> ChatPrompt:
    """Render the chat with the model's template and tokenize it; the warning says what was replaced.

    Only the template's own text may contain control tokens: each message's content is tokenized
    with special-token parsing off, so a user typing "<|im_end|>" gets plain text, not a control token. Tool
    definitions and calls are rendered by the template as its own text, so one that spells a control token is
    refused.
    """
    bos_text = model.token_text(model.bos) if model.bos >= 0 else ""
    eos_text = model.token_text(model.eos) if model.eos >= 0 else ""
    messages, clean_notes = clean_messages(messages)  # the renderer sees clean text: keep its notes
    _refuse_control_text(model, tools, messages)
    template = model.chat_template()
    architecture = model.meta("general.architecture") or ""
    rendered = render_chat(template, messages, bos_text, eos_text, architecture=architecture, tools=tools)
    text = rendered.text
    tokens: list[int] = []
    if model.add_bos and model.bos >= 0 and not (bos_text and text.startswith(bos_text)):
        tokens.append(model.bos)
    for piece, is_content in split_contents(
        text, messages,
        lambda msgs: render_chat(template, msgs, bos_text, eos_text, architecture=architecture, tools=tools).text,
    ):
        tokens += model.tokenize(piece, parse_special=not is_content)
    warning = " ".join(w for w in (rendered.warning, *clean_notes) if w) or None
    return ChatPrompt(tokens, warning, rendered.tool_format)


def chat_prompt_tokens(model: Model, messages: Sequence[dict[str, Any]]) -> tuple[list[int], str | None]:
    prompt = chat_prompt(model, messages)
    return prompt.tokens, prompt.warning


def _refuse_control_text(model: Model, tools: Sequence[dict[str, Any]], messages: Sequence[dict[str, Any]]) -> None:
    texts = [json.dumps(list(tools), ensure_ascii=False)] if tools else []
    texts += [json.dumps(m["tool_calls"], ensure_ascii=False) for m in messages if m.get("tool_calls")]
    texts += [str(m["name"]) for m in messages if m.get("name")]
    for text in texts:
        if model.tokenize(text, parse_special=True) != model.tokenize(text, parse_special=False):
            raise TemplateError("A tool definition or tool call spells one of the model's control tokens (such "
                                "as an end-of-turn marker); remove it and send the request again.")


def _dflash_drafter(target: Model, target_info: GGUFInfo, ctx: Context, head: Model, head_info: GGUFInfo,
                    cparams: ContextParams, p_min: float) -> TrainedDrafter:
    ids = check_dflash_pairing(target, target_info, head, head_info)
    del p_min  # DSpark's confidence cut needs its own head
    return DFlashDrafter(ctx, DFlashContext(head, ctx, cparams), ids, block_size(head_info),
                         dspark=is_dspark(head_info), p_min=0.0)


def _eagle3_drafter(target: Model, target_info: GGUFInfo, ctx: Context, head: Model, head_info: GGUFInfo,
                    cparams: ContextParams, p_min: float) -> TrainedDrafter:
    ids = check_eagle3_pairing(target, target_info, head, head_info)
    return Eagle3Drafter(ctx, Eagle3Context(head, ctx, cparams), ids, p_min=p_min)


# Drafter files that are heads on the target (they read its hidden states), by architecture; any other
# drafter file is a draft model of its own (ModelDrafter). A new kind of head is one entry here.
HEAD_DRAFTERS: dict[str, Callable[[Model, GGUFInfo, Context, Model, GGUFInfo, ContextParams, float],
                                  TrainedDrafter]] = {
    DFLASH_ARCH: _dflash_drafter,
    EAGLE3_ARCH: _eagle3_drafter,
}


class EngineSession:
    """Target, drafters and the loop, loaded from ``LoadSettings``."""

    def __init__(self, settings: LoadSettings, *, log: Callable[[str], None] | None = None,
                 progress: ProgressFn | None = None) -> None:
        self._models: list[Model] = []  # what close() frees; everything else llama.cpp holds borrows these
        try:
            self._load(settings, log, progress)
        except BaseException:
            self.close()  # a load that fails half way frees what it had, in order, before the error goes on
            raise

    def files_unchanged(self) -> bool:
        """Whether the model files at the settings' paths are still the ones loaded (a download or a copy may
        have put another file there since)."""
        return _file_stamps(self.settings) == self._file_stamps

    def _load(self, settings: LoadSettings, log: Callable[[str], None] | None,
              progress: ProgressFn | None) -> None:
        settings.validate()
        t0 = time.perf_counter()
        init_backend(log)
        warm_renderer()  # the template child imports Jinja while the model loads
        self.settings = settings
        draft = settings.draft
        self._file_stamps = _file_stamps(settings)
        self.target_info = check_model_file(settings.target_path, "target")
        drafter_info = check_model_file(draft.drafter_path, "drafter") if draft.drafter_path else None
        if settings.n_ctx > max(self.target_info.context_length, 1) * 4 and self.target_info.context_length:
            raise EngineLoadError(
                f"A context of {settings.n_ctx} tokens is far beyond what {Path(settings.target_path).name} "
                f"was trained for ({self.target_info.context_length}); choose at most that."
            )

        def stage(name: str) -> Callable[[float], bool]:
            return lambda f: progress(name, f) if progress else True

        # RPC servers: probed first (ggml aborts on one that refuses, hangs or speaks another version) and their
        # round trips timed, then registered with ggml, where they are devices like any GPU.
        rpc_probes = connect_servers(settings.rpc_servers)
        self.network_seconds = network_seconds_per_pass(rpc_probes)
        if log is not None:
            for probe in rpc_probes:
                log(f"RPC server {probe.endpoint}: {probe.devices} device(s), round trip "
                    f"{probe.round_trip_s * 1e3:.2f} ms (median of {ROUND_TRIPS})")
        # --gpu-layers auto becomes the most layers that fit in free memory; a count that cannot fit is refused
        # (some drivers abort, or overcommit, rather than fail the load).
        layers = load_gpu_layers(self.target_info, settings, probe_backend(settings.rpc_servers).devices,
                                 drafter=drafter_info, ram_free=available_ram())
        if layers.error:
            raise EngineLoadError(layers.error)
        if layers.note and log is not None:
            log(layers.note)
        if draft.mtp:
            refusal = mtp_refusal(self.target_info)
            if refusal:
                raise IncompatibleDrafterError(refusal)  # before llama.cpp, whose MTP graph asserts its shapes
        self.target = Model(settings.target_path, n_gpu_layers=layers.n_gpu_layers,
                            main_gpu=settings.main_gpu, progress=stage("target"), load_mtp=draft.mtp,
                            rpc_servers=settings.rpc_servers)
        self._models.append(self.target)
        self.gpu_layers = layers
        flash_attn = flash_attention_mode(settings.flash_attn, backend_name(), layers.n_gpu_layers,
                                          settings.kv_type)
        if flash_attn != settings.flash_attn and log is not None:
            log("flash attention: off on Vulkan (llama.cpp's Vulkan flash attention crashes after a KV-cache "
                "rollback, which speculative decoding does at every rejected draft); choose \"on\" to force it")
        cparams = ContextParams(n_ctx=settings.n_ctx, n_batch=settings.n_batch, n_threads=settings.n_threads,
                                flash_attn=flash_attn, kv_type=settings.kv_type)
        k_max = min(draft.k_max, settings.n_batch - 1) if draft.speculative else 0
        target_shape = ModelShape.from_gguf(self.target_info)
        self.rollback_plan = recurrent_rollback(target_shape, self.target_info.architecture, k_max,
                                                settings.recurrent_rollback)
        self.ctx = Context(self.target, replace(cparams, rs_snapshots=self.rollback_plan.snapshots))
        self.drafter_model: Model | None = None
        model_drafter: TrainedDrafter | None = None
        if draft.mtp:
            check_mtp_target(self.target, self.target_info)
            model_drafter = MTPDrafter(self.ctx, MTPContext(self.target, self.ctx, cparams), p_min=draft.p_min)
        if draft.drafter_path and drafter_info is not None:
            if Path(draft.drafter_path).resolve() == Path(settings.target_path).resolve():
                self.drafter_model = self.target  # never load the same file twice
            else:
                self.drafter_model = Model(draft.drafter_path, n_gpu_layers=layers.drafter_gpu_layers,
                                           main_gpu=settings.main_gpu, progress=stage("drafter"),
                                           rpc_servers=settings.rpc_servers)
                self._models.append(self.drafter_model)
                verdict = check_drafter(self.target, self.drafter_model)
                if not verdict.ok:
                    raise IncompatibleDrafterError(
                        f"{Path(draft.drafter_path).name} cannot draft for {Path(settings.target_path).name}: "
                        f"{verdict.reason.rstrip('.')}."
                    )
            head = HEAD_DRAFTERS.get(drafter_info.architecture)
            if head is not None:
                model_drafter = head(self.target, self.target_info, self.ctx, self.drafter_model, drafter_info,
                                     cparams, draft.p_min)
            else:
                dctx = Context(self.drafter_model, cparams)  # a recurrent drafter takes back drafts by checkpoint
                model_drafter = ModelDrafter(self.drafter_model, dctx, p_min=draft.p_min)
        ngram = suffix_drafter(draft.ngram, draft.history_tokens, self.target.tokenize, log) \
            if draft.ngram > 0 else None
        controller = DepthController(k_max=k_max, fixed=None if draft.adaptive else min(draft.k, k_max),
                                     block_drafter=model_drafter is not None and model_drafter.block_drafter)
        if model_drafter is not None and draft.model_start is not None:
            controller.start_model_from(draft.model_start)
            if log is not None:
                log(f"model drafter: starting from this pair's measured acceptance {draft.model_start:.2f}")
        self.decoder = SpeculativeDecoder(self.target, self.ctx, ngram=ngram, drafter=model_drafter,
                                          controller=controller)
        # KV bytes as the roofline counts them (sliding-window layers included), for what llama.cpp allocates.
        shapes = [target_shape]
        if model_drafter is not None and not draft.mtp:  # the MTP context is counted on its own
            shapes.append(ModelShape.from_gguf(drafter_info) if drafter_info is not None else shapes[0])
        self.kv_per_token = kv_bytes_per_token(shapes[0], settings.kv_type)
        self.decoder.kv_bytes_per_token = self.kv_per_token
        self.drafter_kv_per_token = kv_bytes_per_token(shapes[1], settings.kv_type) if len(shapes) > 1 else 0
        self.mtp_kv_bytes = mtp_kv_bytes(self.target_info, self.ctx.n_ctx, settings.kv_type) if draft.mtp else 0
        if draft.mtp:
            self.drafter_kv_per_token = kv_bytes_per_token(mtp_heads_shape(self.target_info), settings.kv_type)
        # A recurrent state as llama.cpp holds it (with the snapshots it really keeps), and the checkpoint copy.
        self.state_bytes = recurrent_state_allocated(shapes[0], self.ctx.rs_snapshots,
                                                     checkpoint=self.ctx.rs_snapshots < k_max)
        if model_drafter is not None and model_drafter.keeps_recurrent_checkpoint:
            self.state_bytes += recurrent_state_allocated(shapes[1], checkpoint=True)
        self.decoder.state_bytes = self.state_bytes
        self.kv_bytes_total = self.state_bytes + self.mtp_kv_bytes + sum(
            kv_cache_bytes(shape, self.ctx.n_ctx, settings.kv_type, swa_full=SWA_FULL, n_ubatch=self.ctx.n_batch,
                           n_batch=self.ctx.n_batch)
            for shape in shapes
        )
        # Every width the policy may choose is timed: on a CPU the cost is far from linear in width.
        self.decoder.calibrate(widths=range(1, k_max + 2), progress=stage("timing"))
        if log is not None and self.ctx.rollback != ROLLBACK_KV:
            how = (f"{self.ctx.rs_snapshots} snapshots (deeper drafts: a checkpoint)"
                   if self.ctx.rollback == ROLLBACK_SNAPSHOTS else "a checkpoint saved before each drafting pass")
            log(f"recurrent state: {self.decoder.checkpoint_bytes:,} B per checkpoint, "
                f"{self.state_bytes:,} B with its copies; rejected drafts are taken back from {how}")
        # Plain decoding on the same context, for side-by-side baselines.
        self.plain_decoder = SpeculativeDecoder(self.target, self.ctx)
        self.plain_decoder.kv_bytes_per_token = self.kv_per_token
        self.plain_decoder.state_bytes = self.state_bytes
        self.plain_decoder.plain_tps = self.decoder.plain_tps
        # The devices the layers went to, with their memory now that the models are on them (an RPC server's
        # is asked over this process's own connection: no other process can ask it while it serves this one).
        self.devices = offload_devices(probe_backend(settings.rpc_servers).devices, settings.rpc_servers) \
            if self.target.n_gpu_layers else ()
        if settings.main_gpu is not None:
            self.devices = self.devices[settings.main_gpu:settings.main_gpu + 1]
        self.load_seconds = time.perf_counter() - t0

    def loaded_event(self) -> Loaded:
        per_token = self.kv_per_token + self.drafter_kv_per_token
        return Loaded(
            target=summarize(self.target),
            drafter=summarize(self.drafter_model) if self.drafter_model else None,
            ngram=self.settings.draft.ngram,
            mtp=self.settings.draft.mtp,
            n_ctx=self.ctx.n_ctx,
            backend=backend_name(),
            gpu_offload=bool(self.devices),
            kv_bytes_per_token=per_token,
            kv_bytes_total=self.kv_bytes_total,
            load_seconds=self.load_seconds,
            plain_tps=self.decoder.plain_tps or 0.0,
            devices=self.devices,
            main_gpu=self.settings.main_gpu,
            network_seconds=self.network_seconds,
            gpu_layers_note=self.gpu_layers.note,
            n_gpu_layers=self.target.n_gpu_layers,
        )

    # --- prompts --------------------------------------------------------------------------------

    def prompt_tokens(self, messages: Sequence[dict[str, Any]]) -> tuple[list[int], str | None]:
        return chat_prompt_tokens(self.target, messages)

    def continuation_tokens(self, messages: Sequence[dict[str, str]]) -> tuple[list[int], str | None]:
        """The prompt that goes on from a partial answer (the last message): the chat before it, rendered
        as usual, then the answer's text as plain tokens, left open (no end-of-turn)."""
        if not messages or messages[-1].get("role") != "assistant":
            raise TemplateError("Continue needs the partial answer as the last message.")
        tokens, warning = self.prompt_tokens(messages[:-1])
        return tokens + self.target.tokenize(messages[-1].get("content", ""), parse_special=False), warning

    def raw_prompt_tokens(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """Completion (base models): the user and assistant texts joined are the prompt, with no template;
        control-token text in them stays plain text."""
        model = self.target
        text = completion_text(messages)
        head = [model.bos] if model.add_bos and model.bos >= 0 else []
        return head + model.tokenize(text, parse_special=False)

    # --- generation -----------------------------------------------------------------------------

    def generate(self, request_id: int, messages: Sequence[dict[str, str]], sampling: SamplingSettings,
                 *, prompt: Sequence[int] | None = None,
                 cancelled: Callable[[], bool] | None = None,
                 decoder: SpeculativeDecoder | None = None,
                 continue_answer: bool = False, raw: bool = False,
                 tools: Sequence[dict[str, Any]] = ()) -> Iterator[Event]:
        """One answer. ``continue_answer``: the last message is a partial answer to go on from. ``raw``: no
        chat template (completion); a partial answer at the end is then simply part of the prompt. ``tools``
        (OpenAI function tools) go to the template; ``PromptProcessed.tool_format`` says how calls are read."""
        sampling.validate()
        decoder = decoder or self.decoder
        if self.decoder.drafter is not None:
            self.decoder.drafter.follow(decoder is not self.plain_decoder)
        warning: str | None = None
        tool_format = ""
        if prompt is not None:
            tokens = list(prompt)
        elif raw:
            tokens = self.raw_prompt_tokens(messages)
        elif continue_answer:
            tokens, warning = self.continuation_tokens(messages)
        else:
            rendered = chat_prompt(self.target, messages, tools)
            tokens, warning, tool_format = rendered.tokens, rendered.warning, rendered.tool_format
        if not tokens:
            raise PromptTooLongError("The prompt is empty; type a message first.")
        if len(tokens) >= self.ctx.n_ctx:
            raise PromptTooLongError(
                f"The prompt is {len(tokens)} tokens but the context holds {self.ctx.n_ctx}; "
                "shorten it, start a new chat, or load the model with a larger context."
            )
        totals = RunTotals()
        stop = StopReason()
        pieces: list[str] = []
        announced = False
        # Only the tokens not already in the KV cache are prefilled; a cached prefix takes no time, and counting
        # it made a cached prompt's rate read millions of tokens per second.
        prefilled = max(len(tokens) - 1 - decoder.ctx.common_prefix(tokens[:-1]), 0)
        for event in decoder.generate(tokens, sampling, request_id, totals=totals, stop=stop,
                                       cancelled=cancelled):
            if not announced and not isinstance(event, PromptProgress):
                announced = True
                yield PromptProcessed(request_id, totals.prompt_tokens, totals.prefill_seconds, warning,
                                      tool_format)
            if hasattr(event, "text"):
                pieces.append(event.text)
            yield event
        stats = replace(totals.summary(totals.plain_rate()),
                        prefill_tps=decode_rate(prefilled, totals.prefill_seconds))
        yield Finished(request_id, stop.reason or "cancelled", stats, "".join(pieces))

    def close(self) -> None:
        """Free the models, newest first; each frees the contexts, batches and samplers that borrow it first
        (a drafter's context that reads the target's goes with either)."""
        while self._models:
            self._models.pop().close()
