"""Filtering: foreign keys filter by plain id, without a lookup of the related object.

django-filter's default ModelChoiceFilter answers 400 for an id that does not exist and
200 for one the user cannot see, which would tell a stranger which missions exist."""

from django.db import models
from django_filters import rest_framework as filters


class IdFilterSet(filters.FilterSet):
    FILTER_DEFAULTS = {
        **filters.FilterSet.FILTER_DEFAULTS,
        models.ForeignKey: {"filter_class": filters.NumberFilter},
        models.OneToOneField: {"filter_class": filters.NumberFilter},
    }


class FilterBackend(filters.DjangoFilterBackend):
    filterset_base = IdFilterSet
