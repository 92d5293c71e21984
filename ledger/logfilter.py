"""Exception messages never reach a log line (invariant 6).

An exception's message may carry input (``ValueError(f"bad token {token}")``), so the
handlers configured in ``console/settings.py`` run :class:`WithholdExceptionMessages`
first: a record's traceback keeps the exception *types* and the frames but not the
messages, and a log message that repeats an exception's text (Django's
``django.security`` and ``BadRequest`` lines do) gets that text withheld too.

The filter changes the record itself, so every handler that sees the record after it
prints the same scrubbed text. :class:`WithholdCredentials` then replaces any line that still
carries a credential-like value: the rules of ``ledger.boundary``, through the same normal form
the API and the console judge requests in (decoded, NFKC, invisible characters out, confusables
folded, base64/hex layers decoded: ``ledger/boundary/normal.py``).
"""

import logging
import traceback
from collections.abc import Iterator
from types import TracebackType

from ledger.boundary import credential_kind

WITHHELD = "[message withheld]"

_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


def _type_name(exc_type: type[BaseException]) -> str:
    module = exc_type.__module__
    if module in ("builtins", "__main__"):
        return exc_type.__qualname__
    return f"{module}.{exc_type.__qualname__}"


def format_exception_without_messages(
    exc_type: type[BaseException], exc: BaseException | None, tb: TracebackType | None = None
) -> str:
    """Like ``traceback.format_exception`` (chained exceptions included), but every
    exception line reads ``Type: [message withheld]``."""
    blocks: list[str] = []
    seen: set[int] = set()
    while True:
        lines: list[str] = []
        frames = exc.__traceback__ if exc is not None else tb
        if frames is not None:
            lines.append("Traceback (most recent call last):\n")
            lines.extend(traceback.format_tb(frames))
        lines.append(f"{_type_name(exc_type)}: {WITHHELD}\n")
        blocks.insert(0, "".join(lines))
        if exc is None:
            break
        seen.add(id(exc))
        if exc.__cause__ is not None:
            following, separator = exc.__cause__, _CAUSE
        elif exc.__context__ is not None and not exc.__suppress_context__:
            following, separator = exc.__context__, _CONTEXT
        else:
            break
        if id(following) in seen:
            break
        blocks.insert(0, separator)
        exc, exc_type, tb = following, type(following), None
    return "".join(blocks).rstrip("\n")


def _exception_texts(exc: BaseException | None) -> Iterator[str]:
    """The message of ``exc`` and its causes, raw and as Django escapes log arguments."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        try:
            text = str(exc)
        except Exception:
            text = ""
        if len(text) >= 4:  # shorter texts would only mangle the line, not hide a secret
            yield text
            yield text.encode("unicode_escape").decode("ascii")
        exc = exc.__cause__ or exc.__context__


class WithholdExceptionMessages(logging.Filter):
    """Keep the exception type and frames of a logged exception, drop its message."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.exc_info or record.exc_info[0] is None:
            return True
        exc_type, exc, tb = record.exc_info
        try:
            message = record.getMessage()
        except Exception:
            message = None
        if message is not None:
            withheld = message
            for text in _exception_texts(exc):
                withheld = withheld.replace(text, WITHHELD)
            if withheld != message:
                record.msg, record.args = withheld, ()
        record.exc_text = format_exception_without_messages(exc_type, exc, tb)
        # Without exc_info, later formatters print exc_text instead of formatting the
        # exception again, and handlers that render exceptions themselves cannot.
        record.exc_info = None
        return True


WITHHELD_LINE = "[log line withheld: it carried a credential-like value]"


class WithholdCredentials(logging.Filter):
    """The last line of defence: a record whose text carries a credential-like value (the
    secret boundary's rules, in normal form) is printed as :data:`WITHHELD_LINE`, with its
    logger and level. Secrets are refused before they are logged; this catches what is
    logged by code that is not ours, such as a URL in a web server's access line."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:
            return True
        texts = [message, record.exc_text or ""]
        # Clean texts of up to 256 characters are remembered (a request line names its route
        # pattern, not its path, and comes again and again); a refused one never is.
        if any(text and credential_kind(text) for text in texts):
            record.msg, record.args, record.exc_text, record.exc_info = WITHHELD_LINE, (), None, None
        # The extra fields a JSON line prints (a request's ids, a job's counts) pass too.
        for key, value in list(vars(record).items()):
            if key in _STANDARD or value is None or isinstance(value, (int, float, bool)):
                continue
            if credential_kind(str(value)):
                setattr(record, key, WITHHELD)
        return True


_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}
