"""The Slack adapter (ledger/services/reconciliation/providers/slack.py) against a fake of
Slack's conversations.history / conversations.replies over HTTP: a message whose metadata
carries the operation's key is found across cursor pages, in a channel or a thread; ok: false
errors go to a person with their code; a 429's Retry-After is honoured."""

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import CaseStatus
from approvals.services.lookups import cases_look_up
from fenceline_client.provider_tags import slack_metadata
from tests.fakes.base import Reply
from tests.helpers import assert_chain_intact
from tests.ledger.reconciliation.conftest import assert_nowhere, looked_up, unknown_effect

pytestmark = pytest.mark.django_db

CHANNEL = "C0123ABCD"


def posted(acme, key: str, resource: str = CHANNEL):
    return unknown_effect(acme.worker, key, provider="slack", tool="slack", resource=resource)


def test_a_message_with_the_key_in_its_metadata_is_happened_with_its_ts(acme, slack, caplog):
    slack.post(CHANNEL, "hello")
    made = slack.post(CHANNEL, "The deploy is done.", slack_metadata("notify-1"))
    run, op, _ = posted(acme, "notify-1")

    assert cases_look_up().happened == 1

    op.refresh_from_db()
    assert (op.reconciliation, op.provider_request_id) == ("HAPPENED", made["ts"])
    [looked] = looked_up(run)
    assert looked["asked"].startswith(f"GET /api/conversations.history?channel={CHANNEL}&oldest=")
    assert looked["asked"].endswith("&limit=200&include_all_metadata=true")
    assert looked["found"] == {"channel": CHANNEL, "message_ts": [made["ts"]], "pages": 1}
    assert slack.seen[0].headers["Authorization"] == slack.credential
    assert "The deploy is done" not in str(looked)  # the message's text is never evidence
    assert_chain_intact(run.pk)
    assert_nowhere(slack.credential.removeprefix("Bearer "), caplog.text)


def test_no_message_with_the_key_did_not_happen(acme, slack):
    slack.post(CHANNEL, "other", slack_metadata("notify-other"))
    slack.post(CHANNEL, "same key, other event type", slack_metadata("notify-2", event_type="something_else"))
    _run, op, _ = posted(acme, "notify-2")

    assert cases_look_up().did_not_happen == 1
    op.refresh_from_db()
    assert op.reconciliation == "DID_NOT_HAPPEN"


def test_messages_are_read_across_cursor_pages(acme, slack):
    made = slack.post(CHANNEL, "first", slack_metadata("notify-paged"))
    for i in range(450):
        slack.post(CHANNEL, f"chatter {i}")
    run, op, _ = posted(acme, "notify-paged")

    assert cases_look_up().happened == 1
    op.refresh_from_db()
    assert op.provider_request_id == made["ts"]
    cursors = [s.query.get("cursor") for s in slack.seen]
    assert cursors[0] is None and len(cursors) == 3 and all(cursors[1:])
    assert looked_up(run)[0]["found"]["pages"] == 3


def test_a_reply_in_a_thread_is_found_with_conversations_replies(acme, slack):
    parent = slack.post(CHANNEL, "release thread")
    made = slack.post(CHANNEL, "step 2 done", slack_metadata("notify-thread"), thread=parent["ts"])
    _run, op, _ = posted(acme, "notify-thread", resource=f"{CHANNEL}/{parent['ts']}")

    assert cases_look_up().happened == 1
    op.refresh_from_db()
    assert op.provider_request_id == made["ts"]
    assert slack.seen[0].path == "/api/conversations.replies" and slack.seen[0].query["ts"] == [parent["ts"]]


def test_two_messages_with_the_key_go_to_a_person(acme, slack):
    slack.post(CHANNEL, "a", slack_metadata("notify-twice"))
    slack.post(CHANNEL, "b", slack_metadata("notify-twice"))
    _run, _op, case = posted(acme, "notify-twice")

    assert cases_look_up().to_people == 1
    case.refresh_from_db()
    assert case.status == CaseStatus.OPEN


def test_ok_false_goes_to_a_person_with_slacks_error_code(acme, slack):
    run, _op, _case = posted(acme, "notify-lost", resource="C0NOSUCH")

    assert cases_look_up().to_people == 1
    [looked] = looked_up(run)
    assert looked["found"] == {"error_code": "channel_not_found"}


def test_a_revoked_token_is_slacks_invalid_auth_for_a_person(acme, slack):
    slack.credential = "Bearer xoxb-someone-else"
    run, _op, _case = posted(acme, "notify-revoked")

    assert cases_look_up().to_people == 1
    assert looked_up(run)[0]["found"] == {"error_code": "invalid_auth"}


def test_a_429_is_waited_out_and_a_long_one_handed_back_to_the_job(acme, slack):
    made = slack.post(CHANNEL, "x", slack_metadata("notify-429"))
    slack.throttle = [Reply(429, {"ok": False, "error": "ratelimited"}, {"Retry-After": "1"})]
    _run, op, _ = posted(acme, "notify-429")
    assert cases_look_up().happened == 1
    op.refresh_from_db()
    assert op.provider_request_id == made["ts"] and len(slack.seen) == 2

    slack.throttle = [Reply(429, {"ok": False, "error": "ratelimited"}, {"Retry-After": "900"})]
    _run, op, case = posted(acme, "notify-429-long")
    assert cases_look_up().later == 1
    case.refresh_from_db()
    assert case.next_lookup_at > timezone.now() + timedelta(seconds=850)
