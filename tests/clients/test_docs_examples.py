"""The example workers of the client docs run exactly as the pages show them: the code block is
read from the page (tests.helpers.doc_example) and run in a process of its own against a live
server whose database is seeded as `make demo` seeds it, with the demo worker's token."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from console.demo.seed import TENANT, WORKER, seed
from ledger.models import Operation, Run, RunResource, Worker
from ledger.services.lifespan.reaper import resources_reap
from tests.helpers import DOCS, doc_example
from tests.served import ROOT


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


TYPESCRIPT = ROOT / "clients" / "typescript"
COMPILE = "npx tsc --strict --module nodenext --target es2022 worker.ts"


def typescript_worker_project(tmp_path: Path, code: str) -> Path:
    """What the page's install steps make: the package built (into a copy of its own, so that
    `npm test` building clients/typescript/dist meanwhile is no concern), linked into an ESM
    project as `npm install <folder>` links it, and the page's worker.ts compiled there with
    the page's flags."""
    tsc = TYPESCRIPT / "node_modules" / ".bin" / "tsc"
    if shutil.which("node") is None or not tsc.exists():
        pytest.skip("Node and clients/typescript/node_modules (.ci/bootstrap runs npm ci) are needed")
    package = tmp_path / "package"
    package.mkdir()
    shutil.copy(TYPESCRIPT / "package.json", package / "package.json")
    (package / "node_modules").symlink_to(TYPESCRIPT / "node_modules")
    built = subprocess.run(
        [str(tsc), "-p", str(TYPESCRIPT / "tsconfig.json"), "--outDir", str(package / "dist")],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    project = tmp_path / "worker"
    (project / "node_modules" / "@fenceline").mkdir(parents=True)
    (project / "node_modules" / "@fenceline" / "client").symlink_to(package)
    (project / "node_modules" / "@types").symlink_to(TYPESCRIPT / "node_modules" / "@types")
    (project / "package.json").write_text('{"type": "module"}\n', encoding="utf-8")
    (project / "worker.ts").write_text(code, encoding="utf-8")
    compiled = subprocess.run(
        [str(tsc), *COMPILE.split()[2:]], cwd=project, capture_output=True, text=True, timeout=180
    )
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    return project


@pytest.mark.django_db(transaction=True)
def test_the_worker_of_docs_client_typescript_md_runs_as_written_against_the_demo(demo, tmp_path):
    page = (DOCS / "client-typescript.md").read_text(encoding="utf-8")
    assert COMPILE in page and "node worker.js" in page
    project = typescript_worker_project(tmp_path, doc_example("client-typescript.md", "A complete worker", "ts"))
    for start in ("first", "again"):  # started again, it finds its run completed and stops cleanly
        done = subprocess.run(["node", "worker.js"], cwd=project, env=demo, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{start}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
        assert Worker.objects.get(tenant__slug=TENANT, name=WORKER).status == "STOPPED"
    run = Run.objects.get(tenant__slug=TENANT, external_id="reconcile-supplier-8")
    assert run.status == "COMPLETED"
    submitted = Operation.objects.filter(run=run, tool="portal").order_by("resource")
    assert [(op.resource, op.phase, op.provider_request_id) for op in submitted] == [
        (f"invoice:{n}", "CONFIRMED", f"portal-receipt-{n}") for n in (201, 202, 203)
    ]
    resources_reap()
    assert RunResource.objects.get(run=run, kind="browser_session").state == "RELEASED"
