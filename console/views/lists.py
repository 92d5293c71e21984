"""Saved views of the console's lists: save the list's current query under a name, delete
one. Each is the user's own (``ledger.services.operating.saved_views``): another user's
saved view is a 404."""

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from console.views.common import BAD_INPUT, HtmxHttpRequest, form_errors, next_url, refused_field
from console.views.paging import LISTS
from ledger.errors import DomainError
from ledger.services.operating.saved_views import saved_view_delete, saved_view_save


class SaveForm(forms.Form):
    list = forms.ChoiceField(choices=[(name, name) for name in LISTS])
    name = forms.CharField(max_length=80, strip=True)
    query = forms.CharField(max_length=2000, required=False, strip=True)


@require_POST
@login_required
def save_view(request: HtmxHttpRequest) -> HttpResponse:
    form = SaveForm(request.POST)
    list_name = request.POST.get("list", "")
    back = reverse(LISTS[list_name]) if list_name in LISTS else reverse("home")
    if not form.is_valid():
        return _refused(request, form_errors(form), back)
    data = form.cleaned_data
    try:
        view = saved_view_save(user=request.user, list_name=data["list"], name=data["name"], querystring=data["query"])
    except DomainError as exc:
        field = refused_field(exc)
        return _refused(request, f"{field}: {exc.detail}" if field else exc.detail, back, status=exc.status)
    messages.success(request, f"Saved the view “{view.name}”.")
    return redirect(f"{back}?{view.querystring}" if view.querystring else back)


def _refused(request: HtmxHttpRequest, error: str, back: str, *, status: int = BAD_INPUT) -> HttpResponse:
    """Bad input: the page says which field and why; nothing was saved."""
    return render(request, "console/saved_view_refused.html", {"error": error, "back": back}, status=status)


@require_POST
@login_required
def delete_view(request: HtmxHttpRequest, view_id: int) -> HttpResponse:
    try:
        view = saved_view_delete(user=request.user, view_id=view_id)
    except DomainError as exc:
        return HttpResponse(exc.detail, status=exc.status, content_type="text/plain")
    messages.success(request, f"Deleted the saved view “{view.name}”.")
    return redirect(next_url(request, reverse(LISTS.get(view.list_name, "home"))))
