"""Terminal escape injection: what a model or a GGUF writes cannot drive the terminal it is printed on."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.safe_text import terminal_safe

ATTACKS = {
    "osc52 clipboard": "\x1b]52;c;cm0gLXJmIH4=\x07",  # writes "rm -rf ~" to the clipboard
    "osc52 st": "\x1b]52;c;cm0gLXJmIH4=\x1b\\",
    "clear screen": "\x1b[2J\x1b[H",
    "hidden text": "\x1b[8msecret\x1b[0m",
    "c1 csi": "\x9b2J",
    "carriage return fake": "ok\rSUCCESS: all checks passed",
    "bell and backspace": "\x07\x08\x08",
    "bidi override": "abc\u202edcba",
}


@pytest.mark.parametrize("attack", ATTACKS.values(), ids=ATTACKS.keys())
@pytest.mark.parametrize("one_line", [False, True])
def test_no_control_character_survives(attack: str, one_line: bool) -> None:
    out = terminal_safe(f"before {attack} after", one_line=one_line)
    controls = [c for c in out if (ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F
                or 0x202A <= ord(c) <= 0x202E or 0x2066 <= ord(c) <= 0x2069]
    assert controls == []
    assert out.startswith("before ")  # the text around it is kept
    assert out.endswith(" after")


def test_escapes_are_visible_not_dropped() -> None:
    assert terminal_safe("\x1b[2J") == "\\x1b[2J"
    assert terminal_safe("a\rb") == "a\\rb"
    assert terminal_safe("\x9b") == "\\x9b"


def test_newline_and_tab_kept_in_text_escaped_in_one_line() -> None:
    assert terminal_safe("line 1\n\tline 2") == "line 1\n\tline 2"
    faked = terminal_safe("llama\nloaded: verified-safe-model", one_line=True)
    assert "\n" not in faked
    assert faked == "llama\\nloaded: verified-safe-model"


def test_plain_text_unchanged_and_surrogates_replaced() -> None:
    text = "Grüße, 世界 👋 — \"quotes\" and \\backslashes\\"
    assert terminal_safe(text) == text
    assert terminal_safe("a\ud800b") == "a\ufffdb"
    assert terminal_safe("a\ud800b").encode("utf-8")
    assert terminal_safe(42) == "42"


def test_doctor_prints_hostile_metadata_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli import main
    from tests.gguf_fixtures import write_tiny_model

    model = write_tiny_model(tmp_path / "evil.gguf", name="evil\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\nFAKE LINE\r",
                             chat_template="{{ ''.__class__ }}")
    assert main(["doctor", "--model", str(model)]) == 0
    out = capsys.readouterr().out
    assert not [c for c in out if (ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F]
    [target] = [line for line in out.splitlines() if "evil" in line]
    assert "evil\\x1b]52;c;cm0gLXJmIH4=\\x07\\x1b[2J\\nFAKE LINE\\r" in target
    assert not any(line.startswith("FAKE LINE") for line in out.splitlines())
    # Doctor reports the template's status: refused, why, and what is used instead.
    assert "chat template is refused" in out
    assert "Answering with the plain ChatML format instead." in out
