"""The worker's tags for provider lookups (fenceline_client.provider_tags): plain functions
of the key, without Django, that the reconcilers search for."""

import email.utils

import pytest

from fenceline_client.provider_tags import github_marker, message_id, slack_metadata, stripe_metadata


def test_the_tags_carry_the_key():
    assert stripe_metadata("pay-1") == {"fenceline_key": "pay-1"}
    assert github_marker("deploy-7") == "<!-- fenceline:deploy-7 -->"
    assert slack_metadata("notify-1") == {
        "event_type": "fenceline_effect",
        "event_payload": {"fenceline_key": "notify-1"},
    }
    assert message_id("invoice-1", "Mail.Example.com") == "<fl.invoice-1@mail.example.com>"


@pytest.mark.parametrize("key", ["a-->b", "x -- y", "<!-- z -->", "é/\u200b"])
def test_no_key_can_close_the_github_marker_early(key):
    marker = github_marker(key)
    assert marker.count("-->") == 1 and marker.endswith(" -->")


@pytest.mark.parametrize("key", ["a b", 'q"uote', "dots.and..more", "<>@[]", "ünïcode", "x" * 200])
def test_every_key_makes_a_message_id_that_parses_as_one(key):
    made = message_id(key, "mail.example.com")
    _name, address = email.utils.parseaddr(made)
    assert address == made[1:-1] and made.count("@") == 1
    assert message_id(key, "mail.example.com") == made  # the same key, the same id
    assert made != message_id(key + "!", "mail.example.com")


def test_a_bad_key_or_domain_is_refused():
    with pytest.raises(ValueError, match="key"):
        stripe_metadata("")
    with pytest.raises(ValueError, match="domain"):
        message_id("k", "not a domain")
