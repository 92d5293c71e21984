"""Schema versions of durable records (invariant 9).

Every durable row carries ``schema_version``. A reader that meets a version it does not
know refuses the row with :class:`UnknownSchemaVersion` instead of guessing what it means.
"""

from django.db import models

from ledger.errors import UnknownSchemaVersion

CURRENT_SCHEMA_VERSION = 1
KNOWN_SCHEMA_VERSIONS = frozenset({1})


def require_known(version: object, what: str = "record", *, stored: bool = False) -> int:
    """``version`` if this build can read it; else UnknownSchemaVersion (``stored``: the
    version came from a row written by a newer build, not from a request)."""
    if type(version) is not int or version not in KNOWN_SCHEMA_VERSIONS:
        raise UnknownSchemaVersion(version, what, known=KNOWN_SCHEMA_VERSIONS, stored=stored)
    return version


class Versioned(models.Model):
    """Abstract base: a schema_version column checked whenever a row is loaded."""

    schema_version = models.PositiveSmallIntegerField(default=CURRENT_SCHEMA_VERSION)

    class Meta:
        abstract = True

    @classmethod
    def from_db(cls, db, field_names, values, *args, **kwargs):
        instance = super().from_db(db, field_names, values, *args, **kwargs)
        if "schema_version" in field_names:
            require_known(instance.schema_version, f"{cls._meta.label} row", stored=True)
        return instance
