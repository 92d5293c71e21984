"""`python manage.py simulate`: a fleet of real worker processes built on the client, with
chaos, against the API and a sandbox provider; ends with a report read from the database."""

import importlib.util
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from console.simulation.fleet import Settings, report_json, simulate


class Command(BaseCommand):
    help = (
        "Run N client workers (and one with a bad config) against a sandbox payments provider for "
        "S seconds, with pauses past the TTL, SIGKILL, SIGTERM drains and dropped responses; "
        "with agent hosts calling tools through fenceline-mcp and through the OpenAI Agents SDK and "
        "LangGraph adapters; report what the ledger recorded."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        defaults = Settings()
        parser.add_argument("--seconds", type=int, default=defaults.seconds, help="how long (default 60)")
        parser.add_argument("--workers", type=int, default=defaults.workers, help="healthy workers (default 4)")
        parser.add_argument("--ttl", type=int, default=defaults.ttl, help="lease TTL in seconds (default 3)")
        parser.add_argument("--steps", type=int, default=defaults.steps, help="charges per run (default 4)")
        parser.add_argument("--seed", type=int, default=defaults.seed, help="chaos and fault seed (default 1)")
        parser.add_argument("--drop", type=float, default=defaults.drop, help="share of answers dropped")
        parser.add_argument("--slow", type=float, default=defaults.slow, help="share of slow answers")
        parser.add_argument("--fail", type=float, default=defaults.fail, help="share of 503s")
        parser.add_argument(
            "--people-share", type=float, default=defaults.people_share, help="share of cases left to people"
        )
        parser.add_argument(
            "--mcp-hosts", type=int, default=defaults.mcp_hosts, help="agent hosts calling tools through fenceline-mcp"
        )
        parser.add_argument(
            "--agent-hosts",
            type=int,
            default=defaults.agent_hosts,
            help="agent hosts running an OpenAI Agents SDK agent and a LangGraph graph in turn, through the adapters",
        )
        parser.add_argument("--url", default="", help="a Fenceline already serving (default: one in-process)")
        parser.add_argument(
            "--every", type=int, default=defaults.every, help="seconds between progress lines (default 5)"
        )
        parser.add_argument("--json", dest="json_path", type=Path, help="also write the report to this file as JSON")

    def handle(self, *args: Any, json_path: Path | None = None, **options: Any) -> None:
        if not 0 <= options["mcp_hosts"] <= 8:
            raise CommandError("--mcp-hosts must be between 0 and 8")
        if options["mcp_hosts"] and importlib.util.find_spec("mcp") is None:
            raise CommandError(
                "--mcp-hosts needs fenceline-mcp's SDK: pip install './clients/python[gateway]' (or --mcp-hosts 0)"
            )
        if not 0 <= options["agent_hosts"] <= 8:
            raise CommandError("--agent-hosts must be between 0 and 8")
        if options["agent_hosts"] and any(importlib.util.find_spec(name) is None for name in ("agents", "langgraph")):
            raise CommandError(
                "--agent-hosts needs the adapters' frameworks: "
                "pip install './clients/python[openai-agents,langgraph]' (or --agent-hosts 0)"
            )
        if options["seconds"] < 15:
            raise CommandError("--seconds must be at least 15 (the chaos plan needs the time)")
        if options["every"] < 1:
            raise CommandError("--every must be at least 1 (second)")
        if not 1 <= options["workers"] <= 32:
            raise CommandError("--workers must be between 1 and 32")
        for name in ("drop", "slow", "fail", "people_share"):
            if not 0 <= options[name] <= 1:
                raise CommandError(f"--{name.replace('_', '-')} must be between 0 and 1")
        if options["drop"] + options["slow"] + options["fail"] > 1:
            raise CommandError("--drop, --slow and --fail add up to more than 1")
        wanted = {name: options[name] for name in Settings.__dataclass_fields__}
        report = simulate(Settings(**wanted), lambda line: self.stdout.write(line))
        if json_path is not None:
            json_path.write_text(report_json(report))
