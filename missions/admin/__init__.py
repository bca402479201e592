"""Admin for the mission hierarchy.

States change only through services, so every state field is read-only here; the
lifecycle of missions, the loop of features and the execution of tasks are driven by
admin actions that call the same services as the API and the CLI.

Modules: `helpers` (rendering, rollup refresh, the action runner), `forms`, `inlines`,
`actions`, and the model admins in `hierarchy` (missions, milestones, slices),
`features` (features, assertions, links) and `tasks` (tasks, the audit log). The loop
actions on features (validate, repair, create fix, review) are added by
`validation.admin_features`, which replaces the feature admin with a subclass: missions
never import validation (docs/ARCHITECTURE.md, "Floors").
"""

from missions.admin import features, hierarchy, tasks  # noqa: F401,E402 — registers the model admins
from missions.admin.helpers import (  # noqa: F401 — re-exported for validation.admin
    TIMESTAMPS,
    LinkDisplays,
    admin_link,
    link_display,
    preformatted,
    pretty_json,
    related,
    short_sha,
)
