"""The pieces of DRF this API plugs in, each named in `REST_FRAMEWORK` (fusion_site/settings.py)
or on its view: token authentication, the filter backend, and the mission-file parsers.

Authentication: DRF's `TokenAuthentication` reads the token with its user on every
request; building that queryset cost more than running it (docs/BENCHMARKS.md, "Loop
throughput"): the same read, prepared (`fusion_site/runtime/prepared.py`), with DRF's own
answers for an unknown token and an inactive user.

Filtering: foreign keys filter by plain id, without a lookup of the related object.
django-filter's default ModelChoiceFilter answers 400 for an id that does not exist and
200 for one the user cannot see, which would tell a stranger which missions exist.

Parsing: a mission file posted to the import action reaches the importer as text.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _
from django_filters import rest_framework as filters
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication
from rest_framework.authtoken.models import Token
from rest_framework.parsers import BaseParser

from missions import fastpaths


class PreparedTokenAuthentication(TokenAuthentication):
    def authenticate_credentials(self, key):
        try:
            token = fastpaths.token_with_user(key=key)
        except Token.DoesNotExist:
            raise exceptions.AuthenticationFailed(_("Invalid token.")) from None
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        return (token.user, token)


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


class YAMLParser(BaseParser):
    """Hands the raw text to the mission-file importer, which parses and reports errors."""

    media_type = "application/yaml"

    def parse(self, stream, media_type=None, parser_context=None):
        return stream.read().decode("utf-8", errors="replace")


class JSONTextParser(YAMLParser):
    """A JSON mission file as text too: the importer reads it like YAML (JSON is YAML), so a
    mistake in it reads as the command line reports it for the same file."""

    media_type = "application/json"
