"""Logged exceptions keep their type and frames; their messages never reach a log line."""

import io
import json
import logging

import pytest

from ledger.logfilter import WITHHELD, WithholdExceptionMessages

CANARY = "CANARY_LOG_5e0b"


def configured_console():
    """The root handler that console/settings.py's LOGGING installs."""
    handlers = [h for h in logging.getLogger().handlers if not type(h).__module__.startswith("_pytest")]
    assert handlers, "LOGGING installs a root handler"
    return handlers


def emit(logger_name: str, make_exception, message: str = "Internal Server Error: %s", args=("/api/v1/runs",)) -> str:
    """Log ``make_exception()`` like Django does and return what the configured handlers print."""
    logger = logging.getLogger(logger_name)
    buffers = []
    originals = []
    for handler in configured_console():
        buffer = io.StringIO()
        originals.append((handler, handler.setStream(buffer)))
        buffers.append(buffer)
    try:
        try:
            make_exception()
        except Exception as exc:
            logger.error(message, *args, exc_info=exc)
    finally:
        for handler, stream in originals:
            handler.setStream(stream)
    raw = "".join(buffer.getvalue() for buffer in buffers)
    assert CANARY not in raw  # in the printed bytes, whatever their format
    return "\n".join(_readable(line) for line in raw.splitlines())


def _readable(line: str) -> str:
    """A JSON line (FENCELINE_LOG_FORMAT=json, the default) as its message and traceback."""
    try:
        record = json.loads(line)
    except ValueError:
        return line
    return "\n".join(str(record.get(key, "")) for key in ("message", "exc_info"))


def raise_plain():
    raise ValueError(f"upstream answered {CANARY}")


def raise_chained():
    try:
        {}["missing"]
    except KeyError as exc:
        raise RuntimeError(f"lookup failed for {CANARY}") from exc


def raise_in_handling():
    try:
        raise OSError(f"disk said {CANARY}")
    except OSError:
        raise TypeError(f"and then {CANARY}")  # noqa: B904 - the implicit context is the point


class ProviderError(Exception):
    pass


def raise_custom():
    raise ProviderError(CANARY)


@pytest.mark.parametrize("make_exception", [raise_plain, raise_chained, raise_in_handling, raise_custom])
def test_django_request_tracebacks_keep_type_and_frames_but_not_the_message(make_exception):
    printed = emit("django.request", make_exception)
    assert CANARY not in printed
    assert "Internal Server Error: /api/v1/runs" in printed
    assert "Traceback (most recent call last):" in printed
    assert f": {WITHHELD}" in printed
    assert 'File "' in printed and "test_logfilter.py" in printed


def test_chained_exceptions_keep_every_type():
    printed = emit("django.request", raise_chained)
    assert "KeyError: " + WITHHELD in printed
    assert "RuntimeError: " + WITHHELD in printed
    assert "direct cause" in printed
    printed = emit("django.request", raise_in_handling)
    assert "OSError: " + WITHHELD in printed and "TypeError: " + WITHHELD in printed
    assert "During handling" in printed


def test_custom_exception_types_are_named_with_their_module():
    printed = emit("fenceline.test", raise_custom)
    assert f"{__name__}.ProviderError: {WITHHELD}" in printed
    assert CANARY not in printed


def test_a_log_message_that_repeats_the_exception_text_is_withheld_too():
    # django.security.* logs str(exc) as the message; BadRequest logs "%s: %s" % (str(exc), path).
    def suspicious():
        raise ValueError(f"Invalid HTTP_HOST header: {CANARY!r}")

    printed = emit("django.security.DisallowedHost", suspicious, f"Invalid HTTP_HOST header: {CANARY!r}", ())
    assert CANARY not in printed and WITHHELD in printed
    printed = emit("django.request", suspicious, "%s: %s", (f"Invalid HTTP_HOST header: {CANARY!r}", "/x"))
    assert CANARY not in printed and "/x" in printed


def test_records_without_an_exception_are_untouched():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello %s", ("world",), None)
    assert WithholdExceptionMessages().filter(record) is True
    assert record.getMessage() == "hello world"
    assert record.exc_text is None


def test_every_handler_after_the_filter_sees_the_scrubbed_record(caplog):
    caplog.set_level(logging.DEBUG)
    emit("django.request", raise_plain)
    assert caplog.records
    assert CANARY not in caplog.text
    for record in caplog.records:
        assert record.exc_info is None
        assert CANARY not in record.getMessage()
        assert CANARY not in (record.exc_text or "")
