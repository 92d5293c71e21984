"""Saved views of the lists: saved from the list page, listed on it, deleted from it, each
user's own only; bad input is refused naming the field and saves nothing."""

import pytest
from django.urls import reverse

from ledger.models import SavedView
from ledger.services.operating.saved_views import MAX_VIEWS_PER_LIST, saved_view_save
from tests.factories import user_with
from tests.helpers import Browser

SAVE = reverse("saved-view-save")


def test_a_view_saved_from_a_list_opens_the_list_as_it_was(admin):
    me = Browser(admin)
    answer = me.post(
        SAVE, {"list": "runs", "name": "Broken ones", "query": "integrity=BROKEN&size=100&before=abc&page=3"}
    )
    assert answer.status_code == 302 and answer["Location"] == "/runs/?integrity=BROKEN&size=100"
    view = SavedView.objects.get(user=admin)
    assert (view.list_name, view.name, view.querystring) == ("runs", "Broken ones", "integrity=BROKEN&size=100")
    body = me.get(reverse("runs")).content.decode()
    assert 'href="/runs/?integrity=BROKEN&amp;size=100">Broken ones</a>' in body


def test_saving_a_name_again_replaces_that_view(admin):
    saved_view_save(user=admin, list_name="cases", name="mine", querystring="status=mine")
    saved_view_save(user=admin, list_name="cases", name="mine", querystring="status=all")
    assert list(SavedView.objects.values_list("querystring", flat=True)) == ["status=all"]


def test_saved_views_are_each_users_own(admin, operator):
    theirs = saved_view_save(user=admin, list_name="cases", name="ada's view", querystring="status=all")
    other = Browser(operator)
    assert "ada&#x27;s view" not in other.get(reverse("cases")).content.decode()
    assert other.post(reverse("saved-view-delete", args=[theirs.pk])).status_code == 404
    assert SavedView.objects.filter(pk=theirs.pk).exists()
    mine = Browser(admin)
    assert "ada&#x27;s view" in mine.get(reverse("cases")).content.decode()
    assert mine.post(reverse("saved-view-delete", args=[theirs.pk]), {"next": "/cases/?status=all"})["Location"] == (
        "/cases/?status=all"
    )
    assert not SavedView.objects.exists()


@pytest.mark.parametrize(
    "data, field",
    [
        ({"list": "runs", "name": "", "query": ""}, "name"),
        ({"list": "runs", "name": "x" * 81, "query": ""}, "name"),
        ({"list": "nonsense", "name": "v", "query": ""}, "list"),
        ({"list": "runs", "name": "v", "query": "q=" + "a" * 1500}, "query"),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_saves_nothing(admin, data, field):
    answer = Browser(admin).post(SAVE, data)
    assert answer.status_code in (400, 422)
    assert f"{field}:" in answer.content.decode()
    assert not SavedView.objects.exists()


def test_a_list_holds_a_bounded_number_of_saved_views(acme):
    user = user_with("viewer", acme.tenant, "many")
    for i in range(MAX_VIEWS_PER_LIST):
        saved_view_save(user=user, list_name="runs", name=f"v{i}", querystring=f"q={i}")
    answer = Browser(user).post(SAVE, {"list": "runs", "name": "one more", "query": ""})
    assert answer.status_code == 422 and "delete one first" in answer.content.decode()


def test_saving_and_deleting_need_a_post_and_a_session(client, admin):
    assert client.post(SAVE, {"list": "runs", "name": "v"}).status_code == 302  # to sign in
    assert Browser(admin).get(SAVE).status_code == 405
    assert not SavedView.objects.exists()
