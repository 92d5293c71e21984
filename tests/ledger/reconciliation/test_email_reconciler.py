"""The email adapter (ledger/services/reconciliation/providers/email.py) against a real IMAP4rev1
server (pymap, in memory, on a loopback port): the worker's copy of a message, filed with the
Message-ID Fenceline builds from the key, is found by an IMAP SEARCH HEADER Message-ID and
compared whole; none is DID_NOT_HAPPEN; a refused login or a missing mailbox goes to a person;
a server that does not answer is looked up again later. The password never leaves the lookup."""

import imaplib
import logging
from email.message import EmailMessage

import pytest

from approvals.models import CaseStatus
from approvals.services.lookups import cases_look_up
from fenceline_client.provider_tags import message_id
from tests.helpers import assert_chain_intact
from tests.ledger.reconciliation.conftest import (
    CANARY,
    assert_nowhere,
    configure,
    looked_up,
    unknown_effect,
)

pytestmark = pytest.mark.django_db

DOMAIN = "mail.fenceline.test"


@pytest.fixture
def mailbox(imap_server, settings, monkeypatch, caplog):
    """The email reconciler configured against the IMAP server; returns a function that files
    a message in a mailbox over IMAP, as a worker keeping its sent mail would."""
    caplog.set_level(logging.DEBUG)
    host, port, user, password = imap_server
    monkeypatch.setenv("FENCELINE_TEST_IMAP_LOGIN", f"{user}:{password}")
    config = {
        "kind": "email",
        "provider": "email",
        "host": host,
        "port": port,
        "security": "none",
        "domain": DOMAIN,
        "mailboxes": ["Sent"],
        "auth": {"type": "basic", "secret": "env:FENCELINE_TEST_IMAP_LOGIN"},
    }
    configure(settings, "email", config)

    def file(key: str, *, folder: str = "Sent", header_id: str | None = None) -> str:
        sent = EmailMessage()
        sent["From"] = "agent@fenceline.test"
        sent["To"] = "customer@example.com"
        sent["Subject"] = "Your invoice"
        sent["Message-ID"] = header_id or message_id(key, DOMAIN)
        sent.set_content("Please find your invoice attached.")
        with imaplib.IMAP4(host, port) as imap:
            imap.login(user, password)
            imap.create(folder)  # NO when it exists already
            imap.append(folder, None, None, sent.as_bytes())
        return str(sent["Message-ID"])

    return file


def emailed(acme, key: str):
    return unknown_effect(acme.worker, key, provider="email", tool="email", resource="customer@example.com")


def test_a_message_with_the_message_id_is_happened(acme, mailbox, caplog):
    mailbox("invoice-other")
    sent = mailbox("invoice-1")
    run, op, _ = emailed(acme, "invoice-1")

    assert cases_look_up().happened == 1

    op.refresh_from_db()
    assert (op.reconciliation, op.provider_request_id) == ("HAPPENED", sent)
    [looked] = looked_up(run)
    assert looked["asked"] == f"IMAP UID SEARCH HEADER Message-ID {sent} in Sent"
    assert looked["found"]["mailbox"] == "Sent" and looked["found"]["uid"].isdigit()
    assert_chain_intact(run.pk)
    assert_nowhere(CANARY, caplog.text)


def test_no_message_with_the_message_id_did_not_happen(acme, mailbox):
    mailbox("invoice-2-other")
    _run, op, _ = emailed(acme, "invoice-2")

    assert cases_look_up().did_not_happen == 1
    op.refresh_from_db()
    assert op.reconciliation == "DID_NOT_HAPPEN"


def test_a_message_id_that_differs_only_in_case_is_another_key(acme, mailbox):
    mailbox("INVOICE-3")  # IMAP's SEARCH matches without regard to case; keys do not
    mailbox("invoice-3")
    emailed(acme, "Invoice-3")

    assert cases_look_up().did_not_happen == 1

    _run, _op, _ = emailed(acme, "invoice-3")
    assert cases_look_up().happened == 1


def test_keys_with_any_characters_make_valid_message_ids_that_are_found(acme, mailbox):
    key = 'invoice 4/été"<x>'
    sent = mailbox(key)
    assert sent == "<fl.invoice=204=2F=C3=A9t=C3=A9=22=3Cx=3E@mail.fenceline.test>"
    _run, _op, _ = emailed(acme, key)

    assert cases_look_up().happened == 1


def test_a_message_still_in_the_outbox_is_pending(acme, mailbox, settings):
    config = {**settings.FENCELINE["RECONCILERS"]["email"], "pending_mailboxes": ["Outbox"]}
    configure(settings, "email", config)
    mailbox("invoice-queued", folder="Outbox")
    run, _op, case = emailed(acme, "invoice-queued")

    assert cases_look_up().later == 1
    case.refresh_from_db()
    assert case.status == CaseStatus.LOOKUP
    [looked] = looked_up(run)
    assert looked["verdict"] == "PENDING" and looked["found"]["mailbox"] == "Outbox"


def test_a_refused_login_goes_to_a_person(acme, mailbox, monkeypatch):
    monkeypatch.setenv("FENCELINE_TEST_IMAP_LOGIN", "agent@fenceline.test:wrong-password")
    run, _op, case = emailed(acme, "invoice-5")

    assert cases_look_up().to_people == 1
    case.refresh_from_db()
    assert case.status == CaseStatus.OPEN
    assert looked_up(run)[0]["why"] == "the IMAP server refused the login"


def test_a_missing_mailbox_goes_to_a_person(acme, mailbox, settings):
    config = {**settings.FENCELINE["RECONCILERS"]["email"], "mailboxes": ["Archive"]}
    configure(settings, "email", config)
    run, _op, _case = emailed(acme, "invoice-6")

    assert cases_look_up().to_people == 1
    assert looked_up(run)[0]["why"] == "the IMAP server has no mailbox Archive"


def test_a_server_that_does_not_answer_is_looked_up_again_later(acme, mailbox, settings):
    config = {**settings.FENCELINE["RECONCILERS"]["email"], "port": 1}  # nothing listens there
    configure(settings, "email", config)
    run, _op, case = emailed(acme, "invoice-7")

    assert cases_look_up().later == 1
    case.refresh_from_db()
    assert case.status == CaseStatus.LOOKUP
    assert looked_up(run)[0]["verdict"] == "UNAVAILABLE"
