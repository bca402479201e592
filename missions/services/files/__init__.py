"""Missions as code: import and export the mission file; see docs/MISSION_FILES.md.

Decisions (what the file means):
- The whole document is validated before anything is written; every error is reported
  as `path: message` (`milestones[0].slices[1].key: duplicate key s1`) in one
  `Invalid(code="invalid_mission_file")`: the YAML or JSON, the declaration, the rules of
  the whole file, then those that need the stored mission (a link the file leaves in
  place). The command line and the API read a file through this
  one path and report the same lines. Then what the importer may not do (staff, owner,
  repository rules, each with its code) is judged of the valid file, and the import runs
  in one transaction.
- Who owns the mission: the `owner` given (`import_mission --owner`, `demo --owner`) is
  set on a new or an existing mission; without one, a new mission belongs to the user who
  imports it (the API's caller; none from the command line, so only staff see it) and an
  existing mission keeps its owner. The owner is not made a member: owning a mission is
  what lets its owner see it (`missions/selectors.py: visible_missions`).
- Entities are matched by key: the mission by `key`, milestones, slices, features and
  assertions by their key within the mission. A matched entity may move (a slice to
  another milestone, a feature to another slice, an assertion to another milestone).
- The file is declarative: an omitted field means the model default, so re-importing a
  file without `description` clears a stored description. Order comes from list
  positions; stored orders are only renumbered when the file's order differs from the
  stored relative order (so re-importing an export never rewrites anything).
- Entities that are in the database but not in the file are LEFT ALONE, never deleted:
  the database holds work the file knows nothing about (tasks, runs, failures, fix
  features the loop generated after the last export). Delete through the API or admin.
  References in the file (milestone `dependencies`, a feature's `assertions`) must name
  entities of the file; links of a file entity are made to match the file exactly.
- States are not imported: they change through the services. The mission `status` is
  applied to a NEW mission only and ignored when the mission exists.
- A `check` (it executes code) or an `executor_command` may only be set or changed by
  staff or from the CLI (`user=None`); an unchanged value is allowed for anyone.
- `repository` is a git URL or a local path (docs/REPOSITORIES.md); `workspace`, its former
  name, is still read for one release (the same value as `repository`, or alone). A
  relative local path is resolved against `base_dir` (the file's folder) and stored
  absolute; a file sent to the API (`from_api`) has no folder, and a relative path is one
  of its errors. The repository is then checked (`fusion_site.repos.sources.check_repository`)
  with the importer's staff flag, the command line (`user=None`) counting as staff: a
  local path or `file://` URL only from staff or inside FUSION_WORKSPACE_ROOTS; an
  unchanged value is not judged again. A refusal is `Invalid(code="repository_refused")`.
  `credentials_env` names a variable on the workers (never its value). Export writes
  `repository` and `credentials_env` as stored, never `workspace`.
- The validator profile names (`validator`, `allowed_validators`) are not checked against
  the configured profiles: they depend on the environment, and a missing one is reported
  when a run needs it. The rules every writer applies (`missions/services/verdict_settings.py`:
  the base pinned to `base_commit`, protected patterns that match something at the base,
  credentials the deployment allows, the owner or staff changing the validators) refuse
  with the field's path (`mission.base_revision: …`) and their code. Export writes
  `base_revision` as given, never `base_commit`.

Where it lives:
- `schema`: the file declared once (pydantic models whose types, defaults and limits come
  from the Django model fields) and its JSON schema (`docs/mission-file.schema.json`);
- `fields`: the rules of one value (a text, a number, a check, a list of patterns) and
  `column`, the file field of a model column;
- `forge_section`: the rules and defaults of the `forge:` section, which the `forges`
  app writes (`missions.hooks.mission_file_imported`, in the import's transaction);
- `yaml_io`: the reader of YAML and JSON (duplicate keys refused) and the writer of exports;
- `validating`: the declaration's verdict as `path: message` errors, then the rules that
  need the whole file (duplicate keys, references, cycles, protection, the repository's
  former name and relative path);
- `importing`: the import's transaction, the rules that need the stored mission and what
  the importer may not do, then what the written work reopens;
- `writing`: the rows, matched by key, each level of the tree saved only where it differs;
- `exporting`: the mission back as its file;
- `planning`: the import's dry run (the import rolled back, with what it created, changed,
  refused and reopened) and the apply of exactly what a plan answered, by its hash.
"""

from __future__ import annotations

from missions.services.files.exporting import mission_export
from missions.services.files.importing import ImportResult, mission_file_import, mission_import
from missions.services.files.schema import MISSION_FIELDS, MissionFile, mission_file_json_schema
from missions.services.files.yaml_io import MAX_DOCUMENT_CHARS

__all__ = [
    "MAX_DOCUMENT_CHARS",
    "MISSION_FIELDS",
    "ImportResult",
    "MissionFile",
    "mission_export",
    "mission_file_import",
    "mission_file_json_schema",
    "mission_import",
]
