"""The logfail fixture (tests/logfail.py): an unexpected ERROR record fails its test; an expected one does not."""

from __future__ import annotations

import logging
import threading

import pytest

INNER = """
import logging
import threading

import pytest


def test_logs_an_error():
    logging.getLogger("app.somewhere").error("the probe failed")


def test_logs_an_error_from_a_thread():
    worker = threading.Thread(target=lambda: logging.getLogger("app.worker").error("lost the engine"))
    worker.start()
    worker.join()


def test_warns_only():
    logging.getLogger("app.somewhere").warning("a warning is not an error")


@pytest.mark.logs_errors(match="the probe failed")
def test_expects_its_error():
    logging.getLogger("app.somewhere").error("the probe failed")


@pytest.mark.logs_errors(match="the probe failed")
def test_expects_another_error():
    logging.getLogger("app.somewhere").error("something else broke")
"""


@pytest.mark.logs_errors(match="the probe failed|lost the engine|something else broke")  # the inner tests' own
def test_an_unexpected_error_record_fails_its_test(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmarkers =\n    logs_errors(match): expected ERROR records\n")
    pytester.makeconftest('pytest_plugins = ["tests.logfail"]\n')
    pytester.makepyfile(test_inner=INNER)
    reports = pytester.inline_run("-p", "no:cacheprovider").getreports("pytest_runtest_logreport")
    failed = {r.nodeid.split("::")[-1]: str(r.longrepr) for r in reports if r.failed}
    assert set(failed) == {"test_logs_an_error", "test_logs_an_error_from_a_thread", "test_expects_another_error"}
    assert "ERROR app.somewhere: something else broke" in failed["test_expects_another_error"]
    assert all(r.passed for r in reports if r.when == "call")  # the tests themselves passed: the logs failed them


@pytest.mark.logs_errors(match="^on purpose$")
def test_a_marked_test_may_log_its_error() -> None:
    worker = threading.Thread(target=lambda: logging.getLogger("app.test").error("on purpose"))
    worker.start()
    worker.join()
