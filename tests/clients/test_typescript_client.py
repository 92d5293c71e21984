"""The TypeScript client (``clients/typescript``, ``@fenceline/client``) with the real Node: the
schema snapshot it is generated from is the schema the server serves, its generated types are
what openapi-typescript makes of that snapshot, and its own tests (``npm test``, Node's test
runner) pass against a live server. Node and the package's node_modules come from
``.ci/bootstrap`` (``npm ci``); without Node these tests are skipped, which CI counts as a
failure (FENCELINE_FAIL_ON_SKIP)."""

import json
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from django.db import connection

from approvals.models import ApprovalRequest
from approvals.services.approvals import approval_decide
from fenceline_client import client as fl
from ledger.errors import Denied as ServerDenied
from ledger.errors import DomainError
from tests.factories import make_worker, set_policy
from tests.served import ROOT
from tests.unit.test_client_self_audit import MOUNTINFO, fake_host

PACKAGE = ROOT / "clients" / "typescript"


def node_or_skip() -> str:
    node = shutil.which("node")
    if node is None or not (PACKAGE / "node_modules" / ".bin" / "tsc").exists():
        pytest.skip("Node and clients/typescript/node_modules (.ci/bootstrap runs npm ci) are needed")
    return node


def server_codes() -> set[str]:
    found, stack = set(), [DomainError]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if cls not in (DomainError, ServerDenied) and cls.code not in ("ERROR", "APPROVAL_REQUIRED"):
            found.add(cls.code)
    return found


def test_the_schema_snapshot_is_the_schema_the_server_serves(client):
    served = client.get("/api/v1/openapi.json")
    assert served.status_code == 200
    snapshot = json.loads((PACKAGE / "openapi.json").read_text(encoding="utf-8"))
    assert served.json() == snapshot, (
        "clients/typescript/openapi.json is not the served schema: run `make schema` "
        "(manage.py export_openapi_schema, then npm run generate)"
    )


def test_the_generated_types_are_what_the_snapshot_generates():
    node = node_or_skip()
    done = subprocess.run(
        [node, "scripts/schema.mjs", "--check"], cwd=PACKAGE, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


def tap_counts(output: str) -> dict[str, int]:
    """The summary Node's TAP reporter ends with: ``# tests 8``, ``# pass 8``, ``# fail 0`` ..."""
    return {
        name: int(n)
        for name, n in re.findall(r"^# (tests|suites|pass|fail|cancelled|skipped|todo) (\d+)$", output, re.M)
    }


class Approver(threading.Thread):
    """A person at the console: approves every pending payment of ``customer:approve-me``
    (the other approvals wait), until stopped."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stopping = threading.Event()
        self.approved = 0

    def run(self) -> None:
        try:
            while not self.stopping.wait(0.1):
                pending = ApprovalRequest.objects.filter(status="PENDING", operation__resource="customer:approve-me")
                for approval in pending:
                    approval_decide(approval_id=approval.pk, approve=True, decided_by="alice", reason="looks right")
                    self.approved += 1
        finally:
            connection.close()


@pytest.mark.django_db(transaction=True)
def test_the_typescript_client_passes_its_node_tests_against_the_live_server(live_server, tmp_path):
    node_or_skip()
    first, second = make_worker("acme", "ts-worker-1"), make_worker("acme", "ts-worker-2")
    set_policy(first.tenant, reason="every payment is approved by a person", human_approval_tools=["payments"])
    env = {
        **os.environ,
        "FENCELINE_URL": live_server.url,
        "FENCELINE_TOKEN": first.token,
        "FENCELINE_TOKEN_2": second.token,
        "FENCELINE_ERROR_CODES": json.dumps(sorted(server_codes())),
    }
    approver = Approver()
    approver.start()
    try:
        done = subprocess.run(
            ["npm", "test", "--silent"], cwd=PACKAGE, env=env, capture_output=True, text=True, timeout=300
        )
    finally:
        approver.stopping.set()
        approver.join(10)
    output = done.stdout + done.stderr
    counts = tap_counts(done.stdout)
    assert done.returncode == 0, output[-6000:]
    assert counts.get("tests", 0) > 0 and counts["fail"] == 0, output[-6000:]
    assert counts["pass"] == counts["tests"] and counts["skipped"] == counts["todo"] == 0, counts
    assert approver.approved >= 1  # the approval test waited for a person
    assert_the_self_audits_agree(tmp_path)


# Beside the Python client's own cases: an escaped path and a mount point mounted over again.
MOUNTED_OVER = MOUNTINFO + (
    "28 22 8:1 /home/dev/my\\040files /data rw,relatime - ext4 /dev/sda1 rw\n"
    "29 22 0:24 / /data ro,relatime - tmpfs tmpfs rw\n"
    "30 22 8:1 /home/dev/my\\040photos /photos rw,relatime - ext4 /dev/sda1 rw\n"
)


def assert_the_self_audits_agree(tmp_path) -> None:
    """The TypeScript client's container self-audit (src/audit.ts, built by ``npm test``)
    reports what the Python client's reports, from the same fake /proc and root, and from
    this process's own."""
    hosts = [(0, "0000000000200001", True), (10001, "000001ffffffffff", False)]
    places = [fake_host(tmp_path / str(n), uid=u, cap_eff=c, docker_socket=d) for n, (u, c, d) in enumerate(hosts)]
    for proc, _ in places:
        (Path(proc) / "self" / "mountinfo").write_text(MOUNTED_OVER)
    for where in [*({"proc": proc, "root": root} for proc, root in places), {}]:
        script = (
            "import { runtimeAudit } from './dist/src/index.js';"
            f"console.log(JSON.stringify(runtimeAudit({json.dumps(where)})));"
        )
        done = subprocess.run(
            ["node", "--input-type=module", "-e", script], cwd=PACKAGE, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == fl.runtime_audit(**where), where
