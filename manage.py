#!/usr/bin/env python
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fusion_site.settings")
    # How long an idle Dramatiq consumer sleeps at most between two looks at Redis (its
    # default, 1 s, is added to every hop of the loop on a quiet system). `rundramatiq`
    # hands the environment to the `dramatiq` program, which reads it at import; the
    # embedded workers use the same 100 ms (missions/management/workers.py).
    os.environ.setdefault("dramatiq_worker_timeout", "100")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
