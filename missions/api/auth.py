"""Token authentication with its one read compiled once per process.

DRF's `TokenAuthentication` reads the token with its user on every request; building
that queryset cost more than running it (docs/BENCHMARKS.md, "Loop throughput"): the same read,
prepared (`fusion_site/runtime/prepared.py`), with DRF's own answers for an unknown token
and an inactive user."""

from __future__ import annotations

from django.utils.translation import gettext_lazy as _
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication
from rest_framework.authtoken.models import Token

from fusion_site.runtime.prepared import Prepared

_TOKEN: Prepared[Token] = Prepared(lambda key: Token.objects.select_related("user").filter(key=key), key=str)


class PreparedTokenAuthentication(TokenAuthentication):
    def authenticate_credentials(self, key):
        try:
            token = _TOKEN.get(key=key)
        except Token.DoesNotExist:
            raise exceptions.AuthenticationFailed(_("Invalid token.")) from None
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        return (token.user, token)
