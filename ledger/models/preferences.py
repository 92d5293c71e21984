"""What a console user keeps for themselves: saved views of the lists (a name for a list's
query string). Per user only: nobody else sees, uses or deletes them."""

from django.conf import settings
from django.db import models

from ledger.versioning import Versioned


class SavedView(Versioned):
    """A list's filters, order and page size under a name the user chose."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="saved_views")
    list_name = models.CharField(max_length=40)  # which list: runs, cases, approvals, ...
    name = models.CharField(max_length=80)
    querystring = models.CharField(max_length=1000, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "list_name", "name"], name="savedview_unique_name")]
        ordering = ["list_name", "name"]

    def __str__(self) -> str:
        return f"{self.list_name}: {self.name}"
