"""Schema operations the migrations share."""

from django.db import migrations


def set_fillfactor(table: str, percent: int) -> migrations.RunSQL:
    """Leave ``100 - percent`` of each new heap page of ``table`` free, so that an update of
    a row finds room on its own page and can be HOT (no new index entries). Pages already
    written keep their layout until they are rewritten."""
    return migrations.RunSQL(
        f'ALTER TABLE "{table}" SET (fillfactor = {int(percent)})', f'ALTER TABLE "{table}" RESET (fillfactor)'
    )
