"""The run page of an MCP session (``fenceline-mcp``): the session's client, protocol version,
upstreams and id from its ``x.mcp.session`` event, the tools it called with their argument
digests, and what it redacted from results; 404 without a role and for another tenant's
session; nothing of it on a run that is no MCP session."""

from django.urls import reverse

from ledger.services.core.intent import Intent
from ledger.services.fence import operations
from ledger.services.fence.notes import event_append
from ledger.states import EffectClass
from tests.factories import leased_run, new_run

SESSION = {
    "session_id": "mcp-7f3a9c",
    "client_name": "claude-desktop",
    "client_version": "0.14.2",
    "protocol_version": "2025-06-18",
    "upstreams": ["git", "filesystem"],
}
DIGEST = "sha256:" + "ab12" * 16


def url(run) -> str:
    return reverse("run_detail", args=[run.pk])


def mcp_run(identity, session=SESSION):
    """A run whose gateway recorded the session, and one git_status call with its args digest."""
    run, token = leased_run(identity.worker, owner="fenceline-mcp:host-1")
    event_append(worker=identity.worker, run_id=run.pk, fencing_token=token, type="x.mcp.session", fields=session)
    intent = Intent(
        tool="git_status",
        action="git_status",
        resource="repo:/srv/repo",
        effect_class=EffectClass.PURE,
        idempotency_key="mcp-7f3a9c:git_status:1",
        args_digest=DIGEST,
    )
    op, _ = operations.operation_intend(worker=identity.worker, run_id=run.pk, fencing_token=token, intent=intent)
    return run, token, op


def test_a_viewer_sees_the_mcp_session_its_tools_and_their_args_digests(viewer_client, acme):
    run, _, op = mcp_run(acme)
    page = viewer_client.get(url(run))
    body = page.content.decode()
    assert page.status_code == 200
    assert "MCP session" in body
    for shown in (
        "claude-desktop",
        "0.14.2",
        "2025-06-18",
        "mcp-7f3a9c",
        "filesystem",
    ):
        assert shown in body, shown
    assert page.context["mcp"]["tools"] == [{"tool": "git_status", "calls": 1}]
    assert f'data-copy="{DIGEST}"' in body and f'id="op-{op.pk}"' in body


def test_a_redacted_result_is_listed_with_its_tool_and_operation(viewer_client, acme):
    run, token, op = mcp_run(acme)
    fields = {"tool": "git_status", "operation_id": str(op.pk), "kinds": ["aws_access_key"], "count": 2}
    event_append(worker=acme.worker, run_id=run.pk, fencing_token=token, type="x.mcp.redacted", fields=fields)
    body = viewer_client.get(url(run)).content.decode()
    assert "2 (aws_access_key)" in body and f'href="#op-{op.pk}"' in body


def test_a_run_that_is_no_mcp_session_has_no_session_panel(viewer_client, acme):
    run, token = leased_run(acme.worker)
    event_append(worker=acme.worker, run_id=run.pk, fencing_token=token, type="x.other", fields={"client_name": "x"})
    page = viewer_client.get(url(run))
    assert page.context["mcp"] is None
    assert "MCP session" not in page.content.decode()


def test_the_hosts_words_are_text_not_markup(viewer_client, acme):
    run, _, _ = mcp_run(acme, {**SESSION, "client_name": "<script>alert(1)</script>", "upstreams": "<b>up</b>"})
    body = viewer_client.get(url(run)).content.decode()
    assert "<script>alert(1)</script>" not in body and "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert "&lt;b&gt;up&lt;/b&gt;" in body


def test_without_a_role_an_mcp_session_is_404(roleless_client, acme):
    run, _, _ = mcp_run(acme)
    assert roleless_client.get(url(run)).status_code == 404


def test_another_tenants_mcp_session_is_404(outsider_viewer_client, viewer_client, acme, outsider):
    theirs, _, _ = mcp_run(outsider)
    assert viewer_client.get(url(theirs)).status_code == 404
    assert outsider_viewer_client.get(url(mcp_run(acme)[0])).status_code == 404
    assert viewer_client.get(url(new_run(acme.worker))).status_code == 200
