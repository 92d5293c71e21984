"""The secret boundary (invariant 6): what may never become an event field or a stored value.

A value that crosses the boundary is *refused*, never redacted: :func:`check_fields` and
:func:`check_text` raise :class:`~ledger.errors.ForbiddenField`, which names the
path of the offending field and the rule it broke, and never the value. Callers check
before they serialize or write anything, so a refusal leaves nothing behind.

Two kinds of rule, each kept in one list below:

* **Forbidden keys.** A key is split into lowercase words (``X-Api-Key``, ``apiKey`` and
  ``x_api_key`` all read ``x api key``) and refused when it

  - contains a credential word anywhere (``CREDENTIAL_WORDS``: ``db_password``,
    ``client_secret``, ``Set-Cookie``, ``proxy_authorization``),
  - ends with a credential name (``CREDENTIAL_ENDINGS``: ``github_api_key``,
    ``private_key``, ``auth``),
  - ends with ``token`` (``refresh_token``, ``idToken``, ``token``), except the names of
    Fenceline's fencing tokens (``FENCING_TOKEN_KEYS``), which must hold an integer,
  - names a raw payload the secret-boundary article says is never accepted
    (``RAW_PAYLOAD_ENDINGS`` and keys starting with ``raw``: tool arguments, headers,
    bodies, prompts, error text, tool output, browser state, files). Events carry
    references, digests and codes instead: ``args_digest``, ``credential_ref``,
    ``error_code``, ``provider_request_id``.

  A raw-payload key is reported only when no credential is found anywhere else in the
  same document, so ``{"args": {"authorization": ...}}`` is reported at
  ``args.authorization``: the more specific reason wins.

* **Credential-like values**, searched anywhere inside every string, keys included, by the
  detectors of ``ledger/boundary/rules.py``: its own rules (``VALUE_RULES``: scheme words
  and header lines such as ``Bearer``, ``Basic <base64>``, ``Token <hex>`` and a bare
  ``Authorization:`` value, PEM blocks, JWTs, URLs with a password, ``password=...``
  assignments, the prefixes of well-known keys and of Fenceline's own tokens) where they are
  broader, and detect-secrets' maintained plugins for every other known format and for
  high-entropy base64 (``KNOWN_FORMATS``).

Every key and value is judged in its **normal form** (``ledger/boundary/normal.py``,
:func:`normalised`), one for every detector: decoded until nothing changes (percent-encoding,
HTML references, backslash escapes; 8 rounds at most, else refused), NFKC, without any
character that renders as nothing (by Unicode property), and with letters of other scripts
folded to the Latin letters they are confusable with (Unicode TR39: ``\u0440\u0430ssword``,
with a Cyrillic er and a, reads ``password``); every base64 or hex run in it that decodes to
text is judged too, three layers deep. A value a person would read as a credential is refused
however it is spelled; the stored value is the one that was sent.

**A request's texts together** (:func:`check_request`, :func:`check_texts`): a credential
split across two fields passes each alone, so the strings of one request are also judged in
pairs and joined; the API's body parser and the console's form middleware run it.

The rules fail closed: an innocent ``{"error": "timeout"}`` or "the bearer of this note"
is refused too, and the worker renames the field (``error_code``) or rewords the text.

Without Django (``ledger.errors`` too), so the rules can be read, reused (the log filter and
the URL and form middleware use the same normal form and detectors) and tested on their own.
"""

import functools
import re
from collections.abc import Iterator, Sequence

from detect_secrets.plugins.keyword import DENYLIST as KEYWORD_DENYLIST

from ledger.boundary.normal import MAX_TEXT, normal_forms, normalised
from ledger.boundary.rules import KNOWN_FORMATS, VALUE_RULES, detect, triggered
from ledger.errors import ForbiddenField

__all__ = [
    "CREDENTIAL",
    "FENCING_TOKEN",
    "KNOWN_FORMATS",
    "RAW_PAYLOAD",
    "VALUE_RULES",
    "check_fields",
    "check_request",
    "check_text",
    "check_texts",
    "classify_key",
    "credential_kind",
    "key_words",
    "normalised",
    "path_segment",
]

# --- forbidden keys ---------------------------------------------------------------------
# Every name is written with "_" between words; keys are compared in the same form and in
# the compact form without separators, so "apikey", "APIKEY" and "api-key" all match "api_key".

CREDENTIAL_WORDS = frozenset(
    {
        "authorization",
        "authorisation",
        "bearer",
        "password",
        "passwords",
        "passwd",
        "passphrase",
        "pwd",  # also "print working directory"; a working directory is called "cwd"
        "secret",
        "secrets",
        "cookie",
        "cookies",
        "set_cookie",
        "credentials",  # a bag of secrets; "credential_ref" / "credential_version" are fine
        "pass",  # pass=..., db_pass; "bypass" and "passes" are other words
        "contrasena",
    }
)

CREDENTIAL_ENDINGS = frozenset(
    {
        "api_key",
        "access_key",
        "private_key",
        "secret_key",
        "signing_key",
        "encryption_key",
        "master_key",
        "session_key",
        "auth_key",
        "ssh_key",
        "credential",
        "auth",
        "jwt",
        "otp",
        "totp",
        # detect-secrets' keyword plugin's names (api_?key, db_?pass, priv_?key ...), in this form
        *(name.replace("_?", "_") for name in KEYWORD_DENYLIST if name.isascii()),
    }
)

# Keys ending in "token" are credentials (access_token, refresh_token, id_token,
# session_token, github_token, token ...) except these names of Fenceline's fencing tokens,
# which are integers; a string under one of them is refused like any other token.
FENCING_TOKEN_KEYS = frozenset(
    {"fencing_token", "previous_token", "presented_token", "current_token", "dispatch_token"}
)

RAW_PAYLOAD_ENDINGS = frozenset(
    {
        # tool arguments
        "args",
        "arguments",
        "kwargs",
        "params",
        "parameters",
        "input",
        "inputs",
        # requests and responses
        "header",
        "headers",
        "body",
        "payload",
        "request",
        "response",
        # prompts and user content
        "prompt",
        "prompts",
        # provider errors and crash dumps: keep an error_code
        "error",
        "errors",
        "error_message",
        "exception",
        "exception_message",
        "traceback",
        "stack_trace",
        "stacktrace",
        # child-tool output: keep a digest or a reference
        "output",
        "outputs",
        "stdout",
        "stderr",
        # browser state and files
        "local_storage",
        "session_storage",
        "storage_state",
        "snapshot",
        "snapshots",
        "screenshot",
        "screenshots",
        "html",
        "har",
        "attachment",
        "attachments",
        "file_content",
        "file_contents",
        # process environment
        "environ",
        "env_vars",
        "environment_variables",
    }
)
RAW_PAYLOAD_FIRST_WORDS = frozenset({"raw"})  # raw_error, rawResponse, raw_body ...

CREDENTIAL = "credential"
RAW_PAYLOAD = "raw payload"
FENCING_TOKEN = "fencing token"  # noqa: S105 - the name of a rule, not a secret

_CAMEL_ACRONYM = re.compile(r"([A-Z]+)([A-Z][a-z])")  # APIKey -> API_Key
_CAMEL_WORD = re.compile(r"([a-z0-9])([A-Z])")  # apiKey -> api_Key
_SEPARATORS = re.compile(r"[^a-z0-9]+")
_NAME_LIKE = re.compile(r"[A-Za-z0-9_\-]{1,64}")


def key_words(key: str) -> tuple[str, ...]:
    """``"X-Api-Key"`` -> ``("x", "api", "key")``; camelCase, dashes and case do not matter."""
    spaced = _CAMEL_WORD.sub(r"\1_\2", _CAMEL_ACRONYM.sub(r"\1_\2", key))
    return tuple(word for word in _SEPARATORS.split(spaced.lower()) if word)


def _compact(names: frozenset[str]) -> frozenset[str]:
    return frozenset(name.replace("_", "") for name in names)


_CREDENTIAL_WORDS = _compact(CREDENTIAL_WORDS)
_CREDENTIAL_ENDINGS = _compact(CREDENTIAL_ENDINGS)
_RAW_PAYLOAD_ENDINGS = _compact(RAW_PAYLOAD_ENDINGS)
_FENCING_TOKEN_KEYS = _compact(FENCING_TOKEN_KEYS)


def classify_key(key: str) -> str | None:
    """CREDENTIAL, RAW_PAYLOAD or FENCING_TOKEN (allowed for integers only); None when the
    key may carry any value that passes the value rules. Judged in the key's normal form."""
    words = key_words(normalised(key))
    if not words:
        return None
    if "".join(words) in _FENCING_TOKEN_KEYS or words[-2:] == ("fencing", "token"):
        return FENCING_TOKEN
    # Every run of up to three consecutive words, compacted: "set cookie" -> "setcookie".
    grams = {"".join(words[i : i + n]) for n in (1, 2, 3) for i in range(len(words) - n + 1)}
    if grams & _CREDENTIAL_WORDS:
        return CREDENTIAL
    endings = {"".join(words[-n:]) for n in (1, 2, 3)}
    if endings & _CREDENTIAL_ENDINGS or words[-1].endswith("token"):
        return CREDENTIAL
    if endings & _RAW_PAYLOAD_ENDINGS or words[0] in RAW_PAYLOAD_FIRST_WORDS:
        return RAW_PAYLOAD
    return None


def credential_kind(text: str, *, remember: bool = True) -> str | None:
    """The name of the first value rule that matches anywhere in ``text`` (judged in its
    normal form), or None. Short values (tool names, resources, owners) come again and again:
    those that pass are remembered (never those refused: no credential is kept in memory).
    Callers judging one-off texts (log lines, URLs) pass ``remember=False``."""
    if text in _CLEAN or _SYSTEM_FORM.fullmatch(text):
        return None
    kind = _kind(text)
    if kind is None and remember and len(text) <= 256:
        if len(_CLEAN) >= _CLEAN_MAX:
            _CLEAN.clear()
        _CLEAN.add(text)
    return kind


_CLEAN: set[str] = set()
_CLEAN_MAX = 16384
# The forms Fenceline writes its own values in, which no rule refuses (tests/unit/
# test_boundary.py holds that): an id (canonical UUID, or its 32 hex digits: request ids), a
# chain hash, a time as events carry it. They come once each, so remembering them would only
# churn _CLEAN.
_SYSTEM_FORM = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    r"|[0-9a-f]{32}"
    r"|sha256:[0-9a-f]{64}"
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z"
)


def _kind(text: str) -> str | None:
    if len(text) > MAX_TEXT:
        return "too_long_to_judge"
    forms, settled = normal_forms(text)
    if not settled:
        return "encoded_too_deeply"
    for form in forms:
        kind = detect(form)
        if kind is not None:
            return kind
    return None


def path_segment(key: str) -> str:
    """``key`` as it may appear in a path shown to the caller: identifier-like keys as they
    are, anything else (spaces, punctuation, very long or credential-like keys) as ``*``."""
    if _NAME_LIKE.fullmatch(key) and credential_kind(key) is None:
        return key
    return "*"


@functools.lru_cache(maxsize=4096)
def _cached_key_rules(key: str) -> tuple[str | None, str | None]:
    return credential_kind(key), classify_key(key)


def _key_rules(key: str) -> tuple[str | None, str | None]:
    """(credential_kind, classify_key) of a key; the same keys come again and again."""
    if len(key) <= 128:
        return _cached_key_rules(key)
    return credential_kind(key), classify_key(key)


def _join(path: str, segment: str) -> str:
    return f"{path}.{segment}" if path else segment


def _refuse(path: str, rule: str, detail: str) -> ForbiddenField:
    return ForbiddenField(detail, path=path or "(top level)", rule=rule)


_HINTS = {
    CREDENTIAL: "credentials are never accepted; send a reference such as credential_ref",
    FENCING_TOKEN: "a fencing token is an integer",
    RAW_PAYLOAD: (
        "raw payloads (tool arguments, headers, bodies, prompts, error text, tool output, "
        "browser state, files) are never accepted; send a digest, a reference or a code"
    ),
}


def check_text(value: str, *, path: str) -> None:
    """Refuse a single string that looks like a credential anywhere inside it."""
    kind = credential_kind(value)
    if kind is not None:
        raise _refuse(path, "credential-like value", f"credential-like value at {path} ({kind.replace('_', ' ')})")


def check_fields(value: object, *, root: str = "") -> None:
    """Walk nested dicts and lists and refuse the first forbidden key or credential-like
    value, by path (``root.key.3.key``). Paths start at ``root``, or at the first key."""
    raw_payload: tuple[str, str] | None = None  # the first raw-payload key: reported last
    stack: list[tuple[str, object]] = [(root, value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, dict):
            children = []
            for key, child in item.items():
                key = key if isinstance(key, str) else str(key)
                key_credential, kind = _key_rules(key)
                if key_credential is not None:
                    where = _join(path, "*")
                    raise _refuse(where, "credential-like value", f"credential-like value in a key at {where}")
                child_path = _join(path, key if _NAME_LIKE.fullmatch(key) else "*")
                if kind == CREDENTIAL or (
                    kind == FENCING_TOKEN and (isinstance(child, bool) or not isinstance(child, int | None))
                ):
                    raise _refuse(child_path, "forbidden key", f"forbidden key at {child_path}: {_HINTS[kind]}")
                if kind == RAW_PAYLOAD and raw_payload is None:
                    raw_payload = (child_path, f"forbidden key at {child_path}: {_HINTS[RAW_PAYLOAD]}")
                children.append((child_path, child))
            stack.extend(reversed(children))  # depth first, in document order
        elif isinstance(item, list | tuple):
            stack.extend(reversed([(_join(path, str(index)), child) for index, child in enumerate(item)]))
        elif isinstance(item, str):
            check_text(item, path=path or "(top level)")
        elif item is not None and not isinstance(item, bool | int | float):
            check_text(str(item), path=path or "(top level)")
    if raw_payload is not None:
        raise _refuse(raw_payload[0], "forbidden key", raw_payload[1])


# --- a request's texts together -------------------------------------------------------------
# A credential split across fields (``{"a": "sk_live_4eC39H", "b": "qLyjWDarjtT1zdp7dc"}``)
# passes each field alone, so the texts of one request are judged together too: all of them
# joined in order and in reverse (a split between neighbours, whatever the detector), and,
# when a request has at most PAIRED_TEXTS strings, each string that holds the start of a
# credential the value rules know (a trigger: ``sk_live_``, ``xox``, ``Bearer`` ...) joined
# with each other string (a split between fields apart, in either order).
PAIRED_TEXTS = 32
Texts = Sequence[tuple[str, str]]


def _joined_kind(texts: Texts, order: Sequence[int]) -> str | None:
    return credential_kind("".join(texts[index][1] for index in order), remember=False)


def _narrowed(texts: Texts, order: Sequence[int]) -> tuple[int, int]:
    """The first and last index of the shortest run of ``order`` whose join still looks like
    a credential (a binary search from each end: a few judgments, however many texts)."""
    low, high = 0, len(order) - 1
    while low < high:  # the latest start that still hits
        middle = (low + high + 1) // 2
        low, high = (middle, high) if _joined_kind(texts, order[middle:]) else (low, middle - 1)
    start, low, high = low, low, len(order) - 1
    while low < high:  # the earliest end that still hits
        middle = (low + high) // 2
        low, high = (low, middle) if _joined_kind(texts, order[start : middle + 1]) else (middle + 1, high)
    return order[start], order[low]


def _masked(path: str, parts: str) -> str:
    """``path`` with any segment of 4+ characters that is part of the split credential (a key
    can be) as ``*``."""
    return ".".join("*" if len(segment) >= 4 and segment.lower() in parts else segment for segment in path.split("."))


def _split_refusal(texts: Texts, order: Sequence[int], kind: str) -> ForbiddenField:
    first, last = _narrowed(texts, order) if len(order) > 2 else (order[0], order[-1])
    parts = (texts[first][1] + texts[last][1]).lower()
    where, to = _masked(texts[first][0], parts), _masked(texts[last][0], parts)
    detail = f"credential-like value split across {where} and {to} ({kind.replace('_', ' ')})"
    return _refuse(to, "credential-like value", detail)


def _orders(texts: Texts, *, pairs: bool) -> Iterator[Sequence[int]]:
    indexes = list(range(len(texts)))
    if pairs and len(texts) <= PAIRED_TEXTS:
        starts = [index for index, (_, text) in enumerate(texts) if triggered(normalised(text))]
        # the fields after it first, nearest first: the refusal names the likeliest second half
        yield from ((a, b) for a in starts for b in indexes[a + 1 :] + indexes[:a][::-1])
    yield indexes
    if pairs:
        yield indexes[::-1]


def _check_together(texts: Texts, *, pairs: bool) -> None:
    texts = [(path, text) for path, text in texts if text]
    if len(texts) < 2:
        return
    for order in _orders(texts, pairs=pairs):
        kind = _joined_kind(texts, order)
        if kind is not None:
            raise _split_refusal(texts, order, kind)


def check_texts(texts: Texts) -> None:
    """Refuse the first (path, text) that looks like a credential, then the texts together."""
    for path, text in texts:
        check_text(text, path=path)
    _check_together(texts, pairs=True)


def request_texts(value: object, *, root: str = "") -> list[tuple[str, str, bool]]:
    """Every key and string of a JSON document as (path, text, whether it is a key), in
    document order; a credential-like key is refused on the way (its path ends in ``*``)."""
    texts: list[tuple[str, str, bool]] = []
    stack: list[tuple[str, object, bool]] = [(root, value, False)]
    while stack:
        path, item, is_key = stack.pop()
        if isinstance(item, dict):
            children: list[tuple[str, object, bool]] = []
            for key, child in item.items():
                key = key if isinstance(key, str) else str(key)
                if _key_rules(key)[0] is not None:
                    where = _join(path, "*")
                    raise _refuse(where, "credential-like value", f"credential-like value in a key at {where}")
                child_path = _join(path, key if _NAME_LIKE.fullmatch(key) else "*")
                children.extend(((child_path, key, True), (child_path, child, False)))
            stack.extend(reversed(children))
        elif isinstance(item, list | tuple):
            stack.extend(reversed([(_join(path, str(index)), child, False) for index, child in enumerate(item)]))
        elif isinstance(item, str):
            texts.append((path or "(top level)", item, is_key))
    return texts


def check_request(value: object, *, root: str = "") -> None:
    """Every key and string of a request's document through the value rules, alone and
    together: its strings by :func:`check_texts`, then, when it has objects of the caller's own
    below the top level (event fields, checkpoint state), their keys and the strings joined in
    document order (a key can hold half of a credential). The API's body parser runs it on
    every body."""
    texts = request_texts(value, root=root)
    check_texts([(path, text) for path, text, is_key in texts if not is_key])
    # The keys of the caller's own objects (fields, state, evidence), not a schema's names.
    if any(is_key and "." in path for path, _, is_key in texts):
        _check_together([(path, text) for path, text, is_key in texts if not is_key or "." in path], pairs=True)
