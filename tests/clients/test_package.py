"""The worker side's boundary: ``clients/python`` (the ``fenceline-client`` distribution) is
what an agent host installs, and it must not bring the server with it. Nothing is built or
installed here: the tests read the package where it lies and run it in isolated interpreters."""

import json
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import fenceline_client
from fenceline_client import evidence_verifier
from tests.unit.reference_chain import K1, RUN, export_of

PACKAGE = Path(__file__).resolve().parents[2] / "clients" / "python"
SOURCE = PACKAGE / "src"
VERIFIER = SOURCE / "fenceline_client" / "evidence_verifier.py"
SERVER = ("django", "ledger", "console", "approvals", "requests")
FRAMEWORKS = ("agents", "openai", "langgraph", "langchain_core")  # the adapters' extras


def isolated(*args: str, cwd: Path, site: bool = True) -> subprocess.CompletedProcess:
    """This interpreter with -I: no PYTHONPATH or DJANGO_SETTINGS_MODULE, no current directory
    or script directory on sys.path; with ``site=False`` (-S) not even the virtualenv's
    site-packages, where Django and the server's own editable install live."""
    flags = ["-I"] if site else ["-I", "-S"]
    return subprocess.run([sys.executable, *flags, *args], cwd=cwd, capture_output=True, text=True, timeout=60, env={})


def test_the_package_imports_nothing_of_the_server(tmp_path):
    # The interpreter can import Django (it is installed beside), so what counts is that
    # importing every module of the package did not.
    program = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(SOURCE)!r})
        import fenceline_client
        import fenceline_client.client
        import fenceline_client.evidence_verifier
        import fenceline_client.simulated_worker
        import fenceline_client.adapters
        import fenceline_client.adapters.fencing
        print(fenceline_client.__file__)
        print(" ".join(sorted(name for name in sys.modules if name.split(".")[0] in {SERVER!r})))
        assert "django" not in sys.modules
        framework = sorted(name for name in sys.modules if name.split(".")[0] in {FRAMEWORKS!r})
        assert not framework, f"the core imported an adapter's framework: {{framework}}"
        """
    )
    done = isolated("-c", program, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    where, loaded = done.stdout.splitlines()
    assert Path(where).resolve() == SOURCE / "fenceline_client" / "__init__.py"
    assert loaded == "", f"the client package imported {loaded}"


def _names(requirements: list[str]) -> list[str]:
    return [re.match(r"[A-Za-z0-9._-]+", requirement).group(0).lower() for requirement in requirements]


def test_the_package_depends_on_urllib3_alone_and_each_adapter_on_its_extra():
    project = tomllib.loads((PACKAGE / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert _names(project["dependencies"]) == ["urllib3"]
    extras = {name: _names(requirements) for name, requirements in project["optional-dependencies"].items()}
    assert extras == {
        "openai-agents": ["openai-agents"],
        "langgraph": ["langgraph"],
        "otel": ["opentelemetry-api"],
        "gateway": ["mcp", "detect-secrets"],
    }
    assert project["name"] == "fenceline-client"


def test_the_package_exports_what_docs_client_md_imports():
    documented = (Path(__file__).resolve().parents[2] / "docs" / "client.md").read_text(encoding="utf-8")
    block = re.search(r"from fenceline_client import \(([^)]*)\)", documented)
    assert block, "docs/client.md shows a worker importing from fenceline_client"
    names = [name.strip() for name in block.group(1).split(",") if name.strip()]
    assert names and set(names) <= set(fenceline_client.__all__)
    assert all(hasattr(fenceline_client, name) for name in fenceline_client.__all__)


def test_the_verifier_runs_as_a_script_where_it_lies_without_the_server(tmp_path):
    (tmp_path / "export.json").write_text(json.dumps(export_of()), encoding="utf-8")
    (tmp_path / "keys.json").write_text(json.dumps({"k1": "hex:" + K1.hex()}), encoding="utf-8")

    helped = isolated(str(VERIFIER), "--help", cwd=tmp_path, site=False)
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: evidence_verifier.py ")

    done = isolated(str(VERIFIER), "export.json", "--keys", "keys.json", "--json", cwd=tmp_path, site=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["run_id"], report["status"]) == (RUN, "VERIFIED")


def test_fenceline_verify_is_the_verifier_command(tmp_path):
    scripts = tomllib.loads((PACKAGE / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    assert scripts == {
        "fenceline-verify": "fenceline_client.evidence_verifier:main",
        "fenceline-mcp": "fenceline_client.gateway.cli:main",
    }
    assert evidence_verifier.main.__module__ == "fenceline_client.evidence_verifier"

    (tmp_path / "export.json").write_text(json.dumps(export_of()), encoding="utf-8")
    (tmp_path / "keys.json").write_text(json.dumps({"k1": "hex:" + K1.hex()}), encoding="utf-8")
    command = Path(sys.executable).with_name("fenceline-verify")  # the installed entry point
    done = subprocess.run(
        [str(command), "export.json", "--keys", "keys.json"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"run {RUN}: VERIFIED (event MACs NOT checked: no event keys given)"


def test_fenceline_mcp_without_its_extra_says_how_to_install_it(tmp_path):
    # mcp made unimportable (None in sys.modules), as where the gateway extra was not installed
    program = (
        f"import sys; sys.path.insert(0, {str(SOURCE)!r}); sys.modules['mcp'] = None; "
        "from fenceline_client.gateway.cli import main; sys.exit(main())"
    )
    done = isolated("-c", program, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr == "fenceline-mcp: mcp is not installed: pip install 'fenceline-client[gateway]'\n"
