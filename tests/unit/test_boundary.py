"""The secret boundary refuses forbidden keys and credential-like values by path, and never
repeats the value it refused."""

import hashlib
import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger import boundary
from ledger.boundary import (
    check_fields,
    check_text,
    classify_key,
    credential_kind,
    key_words,
    path_segment,
)
from ledger.chain import format_time
from ledger.errors import DomainError, ForbiddenField

SECRET = "CANARY_UNIT_7d2e"


def refusal(value, root="fields") -> ForbiddenField:
    with pytest.raises(ForbiddenField) as caught:
        check_fields(value, root=root)
    return caught.value


def assert_not_echoed(exc: ForbiddenField, secret: str = SECRET) -> None:
    for text in (str(exc), exc.detail, exc.path, repr(exc.args), repr(exc.extra)):
        assert secret not in text
        assert secret.lower() not in text.lower()


@pytest.mark.parametrize(
    "key",
    [
        "authorization",
        "Authorization",
        "AUTHORIZATION",
        "HTTP_AUTHORIZATION",
        "proxy-authorization",
        "access_token",
        "accessToken",
        "AccessToken",
        "access-token",
        "api_key",
        "apiKey",
        "APIKey",
        "apikey",
        "X-Api-Key",
        "x_api_key",
        "github_api_key",
        "cookie",
        "Cookie",
        "cookies",
        "set_cookie",
        "Set-Cookie",
        "setCookie",
        "private_key",
        "privateKey",
        "password",
        "Password",
        "db_password",
        "passwd",
        "passphrase",
        "secret",
        "client_secret",
        "clientSecret",
        "aws_secret_access_key",
        "refresh_token",
        "id_token",
        "idToken",
        "session_token",
        "bearer_token",
        "github_token",
        "token",
        "credentials",
        "basic_auth",
        "jwt",
    ],
)
def test_credential_keys_are_refused_in_every_spelling(key):
    exc = refusal({"step": 1, "args": {"title": "rotate the key", key: SECRET}})
    assert exc.code == "FORBIDDEN_FIELD"
    assert isinstance(exc, DomainError)
    assert exc.path == f"fields.args.{key}"
    assert exc.rule == "forbidden key"
    assert exc.extra == {"path": exc.path, "rule": "forbidden key"}
    assert_not_echoed(exc)


@pytest.mark.parametrize(
    "key",
    [
        "args",
        "arguments",
        "tool_args",
        "kwargs",
        "params",
        "input",
        "headers",
        "request_headers",
        "request_body",
        "responseBody",
        "body",
        "payload",
        "retry_payload",
        "request",
        "response",
        "prompt",
        "system_prompt",
        "error",
        "errors",
        "error_message",
        "errorMessage",
        "exception",
        "raw_error",
        "rawResponse",
        "traceback",
        "stack_trace",
        "stackTrace",
        "output",
        "tool_output",
        "stdout",
        "stderr",
        "local_storage",
        "localStorage",
        "session_storage",
        "sessionStorage",
        "storageState",
        "snapshot",
        "screenshot",
        "html",
        "attachments",
        "file_contents",
        "environ",
    ],
)
def test_raw_payload_keys_are_refused(key):
    exc = refusal({"note": "ok", key: {"anything": SECRET}})
    assert (exc.path, exc.rule) == (f"fields.{key}", "forbidden key")
    assert "never accepted" in exc.detail
    assert_not_echoed(exc)


@pytest.mark.parametrize(
    "key, value",
    [
        # Fenceline's own field names ...
        ("fencing_token", 3),
        ("previous_token", 2),
        ("presented_token", 1),
        ("current_token", 4),
        ("dispatch_token", None),
        ("idempotency_key", "deploy:repo-a:91c2"),
        ("credential_ref", "github-write-lease-7"),
        ("credential_version", 18),
        ("provider_request_id", "req_01J9ZK"),
        ("error_code", "E_TIMEOUT"),
        ("args_digest", "sha256:" + "a" * 64),
        ("operation_id", "0b9d3a52-3f8c-4b53-9c2e-0d9e3f0a1b2c"),
        ("case_id", 17),
        ("owner_id", "worker-a"),
        ("external_id", "ticket-4411"),
        ("expires_at", "2026-12-02T10:00:00.000001Z"),
        ("reason", "token_changed"),
        ("attempted", "operation.outcome"),
        ("key_id", "local-1"),
        # ... and the article's allow-listed event shape, and usage counters.
        ("action", "tool.dispatch"),
        ("tool_name", "github.create_issue"),
        ("resource", "repo:acme/widgets"),
        ("decision", "allow"),
        ("request_id", "req-456"),
        ("duration_ms", 1200),
        ("prompt_tokens", 812),
        ("output_tokens", 64),
        ("max_tokens", 4096),
        ("message", "retrying after a timeout"),
        ("url", "https://api.example.com/v1/issues"),
        ("resource", "mailto:ops@example.com"),
    ],
)
def test_legitimate_fields_pass(key, value):
    check_fields({key: value, "nested": [{key: value}]}, root="fields")
    assert classify_key(key) in (None, "fencing token")


@pytest.mark.parametrize("key", ["fencing_token", "previous_token", "current_token", "dispatch_token"])
def test_a_fencing_token_name_holding_a_string_is_refused(key):
    exc = refusal({key: SECRET})
    assert (exc.path, exc.rule) == (f"fields.{key}", "forbidden key")
    assert_not_echoed(exc)


@pytest.mark.parametrize(
    "value",
    [
        f"Bearer {SECRET}",
        f"called the API with bearer {SECRET} and got 401",
        f"BEARER\t{SECRET}",
        f"Authorization: Basic {SECRET}",
        f"Cookie: sid={SECRET}",
        f"set-cookie: session={SECRET}; Path=/",
        f"-----BEGIN RSA PRIVATE KEY-----\n{SECRET}\n-----END RSA PRIVATE KEY-----",
        f"key: -----BEGIN OPENSSH PRIVATE KEY----- {SECRET}",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJDQU5BUlkifQ.c2lnbmF0dXJl " + SECRET,
        f"AKIAIOSFODNN7EXAMPLE {SECRET}",
        f"ASIAABCDEFGHIJKLMNOP {SECRET}",
        f"ghp_{'A1b2' * 9} {SECRET}",
        f"token gho_{'z' * 36} {SECRET}",
        f"ghs_{'Q' * 36} {SECRET}",
        f"ghu_{'9' * 36} {SECRET}",
        f"github_pat_11AAAAAAA0{'b' * 40} {SECRET}",
        f"xoxb-1234567890-{SECRET}",
        f"xoxp-1234567890-{SECRET}",
        f"xoxa-2-abcdefghij-{SECRET}",
        f"xoxr-1234567890-{SECRET}",
        f"sk-proj-{SECRET}abcdef123",
        f"sk-ant-api03-{SECRET}xyz",
        f"sk_live_4eC39HqLyjWDarjtT1zdp7dc {SECRET}",
        f"rk_live_51H8xyzABCDEF {SECRET}",
        f"pk_live_51H8xyzABCDEF {SECRET}",
        f"AIzaSyD-{'x' * 31} {SECRET}",
        f"glpat-{'x1' * 10} {SECRET}",
        f"flw_{'Zq9-' * 10} {SECRET}",
        f"postgres://app:{SECRET}@db.internal:5432/prod",
        f"https://api.example.com/hook?api_key={SECRET}",
        f"password={SECRET}",
        f'{{"client_secret": "{SECRET}"}}',
    ],
)
def test_credential_like_values_are_refused_anywhere_in_a_string(value):
    exc = refusal({"list": [0, 1, 2, {"note": value}]})
    assert (exc.path, exc.rule) == ("fields.list.3.note", "credential-like value")
    assert_not_echoed(exc)
    with pytest.raises(ForbiddenField) as caught:
        check_text(value, path="resource")
    assert caught.value.path == "resource"
    assert_not_echoed(caught.value)


@pytest.mark.parametrize(
    "text",
    [
        "task-abcdefghijklmnopqrstuvwxyz",  # "sk-" inside a word
        "risk-assessment-2026-quarterly-report",
        "sk-learn-compatible-model",  # no digit: not an OpenAI-style key
        "flw_wrong",  # too short to be a worker token
        "https://user@example.com/repo",  # a user, no password
        "fencing token 3 was refused",
        "placeholder policy: allow",
        "sha256:" + "0" * 64,
        "AKIA",
    ],
)
def test_ordinary_text_passes(text):
    check_text(text, path="note")


def test_paths_start_at_the_first_key_without_a_root():
    assert refusal({"outer": {"Authorization": "x"}}, root="").path == "outer.Authorization"
    assert refusal({"tool": f"Bearer {SECRET}"}, root="").path == "tool"
    assert refusal([{"a": 1}, {"b": f"Bearer {SECRET}"}], root="").path == "1.b"
    assert refusal(f"Bearer {SECRET}", root="").path == "(top level)"


def test_a_credential_like_key_is_refused_without_naming_the_key():
    key = f"Bearer {SECRET}"
    exc = refusal({"headers_seen": {key: True}})
    assert exc.path == "fields.headers_seen.*"
    assert exc.rule == "credential-like value"
    assert_not_echoed(exc)


def test_keys_that_do_not_look_like_names_appear_as_a_star():
    exc = refusal({"password hunter2=yes": 1})
    assert exc.path == "fields.*"
    assert "hunter2" not in str(exc)
    assert path_segment("owner_id") == "owner_id"
    assert path_segment("a key with spaces") == "*"
    assert path_segment("x" * 65) == "*"
    assert path_segment(f"ghp_{'a' * 36}") == "*"


def test_a_credential_anywhere_is_reported_before_a_raw_payload_key():
    exc = refusal({"headers": {"Accept": "text/html"}, "summary": f"used Bearer {SECRET}"})
    assert (exc.path, exc.rule) == ("fields.summary", "credential-like value")
    exc = refusal({"args": {"authorization": SECRET}})
    assert exc.path == "fields.args.authorization"
    exc = refusal({"args": {"title": SECRET}, "later": {"deep": [1]}})
    assert exc.path == "fields.args"


def test_non_string_scalars_pass_and_nesting_is_walked_in_document_order():
    check_fields({"a": 1, "b": 2.5, "c": True, "d": None, "e": [[], {}], "f": {"g": [1, "two"]}})
    exc = refusal({"first": [{"x": f"Bearer {SECRET}"}], "second": {"password": 1}})
    assert exc.path == "fields.first.0.x"


def test_deep_nesting_does_not_exhaust_the_stack():
    value: object = f"Bearer {SECRET}"
    for _ in range(5000):
        value = [value]
    exc = refusal(value, root="")
    assert exc.path == ".".join(["0"] * 5000)


def test_key_words_split_case_camel_case_and_separators():
    assert key_words("X-Api-Key") == ("x", "api", "key")
    assert key_words("APIKey") == key_words("apiKey") == key_words("api_key") == ("api", "key")
    assert key_words("HTTP_AUTHORIZATION") == ("http", "authorization")
    assert key_words("oauth2Token") == ("oauth2", "token")


# --- the normal form (issue 11) -------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, normal",
    [
        ("pass%3Dword", "pass=word"),
        ("pass%253Dword", "pass=word"),  # twice encoded
        ("pa\u200bss\u200dword", "password"),  # zero-width space and joiner
        ("\uff50\uff41\uff53\uff53", "pass"),  # fullwidth
        ("\u0440\u0430ss", "pass"),  # Cyrillic er and a
        ("line\none\ttab", "line\none\ttab"),  # whitespace is kept
        ("100%", "100%"),
        ("caf\u00e9", "caf\u00e9"),  # an accented Latin letter is Latin already
    ],
)
def test_the_normal_form(raw, normal):
    assert boundary.normalised(raw) == normal


@pytest.mark.parametrize(
    "text",
    [
        "sha256:" + "0123456789abcdef" * 4,  # a hex digest
        "3f2b8c1e-9d4a-4e5f-8a6b-7c8d9e0f1a2b",  # a UUID
        "dGhpcyBpcyBqdXN0IGEgYmFzZTY0dXJsIGlk",  # base64url without + or /: an id, not a key
        "mailto:ops@example.com",
        "https://example.com/a%20b?page=2",
        "pass rate 98%, token count 12",
    ],
)
def test_ordinary_values_pass(text):
    assert boundary.credential_kind(text) is None


@pytest.mark.parametrize(
    "text, kind",
    [
        ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "high_entropy_string"),
        ("SK" + "0123456789abcdef" * 2, "known_credential_format"),  # Twilio, from detect-secrets
        ("-----begin openssh private key-----", "pem_block"),
        ("api_token=abc123", "secret_assignment"),
        ("credential: s3cr3t", "secret_assignment"),
    ],
)
def test_credentials_the_old_rules_missed(text, kind):
    assert boundary.credential_kind(text) == kind


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    value=st.uuids().map(str)
    | st.uuids().map(lambda u: u.hex)
    | st.binary(min_size=16, max_size=16).map(bytes.hex)
    | st.binary(min_size=32, max_size=32).map(lambda b: "sha256:" + hashlib.sha256(b).hexdigest())
    | st.datetimes(
        min_value=datetime(2000, 1, 1),  # noqa: DTZ001 - hypothesis takes naive bounds; timezones= makes values aware
        max_value=datetime(2999, 12, 31),  # noqa: DTZ001
        timezones=st.just(UTC),
    ).map(format_time)
)
def test_the_forms_fenceline_writes_its_own_values_in_never_meet_a_rule(value):
    """credential_kind skips ids, request ids, chain hashes and event times without running
    the rules (boundary._SYSTEM_FORM); the rules themselves would pass every one of them too."""
    assert boundary._SYSTEM_FORM.fullmatch(value)
    assert boundary._kind(value) is None
    assert credential_kind(value) is None


def test_a_credential_next_to_an_id_is_still_refused():
    assert credential_kind(f"api_key={uuid.uuid4()}") == "secret_assignment"


# --- the normal form: one for every detector (issue 35) --------------------------------------

KEY = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"


def _percent(text: str, times: int) -> str:
    from urllib.parse import quote

    text = "".join(f"%{byte:02X}" for byte in text.encode())
    for _ in range(times - 1):
        text = quote(text, safe="")
    return text


@pytest.mark.parametrize(
    "disguised",
    [
        pytest.param("s\u043a_live_4eC39HqLyjWDarjtT1zdp7dc", id="Cyrillic ka"),
        pytest.param("\u0455k_\u04cfive_4eC39HqLyjWDarjtT1zdp7dc", id="Cyrillic dze and palochka"),
        pytest.param("\u034f".join(KEY), id="combining grapheme joiner"),
        pytest.param("\u3164".join(KEY), id="Hangul filler"),
        pytest.param("\ufe0f\u0336".join(KEY), id="variation selector and overlay"),
        pytest.param("\U000e0041".join(KEY), id="tag characters"),
        pytest.param(_percent(KEY, 4), id="percent-encoded 4 times"),
        pytest.param(_percent(KEY, 8), id="percent-encoded 8 times"),
        pytest.param("".join(f"&#x{ord(c):x};" for c in KEY), id="HTML references"),
        pytest.param("".join(f"\\u{ord(c):04x}" for c in KEY), id="backslash escapes"),
        pytest.param(__import__("base64").b64encode(KEY.encode()).decode(), id="base64"),
        pytest.param(KEY.encode().hex(), id="hex"),
        pytest.param(
            __import__("base64").b64encode(__import__("base64").b64encode(KEY.encode()).hex().encode()).decode(),
            id="base64 of hex of base64",
        ),
        pytest.param("note " + __import__("base64").urlsafe_b64encode(KEY.encode()).decode().rstrip("="), id="urlsafe"),
    ],
)
def test_a_disguised_key_reads_as_the_key(disguised):
    assert credential_kind(disguised, remember=False) is not None


@pytest.mark.parametrize(
    "text, kind",
    [
        ("Basic ZGVwbG95Omh1bnRlcjI=", "basic_credentials"),  # deploy:hunter2
        ("Token 9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b", "token_scheme"),
        ("Authorization: 9944b09199c62bcf", "authorization_value"),
        ("authorization=QzabcdefghijKLMNOPqrstuv", "authorization_value"),
    ],
)
def test_scheme_rules(text, kind):
    assert credential_kind(text, remember=False) == kind


@pytest.mark.parametrize(
    "text",
    [
        "Basic setup of the basic plan",
        "basic auth is off",
        "the fencing token 12",
        "token 3f2b8c1e-9d4a-4e5f-8a6b-7c8d9e0f1a2b was revoked",
        "authorization: approved by alice",
        "authorization: pending-security-review",
        "sha256:" + hashlib.sha256(b"x").hexdigest(),
        hashlib.sha256(b"y").hexdigest(),
        "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440 \u2014 \u03ba\u03b1\u03bb\u03b7\u03bc\u03ad\u03c1\u03b1",
        "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
        "100% done; 50%25 of the way, a&b, C:\\path\\to\\file",
        "internationalization and localization",
        "ZG9uZQ== is base64 for a short word",
        "https://example.com/a%20b?page=2&q=%E2%9C%93",
    ],
)
def test_ordinary_text_passes_the_normal_form(text):
    assert credential_kind(text, remember=False) is None


def test_a_text_still_changing_after_the_last_round_is_refused():
    assert credential_kind(_percent("hello there", 9), remember=False) == "encoded_too_deeply"
    assert credential_kind(_percent("hello there", 8), remember=False) is None


def test_a_text_longer_than_the_limit_is_refused_unjudged():
    from ledger.boundary.normal import MAX_TEXT

    assert credential_kind("a" * (MAX_TEXT + 1), remember=False) == "too_long_to_judge"


def test_layers_stop_at_their_depth():
    import base64

    text = KEY
    for _ in range(4):
        text = base64.b64encode(text.encode()).decode()
    assert credential_kind(text, remember=False) is None  # a fourth layer is not decoded
    assert credential_kind(base64.b64decode(text).decode(), remember=False) is not None


def test_a_key_split_across_two_fields_is_refused_at_the_second():
    from ledger.boundary import check_request

    with pytest.raises(ForbiddenField) as caught:
        check_request({"tool": "email", "a": KEY[:8], "resource": "mailto:ops@example.com", "b": KEY[8:]})
    assert caught.value.path == "b"
    assert "a and b" in caught.value.detail
    assert_not_echoed(caught.value, KEY[8:16])


@pytest.mark.parametrize(
    "document",
    [
        {
            "fencing_token": 1,
            "tool": "email",
            "action": "send",
            "resource": "mailto:ops@example.com",
            "idempotency_key": "send-report-1",
            "effect_class": "NON_RETRYABLE",
            "args_digest": "sha256:" + "ab" * 32,
        },
        {
            "fencing_token": 1,
            "type": "NOTE",
            "fields": {
                "memo": "100% done",
                "digest": "sha256:" + "0" * 64,
                "id": str(uuid.uuid4()),
                "name": "Zo\u00eb",
                "url": "https://example.com/a%20b?page=2",
            },
        },
        {"owner_id": "worker-a", "ttl_s": 30, "tool": "browser"},
        {
            "boot_id": uuid.uuid4().hex,
            "config_hash": hashlib.sha256(b"c").hexdigest(),
            "code_version": "1.4.2",
            "host": "ip-10-0-0-12",
        },
    ],
)
def test_ordinary_requests_pass_together(document):
    from ledger.boundary import check_request

    check_request(document)


def test_a_key_split_across_two_keys_is_refused_without_naming_either():
    from ledger.boundary import check_request

    with pytest.raises(ForbiddenField) as caught:
        check_request({"fencing_token": 1, "type": "NOTE", "fields": {KEY[:12]: 1, KEY[12:22]: 2}})
    assert caught.value.path == "fields.*"
    assert_not_echoed(caught.value, KEY[8:12])
    assert_not_echoed(caught.value, KEY[12:22])
