"""The example workers of the client docs run exactly as the pages show them: the code block is
read from the page (tests.helpers.doc_example) and run in a process of its own against a live
server whose database is seeded as `make demo` seeds it, with the demo worker's token."""

import os
import subprocess
import sys

import pytest

from console.demo.seed import TENANT, WORKER, seed
from ledger.models import Operation, Run, RunResource, Worker
from ledger.services.lifespan.reaper import resources_reap
from tests.helpers import doc_example


@pytest.fixture
def demo(live_server, sandbox, settings, tmp_path):
    """The demo's data (console/demo/seed.py, as `manage.py demo` seeds it) behind a live
    server; the environment a worker of the docs is started with."""
    settings.FENCELINE = {**settings.FENCELINE, "SANDBOX_DIR": tmp_path / "sandbox"}
    token = seed(sandbox, lambda line: None)
    return {**os.environ, "FENCELINE_URL": live_server.url, "FENCELINE_TOKEN": token}


def run_python(code: str, env: dict[str, str], cwd) -> subprocess.CompletedProcess:
    (cwd / "worker.py").write_text(code, encoding="utf-8")
    return subprocess.run([sys.executable, "worker.py"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.django_db(transaction=True)
def test_the_worker_of_docs_client_md_runs_as_written_against_the_demo(demo, tmp_path):
    code = doc_example("client.md", "A complete worker", "python")
    done = run_python(code, demo, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    run = Run.objects.get(tenant__slug=TENANT, external_id="reconcile-supplier-7")
    assert run.status == "COMPLETED"
    submitted = Operation.objects.filter(run=run, tool="portal").order_by("resource")
    assert [(op.resource, op.phase, op.provider_request_id) for op in submitted] == [
        (f"invoice:{n}", "CONFIRMED", f"portal-receipt-{n}") for n in (101, 102, 103)
    ]
    assert Worker.objects.get(tenant__slug=TENANT, name=WORKER).status == "STOPPED"  # drained, then exited
    # The browser session it gave back is closed by the driver the demo has for it.
    session = RunResource.objects.get(run=run, kind="browser_session")
    assert session.state == "RELEASE_REQUESTED"
    resources_reap()
    session.refresh_from_db()
    assert session.state == "RELEASED", session.last_error

    # Started again (a restarted process), it finds its run completed and stops cleanly.
    again = run_python(code, demo, tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert Worker.objects.get(tenant__slug=TENANT, name=WORKER).status == "STOPPED"
