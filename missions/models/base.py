"""What every model of the plan shares: timestamps, and a field's column."""

from __future__ import annotations

from django.db import models


def column(model: type[models.Model], name: str) -> str:
    """The database column of a concrete field (for the few statements written out)."""
    field = model._meta.get_field(name)
    assert isinstance(field, models.Field) and field.column  # a concrete field
    return field.column


class TimeStamped(models.Model):
    """`updated_at` is bumped by save(); services that use queryset.update() set it too."""

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True
