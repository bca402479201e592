"""The switch of the fast paths (docs/ARCHITECTURE.md, "Private internals").

`FUSION_FAST_PATHS` (on unless the environment says `off`, `0` or `false`) chooses, at
every call, between a fast path (a statement compiled once per process, a raw insert or
update written out) and the plain ORM route that gives the same rows and return values.
It is read from Django's settings at call time: an attribute read once Django has it
cached, and a test flips it with `override_settings` or the `settings` fixture.
"""

from __future__ import annotations

from django.conf import settings


def on() -> bool:
    """True where the fast paths run; False: the plain ORM route."""
    return bool(getattr(settings, "FUSION_FAST_PATHS", True))
