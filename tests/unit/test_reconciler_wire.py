"""Retry-After as providers send it (ledger/services/reconciliation/wire.py): delta-seconds or
an HTTP date; anything else is no instruction."""

from ledger.services.reconciliation.wire import retry_after

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def test_retry_after_in_seconds_or_as_an_http_date():
    assert retry_after({"Retry-After": "120"}, now=NOW) == 120.0
    assert retry_after({"Retry-After": "Fri, 15 Jan 2027 08:10:00 GMT"}, now=NOW) == 600.0
    assert retry_after({"Retry-After": "Fri, 15 Jan 2027 07:00:00 GMT"}, now=NOW) == 0.0  # already past


def test_no_or_a_malformed_retry_after_is_none():
    assert retry_after({}, now=NOW) is None
    assert retry_after({"Retry-After": "soon"}, now=NOW) is None
    assert retry_after({"Retry-After": "-5"}, now=NOW) is None
