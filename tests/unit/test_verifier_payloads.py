"""The standalone verifier on payloads committed by digest (event schema version 2): a
payload that hashes to its digest is checked, one removed by retention or withheld is no
finding, and the report says "payload removed by retention"; version-1 events are read as
before. (The tampered payloads are in tests/unit/tamper_cases.py.)"""

import copy
import json
import subprocess
import sys

from fenceline_client import evidence_verifier as ev
from tests.unit.reference_chain import EVENT_KEYS, HEAD, KEYS, MODULE_PATH, RUN, verify
from tests.unit.tamper_cases import PAYLOAD, with_payload

REMOVED = {"by": "retention", "at": "2026-12-30T00:00:00.000000Z"}


def test_a_payload_that_hashes_to_its_digest_is_checked():
    events, checkpoints, _ = with_payload(payload=copy.deepcopy(PAYLOAD))
    report = verify(events, checkpoints)
    assert (report.status, report.finding, report.payloads_checked) == ("VERIFIED", None, 1)
    assert "payloads: 1 checked against their digest" in report.summary()


def test_a_payload_removed_by_retention_leaves_the_chain_verified_and_says_so():
    events, checkpoints, _ = with_payload(payload_removed=REMOVED)
    report = verify(events, checkpoints)
    assert (report.status, report.finding) == ("VERIFIED", None)
    assert (report.payloads_removed, report.payloads_removed_seqs, report.payloads_checked) == (1, [13], 0)
    assert "payload removed by retention: seq 13" in report.summary()


def test_a_withheld_payload_is_no_finding():
    events, checkpoints, _ = with_payload(payload_withheld=True)
    report = verify(events, checkpoints)
    assert (report.status, report.payloads_withheld) == ("VERIFIED", 1)


def test_the_digest_itself_is_in_the_chain():
    """Pointing the event at other bytes means changing its fields: the hash says so."""
    events, checkpoints, _ = with_payload(payload=copy.deepcopy(PAYLOAD))
    other = {"stderr": "nothing happened"}
    events[12]["fields"][ev.PAYLOAD_DIGEST] = ev.payload_digest(other)
    events[12]["payload"] = other
    report = verify(events, checkpoints)
    assert (report.finding.reason, report.finding.first_seq) == ("mutated", 13)


def test_a_payload_problem_after_the_first_bad_seq_is_not_the_finding():
    events, checkpoints, _ = with_payload(payload={"other": 1})
    events[5]["fields"]["attempt"] = 9  # the chain breaks at 6, before the payload at 13
    report = verify(events, checkpoints)
    assert (report.finding.reason, report.finding.first_seq) == ("mutated", 6)


def test_the_command_line_prints_payload_removed_by_retention(tmp_path):
    events, checkpoints, _ = with_payload(payload_removed=REMOVED)
    export = {
        "run_id": RUN,
        "events": events,
        "checkpoints": checkpoints,
        "head": {"last_seq": HEAD, "last_hash": events[-1]["hash"]},
    }
    (tmp_path / "export.json").write_text(json.dumps(export))
    for name, keys in (("keys.json", KEYS), ("event-keys.json", EVENT_KEYS)):
        (tmp_path / name).write_text(json.dumps({k: "hex:" + v.hex() for k, v in keys.items()}))
    args = [
        sys.executable,
        "-I",
        str(MODULE_PATH),
        "export.json",
        "--keys",
        "keys.json",
        "--event-keys",
        "event-keys.json",
    ]
    done = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "payload removed by retention: seq 13" in done.stdout
