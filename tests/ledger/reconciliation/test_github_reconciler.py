"""The GitHub adapter (ledger/services/reconciliation/providers/github.py) against a fake of
GitHub's comments API over HTTP: a comment with the operation's hidden marker is found across
Link-header pages, none is DID_NOT_HAPPEN, two or an unknown issue go to a person, and the rate
limits (429 with retry-after, 403 with x-ratelimit-remaining: 0) are honoured."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import CaseStatus
from approvals.services.lookups import cases_look_up
from fenceline_client.provider_tags import github_marker
from tests.fakes.base import Reply
from tests.helpers import assert_chain_intact
from tests.ledger.reconciliation.conftest import assert_nowhere, looked_up, unknown_effect

pytestmark = pytest.mark.django_db

ISSUE = "acme/widgets#42"


def commented(acme, key: str, resource: str = ISSUE):
    return unknown_effect(acme.worker, key, provider="github", tool="github", resource=resource)


def test_a_comment_with_the_marker_is_happened_with_its_id(acme, github, caplog):
    github.comment(ISSUE, "LGTM")
    made = github.comment(ISSUE, f"Deployed to staging.\n\n{github_marker('deploy-7')}")
    run, op, _ = commented(acme, "deploy-7")

    assert cases_look_up().happened == 1

    op.refresh_from_db()
    assert (op.reconciliation, op.provider_request_id) == ("HAPPENED", str(made["id"]))
    [looked] = looked_up(run)
    assert looked["asked"].startswith("GET /repos/acme/widgets/issues/42/comments?per_page=100&since=")
    assert looked["found"] == {"comment_ids": [str(made["id"])], "pages": 1}
    seen = github.seen[0]
    assert seen.headers["Authorization"] == github.credential
    assert seen.headers["Accept"] == "application/vnd.github+json"
    assert_chain_intact(run.pk)
    assert_nowhere(github.credential.removeprefix("Bearer "), caplog.text)


def test_no_comment_with_the_marker_did_not_happen(acme, github):
    github.comment(ISSUE, f"another effect {github_marker('deploy-8')}")
    run, op, _ = commented(acme, "deploy-9")

    assert cases_look_up().did_not_happen == 1
    op.refresh_from_db()
    assert op.reconciliation == "DID_NOT_HAPPEN"
    assert looked_up(run)[0]["why"] == "no comment carries the marker"


def test_only_comments_since_the_intent_are_read(acme, github):
    github.comment(ISSUE, f"years ago {github_marker('deploy-old')}", at="2020-01-01T00:00:00Z")
    _run, _op, _ = commented(acme, "deploy-old")

    assert cases_look_up().did_not_happen == 1
    assert github.seen[0].query["since"][0] > "2026-"


def test_comments_are_read_across_link_header_pages(acme, github):
    for i in range(230):
        github.comment("acme/widgets#7", f"comment {i}")
    made = github.comment("acme/widgets#7", github_marker("deploy-paged"))
    run, op, _ = commented(acme, "deploy-paged", resource="acme/widgets/pull/7")

    assert cases_look_up().happened == 1
    op.refresh_from_db()
    assert op.provider_request_id == str(made["id"])
    assert [s.query.get("page") for s in github.seen] == [None, ["2"], ["3"]]
    assert looked_up(run)[0]["found"]["pages"] == 3


def test_two_comments_with_the_marker_go_to_a_person(acme, github):
    github.comment(ISSUE, github_marker("deploy-twice"))
    github.comment(ISSUE, github_marker("deploy-twice"))
    _run, _op, case = commented(acme, "deploy-twice")

    assert cases_look_up().to_people == 1
    case.refresh_from_db()
    assert case.status == CaseStatus.OPEN


def test_an_issue_github_does_not_show_is_cannot_tell(acme, github):
    run, _op, _case = commented(acme, "deploy-nowhere", resource="acme/widgets#999")

    assert cases_look_up().to_people == 1
    assert looked_up(run)[0]["why"] == "GitHub answered status 404 for acme/widgets#999"


def test_a_resource_that_names_no_issue_is_cannot_tell_without_asking(acme, github):
    run, _op, _case = commented(acme, "deploy-where", resource="just-a-name")

    assert cases_look_up().to_people == 1
    assert github.seen == []
    assert "names no issue" in looked_up(run)[0]["why"]


def test_a_429_is_waited_out_for_its_retry_after(acme, github):
    made = github.comment(ISSUE, github_marker("deploy-429"))
    github.throttle = [Reply(429, {"message": "API rate limit exceeded"}, {"retry-after": "1"})]
    _run, op, _ = commented(acme, "deploy-429")

    assert cases_look_up().happened == 1
    op.refresh_from_db()
    assert op.provider_request_id == str(made["id"]) and len(github.seen) == 2


def test_a_spent_primary_rate_limit_waits_until_its_reset(acme, github):
    reset = str(int(time.time()) + 1800)
    github.throttle = [
        Reply(403, {"message": "API rate limit exceeded"}, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": reset})
    ]
    _run, _op, case = commented(acme, "deploy-403")

    assert cases_look_up().later == 1
    case.refresh_from_db()
    assert case.next_lookup_at > timezone.now() + timedelta(seconds=1700)
    assert len(github.seen) == 1


def test_review_comments_of_a_pull_request_are_read_from_the_pulls_endpoint(acme, github, settings):
    config = {**settings.FENCELINE["RECONCILERS"]["github"], "comments": "review"}
    settings.FENCELINE = {**settings.FENCELINE, "RECONCILERS": {"github": config}}
    made = github.comment("acme/widgets#9", f"nit: rename {github_marker('review-1')}", kind="pulls")
    _run, op, _ = commented(acme, "review-1", resource="acme/widgets/pull/9")

    assert cases_look_up().happened == 1
    op.refresh_from_db()
    assert op.provider_request_id == str(made["id"])
    assert github.seen[0].path == "/repos/acme/widgets/pulls/9/comments"
