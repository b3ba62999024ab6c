"""A repository's file names as a person picks them: the quant from the name, split parts joined, the files
that are not models labelled, unsafe names dropped, and which artefact a pull's options pick."""

from __future__ import annotations

import pytest

from app.hub.client import HubError, repo_id
from app.hub.files import IMATRIX, MODEL, MTP_HEAD, PROJECTOR, RemoteFile, group_files, kind_of, quant_of
from app.hub.transfer import choose


@pytest.mark.parametrize(("name", "quant"), [
    ("Qwen3-8B-Q4_K_M.gguf", "Q4_K_M"), ("model.IQ4_XS.gguf", "IQ4_XS"), ("m-bf16-00001-of-00003.gguf", "BF16"),
    ("UD-Q4_K_XL/Qwen-UD-Q4_K_XL-00001-of-00002.gguf", "UD-Q4_K_XL"), ("gemma-3-1b-it-f16.gguf", "F16"),
    ("Llama-3.2-1B-Q8_0.gguf", "Q8_0"), ("x-IQ2_XXS.gguf", "IQ2_XXS"), ("x-fp16.gguf", "F16"),
    ("gpt-oss-20b-MXFP4.gguf", "MXFP4"), ("Qwen2.5-7B.gguf", ""), ("Q3_K_S-model-Q5_K_M.gguf", "Q5_K_M"),
])
def test_the_quant_comes_from_the_file_name(name: str, quant: str) -> None:
    assert quant_of(name) == quant


@pytest.mark.parametrize(("path", "kind"), [
    ("mmproj-Qwen2.5-VL-7B-F16.gguf", PROJECTOR), ("Qwen2.5-VL-7B-mmproj-f16.gguf", PROJECTOR),
    ("imatrix.gguf", IMATRIX), ("Llama.imatrix.gguf", IMATRIX), ("MTP/mtp-Qwen3.8-27B-Q4_0.gguf", MTP_HEAD),
    ("mtp-glm.gguf", MTP_HEAD), ("Qwen3.5-27B-MTP-Q4_K_M.gguf", MODEL), ("Q4_K_M/model-Q4_K_M.gguf", MODEL),
])
def test_files_that_are_not_models_are_named_for_what_they_are(path: str, kind: str) -> None:
    assert kind_of(path) == kind


def test_split_parts_are_one_model_and_odd_names_are_dropped() -> None:
    files = [RemoteFile(f"BF16/m-BF16-0000{i}-of-00003.gguf", 100 * i) for i in (3, 1, 2)]
    files += [RemoteFile("m-Q2_K-00002-of-00002.gguf", 5), RemoteFile("m-Q8_0.gguf", 50),
              RemoteFile("README.md", 1), RemoteFile("a/..\\evil-Q4_0.gguf", 1), RemoteFile(".hidden.gguf", 1)]
    groups = group_files(files)
    assert [(g.quant, g.size, g.complete) for g in groups] == [("BF16", 600, True), ("Q2_K", 5, False),
                                                               ("Q8_0", 50, True)]
    assert [p.path for p in groups[0].parts] == [f"BF16/m-BF16-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert groups[0].label == "m-BF16-00001-of-00003.gguf (+2 parts)"
    assert groups[1].name == "m-Q2_K-00001-of-00002.gguf"

    assert choose(groups, quant="bf16", repo="a/b") is groups[0]
    assert choose(groups, file="m-BF16-00002-of-00003.gguf", repo="a/b") is groups[0]
    with pytest.raises(HubError, match="not all in a/b"):
        choose(groups, file="m-Q2_K-00002-of-00002.gguf", repo="a/b")
    with pytest.raises(HubError, match=r"pass --quant \(one of BF16, Q8_0\)"):
        choose(groups, repo="a/b")


def test_projector_only_repositories_offer_nothing_to_pull() -> None:
    groups = group_files([RemoteFile("mmproj-F16.gguf", 10)])
    with pytest.raises(HubError, match="no GGUF model to pull"):
        choose(groups, repo="a/b")
    assert choose(groups, file="mmproj-F16.gguf", repo="a/b").kind == PROJECTOR  # by name, as it is


@pytest.mark.parametrize(("text", "repo"), [
    ("bartowski/Qwen3-8B-GGUF", "bartowski/Qwen3-8B-GGUF"),
    ("https://huggingface.co/unsloth/gemma-3-1b-it-GGUF/tree/main", "unsloth/gemma-3-1b-it-GGUF"),
    ("qwen 8b", None), ("a/..", None), ("../x", None), ("a/b/c", None),
])
def test_a_repository_is_an_id_or_a_hub_url(text: str, repo: str | None) -> None:
    assert repo_id(text) == repo
