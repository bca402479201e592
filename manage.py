#!/usr/bin/env python
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fusion_site.settings")
    # The Dramatiq worker timeout that `rundramatiq` hands to the `dramatiq` program is set
    # by the settings from FUSION_WORKER_POLL_MS (fusion_site/settings.py), not here.
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
