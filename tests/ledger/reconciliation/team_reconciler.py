"""A team's own reconciler, outside Fenceline's code, named by dotted path in the tests'
FENCELINE_RECONCILERS ({"kind": "python", "path": "tests.ledger.reconciliation.team_reconciler:build"})."""

from ledger.services.reconciliation.protocol import Lookup, Verdict


class TeamLedger:
    def __init__(self, name, options, credential):
        self.name = name
        self.records = options["records"]  # key -> the team's record id
        self.credential = credential

    def lookup(self, operation, *, request_id="", now=None):
        self.credential.headers()  # resolvable at call time, as a real one would send it
        found = self.records.get(operation.idempotency_key)
        asked = f"team-ledger {operation.idempotency_key}"
        if found is None:
            return Lookup(Verdict.DID_NOT_HAPPEN, asked=asked, why="not in the team's ledger")
        return Lookup(Verdict.HAPPENED, asked=asked, why="in the team's ledger", provider_request_id=found)


def build(name, options, *, credential):
    return TeamLedger(name, options, credential)


NOT_A_FACTORY = 42
