"""Log lines as records: the bound fields on every line, as text or JSON."""

from __future__ import annotations

import asyncio
import io
import logging
import subprocess
import sys
import uuid
from collections.abc import Iterator

import orjson
import pytest

from casetrail.telemetry import logs


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, logging.StreamHandler[io.StringIO]]]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(logs.ContextFields())
    logger = logging.getLogger(f"casetrail.test.{uuid.uuid4().hex}")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield logger, handler
    logger.removeHandler(handler)


def _lines(handler: logging.StreamHandler[io.StringIO]) -> list[str]:
    return handler.stream.getvalue().splitlines()


def test_a_json_line_carries_the_bound_fields_and_nothing_outside_its_block(
        captured: tuple[logging.Logger, logging.StreamHandler[io.StringIO]]) -> None:
    logger, handler = captured
    handler.setFormatter(logs.JsonFormatter())
    logs.set_component("worker")
    case_id = str(uuid.uuid4())
    with logs.bound(case_id=case_id):
        with logs.bound(tenant="acme", attempt=2):
            logger.warning("a cycle raised %s", "ValueError")
        logger.info("claimed")
    logger.info("idle")
    inner, middle, outer = (orjson.loads(line) for line in _lines(handler))
    assert inner["message"] == "a cycle raised ValueError"
    assert (inner["component"], inner["case_id"], inner["tenant"], inner["attempt"]) == (
        "worker", case_id, "acme", 2)
    assert inner["level"] == "WARNING" and inner["time"].endswith("Z")
    assert middle["case_id"] == case_id and "tenant" not in middle and "attempt" not in middle
    assert "case_id" not in outer and outer["component"] == "worker"


async def test_a_task_started_in_the_block_keeps_its_fields(
        captured: tuple[logging.Logger, logging.StreamHandler[io.StringIO]]) -> None:
    logger, handler = captured
    handler.setFormatter(logs.JsonFormatter())
    gate = asyncio.Event()

    async def later() -> None:
        await gate.wait()
        logger.info("the tool answered")

    with logs.bound(case_id="c-1", attempt=1):
        task = asyncio.create_task(later())
    gate.set()
    await task
    (line,) = (orjson.loads(line) for line in _lines(handler))
    assert (line["case_id"], line["attempt"]) == ("c-1", 1)


def test_text_puts_the_fields_after_the_message_and_before_a_traceback(
        captured: tuple[logging.Logger, logging.StreamHandler[io.StringIO]]) -> None:
    logger, handler = captured
    handler.setFormatter(logs.TextFormatter())
    logs.set_component("worker")
    with logs.bound(case_id="c-9", tenant="acme"):
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logger.exception("a cycle raised")
    first, *rest = _lines(handler)
    assert first.endswith("a cycle raised  component=worker case_id=c-9 tenant=acme")
    assert rest[0] == "Traceback (most recent call last):"
    assert rest[-1] == "RuntimeError: boom"


def test_a_field_that_is_not_one_is_refused() -> None:
    with pytest.raises(ValueError, match="not a log field"), logs.bound(applicant="Ada"):
        pass


def test_a_process_logs_json_when_the_setting_says_so() -> None:
    """The setting as a component reads it: ``CASETRAIL_LOG_FORMAT=json``."""
    code = ("from casetrail.cli.common import configure_logging; import logging; "
            "from casetrail.telemetry import logs; logs.set_component('consumer'); "
            "configure_logging(); "
            "ctx = logs.bound(case_id='c-7'); ctx.__enter__(); "
            "logging.getLogger('casetrail.x').info('stored %d events', 3)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"CASETRAIL_LOG_FORMAT": "json", "PATH": ""}, check=True)
    line = orjson.loads(done.stderr.strip().splitlines()[-1])
    assert line["message"] == "stored 3 events"
    assert (line["component"], line["case_id"], line["logger"]) == ("consumer", "c-7",
                                                                    "casetrail.x")
