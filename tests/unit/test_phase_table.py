"""The operation state machine's one table keeps invariant 4 by construction."""

from ledger.states import PHASE_TRANSITIONS, Phase, can_move


def test_dispatched_never_goes_back_to_planned_or_authorized():
    assert not can_move(Phase.DISPATCHED, Phase.PLANNED)
    assert not can_move(Phase.DISPATCHED, Phase.AUTHORIZED)
    assert PHASE_TRANSITIONS[Phase.DISPATCHED] == {Phase.CONFIRMED, Phase.FAILED, Phase.UNKNOWN}


def test_unknown_leaves_only_to_reconciled():
    assert PHASE_TRANSITIONS[Phase.UNKNOWN] == {Phase.RECONCILED}
    assert not can_move(Phase.UNKNOWN, Phase.CONFIRMED)


def test_every_phase_has_a_row():
    assert set(PHASE_TRANSITIONS) == set(Phase)
