"""Policy as code (``manage.py policy export|apply``): apply prints what changes and writes
one new version through policy_change; applying twice is applying once; a dry run and a bad
file write nothing, and a bad file is refused in one line naming the path."""

import json

import pytest
from django.core.management import CommandError, call_command

from ledger.models import AdminAction, TenantPolicy
from ledger.services.authority.policy import policy_current, policy_diff

CHARGE = {"tool": "payments", "action": "charge", "effect_class": "NON_RETRYABLE", "reconciler": "sandbox-payments"}


def export(tenant, tmp_path) -> dict:
    out = tmp_path / "policy.json"
    call_command("policy", "export", "--tenant", tenant.slug, "--out", str(out))
    return json.loads(out.read_text())


def apply(tenant, path, *extra) -> None:
    call_command("policy", "apply", str(path), "--tenant", tenant.slug, "--by", "alice", "--reason", "as code", *extra)


def write(tmp_path, data, name="edited.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def versions(tenant) -> int:
    return TenantPolicy.objects.filter(tenant=tenant).count()


def test_export_is_the_current_document_with_its_version(acme, tmp_path, capsys):
    exported = export(acme.tenant, tmp_path)
    assert exported == {"policy": policy_current(tenant=acme.tenant)[1], "version": 1}
    text = (tmp_path / "policy.json").read_text()
    assert text == json.dumps(exported, indent=2, sort_keys=True) + "\n"
    call_command("policy", "export", "--tenant", acme.tenant.slug)  # to standard output
    assert json.loads(capsys.readouterr().out.split("\n", 1)[1]) == exported


def test_export_then_apply_changes_nothing(acme, tmp_path, capsys):
    export(acme.tenant, tmp_path)
    apply(acme.tenant, tmp_path / "policy.json")
    assert "nothing changes" in capsys.readouterr().out
    assert versions(acme.tenant) == 1


def test_apply_prints_the_diff_and_writes_one_version(acme, tmp_path, capsys):
    exported = export(acme.tenant, tmp_path)
    exported["policy"]["max_ttl_s"] = 7200
    exported["policy"]["tool_contracts"] = [CHARGE]
    path = write(tmp_path, exported)
    capsys.readouterr()
    apply(acme.tenant, path)
    out = capsys.readouterr().out.splitlines()
    assert "~ policy.max_ttl_s: 3600 -> 7200" in out
    assert any(line.startswith('+ policy.tool_contracts.0: {"action": "charge"') for line in out)
    assert out[-1] == "policy version 2 is now current for acme"
    version, document = policy_current(tenant=acme.tenant)
    assert (version, document["max_ttl_s"], document["tool_contracts"][0]["provider"]) == (2, 7200, None)
    row = TenantPolicy.objects.get(tenant=acme.tenant, version=2)
    assert (row.created_by, row.reason) == ("alice", "as code")
    assert AdminAction.objects.filter(tenant=acme.tenant, action="policy.change").count() == 1


def test_applying_twice_is_applying_once(acme, tmp_path, capsys):
    path = write(tmp_path, {"max_calls": 10, "tool_contracts": [CHARGE]})  # a bare document
    apply(acme.tenant, path)
    apply(acme.tenant, path)
    assert versions(acme.tenant) == 2
    assert capsys.readouterr().out.splitlines()[-1] == f"nothing changes: {path} is policy version 2 of acme"


def test_a_dry_run_prints_the_diff_and_writes_nothing(acme, tmp_path, capsys):
    apply(acme.tenant, write(tmp_path, {"max_calls": 10}), "--dry-run")
    out = capsys.readouterr().out.splitlines()
    assert out == ["~ policy.max_calls: 100 -> 10", "dry run: 1 change(s) not written (current: version 1)"]
    assert versions(acme.tenant) == 1


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ('{"max_calls": 10,\n  "rules": [}', "not valid JSON: Expecting value at line 2, column 13"),
        ({"max_calls": 10, "colour": "red"}, "policy.colour is not a policy field"),
        ({"tool_contracts": [CHARGE, {**CHARGE, "effect_class": "SOMETIMES"}]}, "policy.tool_contracts.1.effect_class"),
        ({"tool_contracts": [CHARGE, CHARGE]}, "policy.tool_contracts.1 repeats payments.charge"),
        (
            {"tool_contracts": [{**CHARGE, "reconciler": "nobody"}]},
            "policy.tool_contracts.0.reconciler: no reconciler named 'nobody' is configured",
        ),
        ({"policy": {"max_calls": 10}, "version": 1, "tenant": "acme"}, "tenant is not a field of an exported policy"),
        ('{"max_calls": 1, "max_calls": 2}', "the key 'max_calls' appears twice"),
    ],
)
def test_a_bad_file_changes_nothing_and_names_the_path(acme, tmp_path, data, message):
    path = write(tmp_path, data)
    with pytest.raises(CommandError) as refused:
        apply(acme.tenant, path)
    assert str(refused.value).startswith(f"{path}: ")
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)
    assert versions(acme.tenant) == 1


def test_an_unknown_tenant_or_file_is_refused(acme, tmp_path):
    with pytest.raises(CommandError, match="no tenant 'nope'"):
        call_command("policy", "export", "--tenant", "nope")
    with pytest.raises(CommandError, match=r"missing\.json"):
        apply(acme.tenant, tmp_path / "missing.json")


def test_the_diff_names_paths_and_leaves_out_the_starter_marker():
    old = {"starter": True, "max_ttl_s": 3600, "tool_contracts": [CHARGE]}
    new = {"starter": False, "max_ttl_s": 7200, "tool_contracts": []}
    assert policy_diff(old, new) == [
        "~ policy.max_ttl_s: 3600 -> 7200",
        '- policy.tool_contracts.0: {"action": "charge", "effect_class": "NON_RETRYABLE", "human_approval": false, '
        '"provider": null, "reconciler": "sandbox-payments", "tool": "payments", "worst_case_cost_cents": null}',
    ]
    assert policy_diff({"max_ttl_s": 3600}, {"starter": False}) == []  # missing keys read as the starter's
