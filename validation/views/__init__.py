"""The dashboard: server-rendered pages that stay live through the mission's event
stream. Every page is made of regions; each region is also served alone as a fragment
(`…/_/<part>/`) that the page's script re-fetches when an event concerns it."""

from validation.views.pages import (  # noqa: F401
    feature_detail,
    feature_part,
    mission_detail,
    mission_list,
    mission_list_part,
    mission_part,
)
from validation.views.runs import review_detail, review_part, run_detail, run_part  # noqa: F401
from validation.views.static import static_file  # noqa: F401
