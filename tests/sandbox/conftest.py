from tests.validation.conftest import build_mission  # noqa: F401 — a mission over a real git repository
