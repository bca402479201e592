"""Filtering: foreign keys filter by plain id, without a lookup of the related object.

django-filter's default ModelChoiceFilter answers 400 for an id that does not exist and
200 for one the user cannot see, which would tell a stranger which missions exist."""

from django.db import models
from django_filters import rest_framework as filters

# An id the database cannot even represent (SQLite and PostgreSQL keep 64-bit integers) is
# a bad request, not a server error.
ID_BOUNDS = {"min_value": -(2**63), "max_value": 2**63 - 1}
ID_FILTER = {"filter_class": filters.NumberFilter, "extra": lambda field: dict(ID_BOUNDS)}


class IdFilterSet(filters.FilterSet):
    FILTER_DEFAULTS = {
        **filters.FilterSet.FILTER_DEFAULTS,
        models.ForeignKey: ID_FILTER,
        models.OneToOneField: ID_FILTER,
    }


class FilterBackend(filters.DjangoFilterBackend):
    filterset_base = IdFilterSet
