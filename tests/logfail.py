"""The logfail fixture: an ERROR log record fails the test that logged it, unless the test says it expects it."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import pytest


class _ErrorRecords(logging.Handler):
    """Keeps every record at ERROR or above that reaches the root logger, from any thread."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(autouse=True)
def logfail(request: pytest.FixtureRequest) -> Iterator[None]:
    """An ERROR log record fails the test that logged it (as qutebrowser's logfail does): an error nobody
    expected is a bug the test would otherwise pass over. A test that logs one on purpose says so with
    ``@pytest.mark.logs_errors(match=REGEX)``; records whose message matches are then allowed, others still fail."""
    handler = _ErrorRecords()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
    marker = request.node.get_closest_marker("logs_errors")
    expected = re.compile(marker.kwargs.get("match", "")) if marker is not None else None
    unexpected = [r for r in handler.records if expected is None or not expected.search(r.getMessage())]
    if unexpected:
        lines = "\n".join(f"{r.levelname} {r.name}: {r.getMessage()}" for r in unexpected)
        pytest.fail(f"the test logged {len(unexpected)} unexpected error(s) (mark it logs_errors if they are meant):"
                    f"\n{lines}", pytrace=False)
