"""What a validator receives: a frozen description of the feature at one
revision and the path of its read-only checkout."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fusion_site.runtime.sandbox import Toolchain
from validation.protect import Protection


@dataclass(frozen=True)
class AssertionSpec:
    key: str
    title: str
    statement: str
    check: dict[str, Any] | None
    scope: str = "feature"

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "title": self.title, "statement": self.statement, "check": self.check}


@dataclass(frozen=True)
class EnvironmentReport:
    """What the run's declared environment came to (docs/ENVIRONMENTS.md): its key,
    whether it was reused or built (and how long that took), and, for a build the
    revision broke, the key files it changed and the build's log."""

    key: str
    reused: bool
    seconds: float
    ok: bool = True
    log: str = ""
    broken_by: tuple[str, ...] = ()

    def line(self) -> str:
        """The short line shown with each run check's evidence."""
        if not self.ok:
            return f"environment {self.key[:12]}: build failed after {self.seconds:.1f} s"
        return f"environment {self.key[:12]}: " + ("reused" if self.reused else f"built in {self.seconds:.1f} s")


@dataclass
class ValidationContext:
    run_id: int
    mission_key: str
    feature_key: str
    feature_title: str
    feature_description: str
    assertions: list[AssertionSpec]
    revision: str
    checkout: Path
    profile: dict[str, Any]
    task_summary: str = ""
    log_tail: str = ""
    diff: str = ""
    replay: Any = None  # a journal replayer serves answers instead of live calls
    # The protected paths the run judges under; the checkout is already restored.
    protection: Protection = field(default_factory=Protection)
    # Where a validator's own process works (`command`): a private copy of the checkout,
    # so that nothing it writes reaches what the host judges (docs/TRUTH.md). None: it
    # works nowhere but through the host's read-only tools.
    workdir: Path | None = None
    # What the mission's environment adds to a check (docs/SANDBOX.md); None: the plain
    # interpreter and the system PATH.
    toolchain: Toolchain | None = None
    environment: EnvironmentReport | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(a.key for a in self.assertions)


class ValidatorCrashed(Exception):
    """The validator could not produce a verdict (transient or not): the run is `error`."""

    def __init__(self, message: str, *, code: str = "validator_error"):
        super().__init__(message)
        self.code = code
