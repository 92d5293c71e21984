"""The secret boundary's detectors (``ledger.boundary``): what makes a text credential-like.

Each detector reads one normal form of a text (``ledger.boundary.normal``):

* **Own rules** (:data:`VALUE_RULES`), where they are broader than a maintained detector:
  the scheme words and header lines (``Bearer``, ``Basic <base64 of user:password>``,
  ``Token <hex>``, ``Authorization:`` with a scheme or a bare token, ``Cookie:``), PEM
  blocks, JWTs, URLs with a password, ``password=...``-style assignments, and the prefixes of
  well-known keys at shorter lengths than detect-secrets asks for (AWS, GitHub, Slack,
  OpenAI/Anthropic, Stripe live and test, restricted and publishable, Google, GitLab) and of
  Fenceline's own worker tokens (``flw_``) and webhook signing secrets (``whsec_``).
* **detect-secrets' maintained plugins** for every other known format
  (:data:`KNOWN_FORMATS`: each regex detector but the public-IP one: Twilio, SendGrid,
  Slack webhooks, npm, PyPI, Discord, Mailchimp, Square, Azure, IBM, Artifactory, ...) and
  for entropy (base64 runs of 32+ characters with ``+`` or ``/`` above its limit: a bare AWS
  secret key). Its keyword and hex-entropy plugins are not used: the assignment rule covers
  the first, and hex digests are what Fenceline stores on purpose.
"""

import base64
import binascii
import re

from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
from detect_secrets.plugins.base import RegexBasedDetector
from detect_secrets.plugins.high_entropy_strings import Base64HighEntropyString

# (name, triggers, pattern): a text is credential-like when a pattern matches anywhere in it.
# The patterns are only tried on text that contains one of the triggers (lowercased), which
# keeps the common case, text without any trigger, to one quick search.
# Prefixes must start a word ("task-..." is not "sk-..."); patterns whose body could scan a
# long run and then fail start only at the beginning of that run, so no text makes the
# search quadratic.
_EDGE = r"(?<![A-Za-z0-9])"
_RUN_START = r"(?<![A-Za-z0-9_-])"
VALUE_RULES = (
    ("bearer_token", ("bearer",), r"(?i:\bbearer\s+[A-Za-z0-9\-._~+/]+=*)"),
    (
        "authorization_header",
        ("authorization",),
        r"(?i:\bauthorization\s*[:=]\s*(?:basic|token|digest|negotiate|aws4-hmac-sha256)\s+\S)",
    ),
    # A bare token after "Authorization:" (no scheme): 8+ token characters with a digit, or
    # 16+ in both cases ("Authorization: approved by alice" and "pending-review" pass).
    (
        "authorization_value",
        ("authorization",),
        r"(?i:\bauthorization\s*[:=]\s*[\"']?)(?:(?=[A-Za-z0-9._~+/=-]{0,256}[0-9])[A-Za-z0-9._~+/=-]{8,}"
        r"|(?=[A-Za-z0-9._~+/=]{0,256}[a-z])(?=[A-Za-z0-9._~+/=]{0,256}[A-Z])[A-Za-z0-9._~+/=]{16,})",
    ),
    ("token_scheme", ("token",), r"(?i:\btoken\s+[0-9a-f]{16,}(?![0-9a-z_-]))"),
    ("cookie_header", ("cookie",), r"(?i:\b(?:set-)?cookie\s*:\s*[^\s=;:]+=)"),
    ("pem_block", ("-----begin",), r"(?i:-----BEGIN [^\r\n-]{1,64}-----)"),
    ("jwt", ("eyj",), _RUN_START + r"eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"),
    ("url_password", ("://",), r"(?i:\b[a-z][a-z0-9+.\-]{0,30}://[^\s/?#@:]{0,256}:[^\s/?#@]{1,256}@)"),
    (
        "secret_assignment",
        ("pass", "pwd", "secret", "key", "token", "auth", "credential"),
        r"(?i:" + _EDGE + r"(?:password|passwd|pwd|pass|passphrase|secret|client[_-]?secret|api[_-]?key"
        r"|access[_-]?key|secret[_-]?key|private[_-]?key|[a-z]*[_-]?token|auth|credentials?)"
        r"[\"']?\s*[:=]\s*[\"']?[^\s\"',;&]{3,})",
    ),
    ("aws_access_key", ("akia", "asia"), _EDGE + r"(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])"),
    (
        "github_token",
        ("ghp_", "gho_", "ghs_", "ghu_", "ghr_", "github_pat_"),
        _EDGE + r"(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})",
    ),
    ("slack_token", ("xox",), _EDGE + r"xox[abeprs]-[A-Za-z0-9-]{10,}"),
    ("openai_key", ("sk-",), _RUN_START + r"sk-(?=[A-Za-z0-9_-]*[0-9])[A-Za-z0-9_-]{20,}"),
    ("stripe_key", ("_live_", "_test_"), _EDGE + r"(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{10,}"),
    ("google_api_key", ("aiza",), _EDGE + r"AIza[0-9A-Za-z_-]{30,}"),
    ("gitlab_token", ("glpat-",), _EDGE + r"glpat-[A-Za-z0-9_-]{16,}"),
    ("fenceline_worker_token", ("flw_",), _EDGE + r"flw_[A-Za-z0-9_-]{20,}"),
    ("fenceline_webhook_secret", ("whsec_",), _EDGE + r"whsec_[A-Za-z0-9_-]{20,}"),
)
# detect-secrets' regex detectors, as one search (the public-IP detector is not a credential).
_DETECTORS: list[type] = list(get_mapping_from_secret_type_to_class().values())
KNOWN_FORMATS: tuple[re.Pattern[str], ...] = tuple(
    pattern
    for detector in _DETECTORS
    if issubclass(detector, RegexBasedDetector) and detector.__name__ != "IPPublicDetector"
    for pattern in detector().denylist
)


def _scoped(pattern: re.Pattern[str]) -> str:
    flags = "".join(letter for flag, letter in ((re.I, "i"), (re.X, "x")) if pattern.flags & flag)
    return f"(?{flags}:{pattern.pattern})" if flags else f"(?:{pattern.pattern})"


_KNOWN_FORMAT = re.compile("|".join(_scoped(pattern) for pattern in KNOWN_FORMATS))
KNOWN_FORMAT_MIN_LENGTH = 10  # the shortest credential any of them matches
# Base64 runs with "+" or "/" (hex digests, UUIDs and base64url ids are never refused this way).
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/]{32,}={0,2}")
_ENTROPY = Base64HighEntropyString(limit=4.5)

_TRIGGER = re.compile(
    "|".join(re.escape(trigger) for _, triggers, _ in VALUE_RULES for trigger in (*triggers, "basic"))
)
_VALUE_PATTERN = re.compile("|".join(f"(?P<{name}>{pattern})" for name, _, pattern in VALUE_RULES))
# "Basic <credentials>": refused when the credentials decode to "user:password" text
# ("Basic setup" or "basic plan" decode to nothing of the kind).
_BASIC = re.compile(r"(?i:\bbasic\s+)([A-Za-z0-9+/]{4,}={0,2})(?![A-Za-z0-9+/=])")


def _basic_credentials(text: str) -> bool:
    for encoded in _BASIC.findall(text):
        try:
            decoded = base64.b64decode(encoded + "=" * (-len(encoded.rstrip("=")) % 4), validate=False)
            plain = decoded.decode("utf-8")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            continue
        if ":" in plain and plain.isprintable():
            return True
    return False


def _high_entropy(text: str) -> bool:
    return any(
        ("+" in run or "/" in run) and _ENTROPY.calculate_shannon_entropy(run) > _ENTROPY.entropy_limit
        for run in _BASE64_RUN.findall(text)
    )


def triggered(form: str) -> bool:
    """Whether ``form`` holds a trigger of the value rules (the start of a credential they know)."""
    return _TRIGGER.search(form.lower()) is not None


def detect(form: str) -> str | None:
    """The name of the first detector that finds a credential in ``form`` (a normal form)."""
    lowered = form.lower()
    if _TRIGGER.search(lowered) is not None:
        match = _VALUE_PATTERN.search(form)
        if match:
            return match.lastgroup
        if "basic" in lowered and _basic_credentials(form):
            return "basic_credentials"
    if len(form) >= KNOWN_FORMAT_MIN_LENGTH:
        if _KNOWN_FORMAT.search(form):
            return "known_credential_format"
        if len(form) >= 32 and _high_entropy(form):
            return "high_entropy_string"
    return None
