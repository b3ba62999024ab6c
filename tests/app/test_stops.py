"""Stop strings: the window's field spelling (parse_stops / stops_text), and one answer's events cut at the
first stop (StopCut), with only the tokens of the kept text counted."""

from __future__ import annotations

import dataclasses

import pytest

from app.engine.stops import StopCut
from app.events import Finished, MessageStats, Token
from app.params import parse_stops, stops_text

STATS = MessageStats(**{f.name: (() if f.name == "per_position_acceptance" else 0)
                        for f in dataclasses.fields(MessageStats) if f.default is dataclasses.MISSING})


@pytest.mark.parametrize("stops", [("\nUser:",), ("a\\b", "\t", "  two spaces "), ("END",), ("\\n as typed",)])
def test_the_field_spelling_round_trips(stops: tuple[str, ...]) -> None:
    assert parse_stops(stops_text(stops)) == stops


def test_the_field_reads_one_stop_per_line_and_skips_empty_lines() -> None:
    assert parse_stops("END\n\n\\nUser:\n") == ("END", "\nUser:")
    assert parse_stops("") == ()


def test_an_answer_is_cut_at_the_first_stop_and_counts_only_the_kept_tokens() -> None:
    cut = StopCut(("STOP",))
    pieces = ["Hello", " wor", "ld S", "TO", "P and", " more"]
    given = [cut.token(Token(1, p, (n,), ("target",), (p,))).text for n, p in enumerate(pieces)]
    assert "".join(given) == "Hello world "
    assert given[2] == "ld "  # " S" might begin the stop, so it is held back, then dropped
    assert cut.stopped
    end = cut.finished(Finished(1, "cancelled", dataclasses.replace(STATS, completion_tokens=6), "uncut"),
                       "".join(given) + cut.tail())
    assert (end.reason, end.text, end.stop_sequence) == ("stop", "Hello world ", "STOP")
    assert end.stats.completion_tokens == 3  # "Hello", " wor", "ld S": the token the kept text ends in counts


def test_text_held_back_that_begins_no_stop_is_given_at_the_end() -> None:
    cut = StopCut(("STOP",))
    assert cut.token(Token(1, "go ST", (1,), ("target",), ("go ST",))).text == "go "
    assert cut.tail() == "ST"
    end = Finished(1, "eog", STATS, "go ST")
    assert cut.finished(end, "go ST") is end  # no stop: the end as it came


def test_no_stops_pass_everything_through() -> None:
    cut = StopCut(())
    assert cut.token(Token(1, "anything", (1,), ("target",))).text == "anything"
    assert not cut.stopped
    assert cut.tail() == ""
