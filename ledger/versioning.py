"""Schema versions of durable records (invariant 9).

Every durable row carries ``schema_version``. A reader that meets a version it does not
know refuses the row with :class:`UnknownSchemaVersion` instead of guessing what it means.
"""

from collections.abc import Collection
from typing import Any, Self

from django.db import models
from django.db.models.fetch_modes import FetchMode

from ledger.errors import UnknownSchemaVersion

CURRENT_SCHEMA_VERSION = 1
KNOWN_SCHEMA_VERSIONS = frozenset({1})
# Records with more than one version this build reads. An operation's version follows the
# phase of the operation.provider_ref change (ledger/services/upgrades/provider_ref.py): this
# build reads 1 and 2 during its window; any other version is refused, as before.
# An event's version 2 (fenceline_client.evidence_verifier.PAYLOAD_VERSION) commits to a
# diagnostic payload by its digest; version 1 events are hashed as they always were.
RECORD_VERSIONS: dict[str, frozenset[int]] = {
    "ledger.Operation": frozenset({1, 2}),
    "ledger.Event": frozenset({1, 2}),
}


def known_for(label: str) -> frozenset[int]:
    """The versions this build reads of the record ``label`` ("app.Model")."""
    return RECORD_VERSIONS.get(label, KNOWN_SCHEMA_VERSIONS)


def require_known(
    version: object, what: str = "record", *, stored: bool = False, known: frozenset[int] = KNOWN_SCHEMA_VERSIONS
) -> int:
    """``version`` if this build can read it; else UnknownSchemaVersion (``stored``: the
    version came from a row written by a newer build, not from a request)."""
    if type(version) is not int or version not in known:
        raise UnknownSchemaVersion(version, what, known=known, stored=stored)
    return version


class Versioned(models.Model):
    """Abstract base: a schema_version column checked whenever a row is loaded."""

    schema_version = models.PositiveSmallIntegerField(default=CURRENT_SCHEMA_VERSION)

    class Meta:
        abstract = True

    @classmethod
    def from_db(
        cls,
        db: str | None,
        field_names: Collection[str],
        values: Collection[Any],
        *,
        fetch_mode: FetchMode | None = None,
    ) -> Self:
        instance = super().from_db(db, field_names, values, fetch_mode=fetch_mode)
        if "schema_version" in field_names:
            label = cls._meta.label
            require_known(instance.schema_version, f"{label} row", stored=True, known=known_for(label))
        return instance
