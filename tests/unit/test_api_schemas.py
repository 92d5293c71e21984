"""The worker API's written-out literals say exactly what the enums say."""

from typing import get_args

from ledger.api.schemas import EffectClassName, OutcomeName
from ledger.states import EffectClass, Outcome


def test_the_literals_of_the_request_schemas_are_the_enums():
    assert list(get_args(EffectClassName)) == EffectClass.values
    assert list(get_args(OutcomeName)) == Outcome.values
