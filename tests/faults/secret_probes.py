"""Disguised-secret probes for the secret boundary (issue 35, item 1), shared by
``tests/faults/test_secret_disguises.py`` and the measurement it prints.

A probe is one request that carries a credential in one disguise (a class: a homoglyph, an
invisible character, four rounds of percent-encoding, base64, a key split across two fields,
...) in one free-text field of one endpoint. Each probe's credential has its own random core,
so searching for it is meaningful: after the probes, every row of every table is read as text
once, and so is everything the configured log handlers printed, and a probe counts as
*stored* (or *logged*) when its core or the exact text it sent (any part of it) is there.

Run the measurement (it prints the table and fails while anything is stored or logged):

    FENCELINE_PROBES_PER_CLASS=3 DATABASE_URL=... FENCELINE_TEST_REDIS_URL=... \\
      .venv/bin/pytest -p no:xdist -q -s tests/faults/test_secret_disguises.py -k measure
"""

from __future__ import annotations

import base64
import io
import json
import logging
import secrets
import string
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import quote

from django.db import connection
from django.test import Client

# --- the credentials and their disguises ---------------------------------------------------

ALPHABET = string.ascii_letters + string.digits


def core() -> str:
    """A random credential body, unique per probe: what the searches look for."""
    return "Qz" + "".join(secrets.choice(ALPHABET) for _ in range(22))


def stripe(c: str) -> str:
    return f"sk_live_{c}"


def slack(c: str) -> str:
    return f"xoxb-{c}"


def percent_times(text: str, times: int) -> str:
    """Every byte as %XX, then the result percent-encoded again ``times - 1`` times."""
    text = "".join(f"%{byte:02X}" for byte in text.encode())
    for _ in range(times - 1):
        text = quote(text, safe="")
    return text


def interleave(text: str, char: str) -> str:
    """``char`` after every character of the prefix and every fourth one of the rest."""
    return "".join(ch + (char if i < 10 or i % 4 == 0 else "") for i, ch in enumerate(text))


# name -> (function of the core -> the text sent, or (first part, second part) for a split)
DISGUISES: dict[str, Callable[[str], str | tuple[str, str]]] = {
    "plain": lambda c: stripe(c),
    "homoglyph (Cyrillic \u043a in sk_live_)": lambda c: "s\u043a_live_" + c,
    "homoglyph (Greek omicron in xoxb-)": lambda c: "x\u03bfxb-" + c,
    "combining grapheme joiner U+034F": lambda c: interleave(stripe(c), "\u034f"),
    "Hangul filler U+3164": lambda c: interleave(stripe(c), "\u3164"),
    "zero-width space and word joiner (Cf)": lambda c: interleave(stripe(c), "\u200b\u2060"),
    "soft hyphen and tag characters (Cf)": lambda c: interleave(stripe(c), "\u00ad\U000e0041"),
    "variation selector and combining marks (Mn)": lambda c: interleave(stripe(c), "\ufe0f\u0336"),
    "fullwidth letters (NFKC)": lambda c: "".join(chr(ord(ch) + 0xFEE0) for ch in "sk_live_") + c,
    "percent-encoded 4 times": lambda c: percent_times(stripe(c), 4),
    "HTML character references": lambda c: "".join(f"&#{ord(ch)};" for ch in "sk_live_") + c,
    "base64 of the key": lambda c: base64.b64encode(stripe(c).encode()).decode(),
    "urlsafe base64 of a note with the key": lambda c: (
        base64.urlsafe_b64encode(f"use {stripe(c)} now".encode()).decode().rstrip("=")
    ),
    "hex of the key": lambda c: stripe(c).encode().hex(),
    "base64 of base64 of the key": lambda c: base64.b64encode(base64.b64encode(stripe(c).encode())).decode(),
    "Basic <base64 user:pass>": lambda c: "Basic " + base64.b64encode(f"deploy:{c}".encode()).decode(),
    "Token <hex>": lambda c: "Token " + (c.encode().hex())[:40],
    "schemeless Authorization: <token>": lambda c: f"Authorization: {c}",
    "split across two fields": lambda c: (stripe(c)[:14], stripe(c)[14:]),
}

# The event type accepts only "x." and lowercase letters, digits, _ . -: what fits in it.
TYPE_DISGUISES: dict[str, Callable[[str], str]] = {
    "plain": lambda c: "x." + slack(c).lower(),
    "hex of the key": lambda c: "x." + slack(c).encode().hex(),
}


# --- the fields ----------------------------------------------------------------------------


class Worker:
    """A worker over the test client: JSON in, (status, body) out."""

    def __init__(self, token: str) -> None:
        self.client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        r = self.client.post("/api/v1" + path, data=json.dumps(body), content_type="application/json")
        try:
            return r.status_code, r.json()
        except ValueError:
            return r.status_code, {}

    def run(self, *, lease: bool = True) -> str:
        status, body = self.post("/runs", {"schema_version": 1})
        assert status == 201, body
        if lease:
            status, body2 = self.post(f"/runs/{body['run_id']}/lease", {"owner_id": "probe-owner", "ttl_s": 60})
            assert status == 200, body2
        return body["run_id"]

    def intend(self, run_id: str, **overrides: str) -> tuple[int, dict]:
        body = {
            "fencing_token": 1,
            "tool": "email",
            "action": "send",
            "resource": "mailto:ops@example.com",
            "effect_class": "NON_RETRYABLE",
            "idempotency_key": uuid.uuid4().hex[:12],
            **overrides,
        }
        return self.post(f"/runs/{run_id}/operations", body)

    def dispatched(self) -> str:
        run_id = self.run()
        status, body = self.intend(run_id)
        assert status == 201, body
        op = body["operation_id"]
        assert self.post(f"/operations/{op}/authorize", {"fencing_token": 1})[0] == 200
        assert self.post(f"/operations/{op}/dispatch", {"fencing_token": 1})[0] == 200
        return op


READY = {d: {"ok": True, "evidence": {}} for d in ("runtime", "state", "credentials", "outbound_delivery", "admission")}


def boot(w: Worker, **fields: object) -> tuple[int, dict]:
    body: dict = {
        "boot_id": uuid.uuid4().hex[:16],
        "config_hash": "cfg-1",
        "code_version": "1.0.0",
        "state_schema_version": 1,
        "pid": 4242,
        "host": "host-a",
        "readiness": json.loads(json.dumps(READY)),
    }
    for name, value in fields.items():
        if name == "message":
            body["error"] = {"kind": "crash", "message": value, "at": "2026-12-04T05:00:00Z"}
        elif name == "evidence":
            body["readiness"]["runtime"]["evidence"] = {"note": value}
        else:
            body[name] = value
    return w.post("/workers/me/boots", body)


def drain(w: Worker, a: str, b: str | None) -> tuple[int, dict]:
    return w.post("/workers/me/drain", {"deadline_s": 60, "reason": a})


def resource(w: Worker, provider: str, handle: str) -> tuple[int, dict]:
    run_id = w.run()
    body = {"fencing_token": 1, "kind": "temp_object", "provider": provider, "handle": handle}
    return w.post(f"/runs/{run_id}/resources", body)


def url_path(w: Worker, a: str, b: str | None) -> tuple[int, dict]:
    r = w.client.get("/api/v1/runs/" + quote(a, safe=""))
    return r.status_code, {}


def url_query(w: Worker, a: str, b: str | None) -> tuple[int, dict]:
    query = f"q={quote(a, safe='')}" + (f"&r={quote(b, safe='')}" if b else "")
    r = w.client.get("/api/v1/runs/" + str(uuid.uuid4()) + "?" + query)
    return r.status_code, {}


def event(w: Worker, fields: dict, type: str = "NOTE") -> tuple[int, dict]:
    return w.post(f"/runs/{w.run()}/events", {"fencing_token": 1, "type": type, "fields": fields})


# name -> send(worker, text, second part or None). A field whose request has a second
# free-text field takes the second part of a split there; the others leave the split out.
Send = Callable[[Worker, str, str | None], tuple[int, dict]]
SPLIT = "split across two fields"
FIELDS: dict[str, tuple[Send, bool]] = {
    "runs.external_id": (lambda w, a, b: w.post("/runs", {"schema_version": 1, "external_id": a}), False),
    "lease.owner_id": (
        lambda w, a, b: w.post(f"/runs/{w.run(lease=False)}/lease", {"owner_id": a, "ttl_s": 30, "tool": b or "t"}),
        True,
    ),
    "lease.tool": (
        lambda w, a, b: w.post(f"/runs/{w.run(lease=False)}/lease", {"tool": a, "owner_id": b or "o", "ttl_s": 30}),
        True,
    ),
    "checkpoint.position": (
        lambda w, a, b: w.post(
            f"/runs/{w.run()}/checkpoints", {"fencing_token": 1, "position": a, "state": {"n": b or "x"}}
        ),
        True,
    ),
    "checkpoint.state": (
        lambda w, a, b: w.post(
            f"/runs/{w.run()}/checkpoints", {"fencing_token": 1, "position": "p", "state": {"a": a, "b": b or "x"}}
        ),
        True,
    ),
    "cancel.reason": (lambda w, a, b: w.post(f"/runs/{w.run()}/cancel", {"reason": a}), False),
    "operation.tool": (lambda w, a, b: w.intend(w.run(), tool=a, action=b or "send"), True),
    "operation.action": (lambda w, a, b: w.intend(w.run(), action=a, resource=b or "r"), True),
    "operation.resource": (lambda w, a, b: w.intend(w.run(), resource=a, idempotency_key=b or "k1"), True),
    "operation.idempotency_key": (lambda w, a, b: w.intend(w.run(), idempotency_key=a, provider=b or ""), True),
    "operation.provider": (lambda w, a, b: w.intend(w.run(), provider=a, resource=b or "r"), True),
    "outcome.provider_request_id": (
        lambda w, a, b: w.post(
            f"/operations/{w.dispatched()}/outcome",
            {"fencing_token": 1, "outcome": "CONFIRMED", "provider_request_id": a},
        ),
        False,
    ),
    "outcome.provider_ref.id": (
        lambda w, a, b: w.post(
            f"/operations/{w.dispatched()}/outcome",
            {"fencing_token": 1, "outcome": "CONFIRMED", "provider_ref": {"id": a}},
        ),
        False,
    ),
    "event.fields value": (lambda w, a, b: event(w, {"memo": a, "detail": b or "d"}), True),
    "event.fields nested value": (lambda w, a, b: event(w, {"steps": [{"note": a}, {"note": b or "d"}]}), True),
    "event.fields key": (lambda w, a, b: event(w, {a: 1, b or "memo": 2}), True),
    "drain.reason": (drain, False),
    "boot.host": (lambda w, a, b: boot(w, host=a, code_version=b or "1.0"), True),
    "boot.code_version": (lambda w, a, b: boot(w, code_version=a, host=b or "h"), True),
    "boot.config_hash": (lambda w, a, b: boot(w, config_hash=a, code_version=b or "1.0"), True),
    "boot.error.message": (lambda w, a, b: boot(w, message=a, host=b or "h"), True),
    "boot.readiness evidence": (lambda w, a, b: boot(w, evidence=a, host=b or "h"), True),
    "resource.provider": (lambda w, a, b: resource(w, a, b or "handle-1"), True),
    "resource.handle": (lambda w, a, b: resource(w, b or "prov", a), True),
    # not stored, but printed by a log line if anything is: the path of a 404, a query string
    "url.path": (url_path, False),
    "url.query": (url_query, True),
}
FRESH_WORKER = {"drain.reason", "boot.host", "boot.code_version", "boot.config_hash", "boot.error.message"}
FRESH_WORKER |= {"boot.readiness evidence"}


# --- where a probe could end up ------------------------------------------------------------


def database_text() -> str:
    """Every row of every table as PostgreSQL prints it (all columns, json and text alike)."""
    parts = []
    with connection.cursor() as cursor:
        for table in sorted(connection.introspection.table_names(cursor)):
            name = connection.ops.quote_name(table)
            cursor.execute(f"SELECT coalesce(string_agg(t::text, E'\\n'), '') FROM {name} AS t")  # noqa: S608
            parts.append(cursor.fetchone()[0])
    return "\n".join(parts)


class PrintedLogs:
    """What the handlers configured by console/settings.py print, while open."""

    def __init__(self) -> None:
        loggers = [logging.getLogger()] + [
            lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
        ]
        handlers = [h for lg in loggers for h in lg.handlers if isinstance(h, logging.StreamHandler)]
        handlers = [h for h in handlers if not type(h).__module__.startswith("_pytest")]
        assert handlers, "console/settings.py LOGGING installs a stream handler"
        self.printed = io.StringIO()
        self._saved = [(h, h.setStream(self.printed)) for h in handlers]
        self._levels = [(lg, lg.level) for lg in loggers]
        logging.getLogger().setLevel(logging.DEBUG)

    def close(self) -> None:
        for handler, stream in self._saved:
            handler.setStream(stream)
        for lg, level in self._levels:
            lg.setLevel(level)

    def text(self) -> str:
        return self.printed.getvalue()


# --- the matrix ----------------------------------------------------------------------------


@dataclass
class Probe:
    disguise: str
    field: str
    needles: list[str]
    status: int = 0


@dataclass
class Tally:
    sent: int = 0
    stored: int = 0
    logged: int = 0
    fields_stored: set[str] = field(default_factory=set)


def found(needles: list[str], haystack: str) -> bool:
    return any(n.lower() in haystack for n in needles if len(n) >= 8)


def send_probes(new_worker: Callable[[], Worker], per_class: int, disguises: list[str] | None = None) -> list[Probe]:
    """``per_class`` probes of every disguise (or of ``disguises``) in every field that takes it."""
    probes: list[Probe] = []
    shared = new_worker()
    for name in disguises or [*DISGUISES, "event type"]:
        for field_name, (send, two_fields) in FIELDS.items() if name != "event type" else ():
            if name == SPLIT and not two_fields:
                continue
            for _ in range(per_class):
                c = core()
                made = DISGUISES[name](c)
                first, second = made if isinstance(made, tuple) else (made, None)
                worker = new_worker() if field_name in FRESH_WORKER else shared
                status, _ = send(worker, first, second)
                needles = [c, first] + ([second] if second else [])
                probes.append(Probe(name, field_name, needles, status))
        if name == "event type":
            for type_name, make in TYPE_DISGUISES.items():
                for _ in range(per_class):
                    c = core()
                    text = make(c)
                    status, _ = event(shared, {"memo": "m"}, type=text)
                    probes.append(Probe(f"event type: {type_name}", "event.type", [c.lower(), text], status))
    return probes


def tally(probes: list[Probe], stored_text: str, logged_text: str) -> dict[str, Tally]:
    stored_text, logged_text = stored_text.lower(), logged_text.lower()
    table: dict[str, Tally] = {}
    for probe in probes:
        row = table.setdefault(probe.disguise, Tally())
        row.sent += 1
        if found(probe.needles, stored_text):
            row.stored += 1
            row.fields_stored.add(probe.field)
        if found(probe.needles, logged_text):
            row.logged += 1
    return table


def render(table: dict[str, Tally]) -> str:
    lines = [f"{'class':52} {'sent':>5} {'stored':>7} {'logged':>7}  fields stored"]
    total = Tally()
    for name, row in table.items():
        lines.append(f"{name:52} {row.sent:5} {row.stored:7} {row.logged:7}  {len(row.fields_stored)}")
        total.sent += row.sent
        total.stored += row.stored
        total.logged += row.logged
        total.fields_stored |= row.fields_stored
    lines.append(f"{'total':52} {total.sent:5} {total.stored:7} {total.logged:7}  {len(total.fields_stored)}")
    lines.extend(
        f"  {name} stored in: {', '.join(sorted(row.fields_stored))}" for name, row in table.items() if row.stored
    )
    return "\n".join(lines)
