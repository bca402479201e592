"""Where the sandbox is said (docs/SANDBOX.md, "Modes"): `check --deploy`, the banner on
every dashboard page, the run page and the API's run. Bubblewrap is made unavailable for
real: a PATH with every system command but `bwrap`."""

from __future__ import annotations

import os
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from fusion_site.runtime import sandbox
from missions.models import MissionFeature
from validation.services import runner
from validation.services.verdicts.admit import feature_admit

pytestmark = pytest.mark.django_db(transaction=True)


def _forget() -> None:
    sandbox._probe.cache_clear()
    sandbox.overlay_works.cache_clear()


@pytest.fixture
def without_bwrap(monkeypatch, tmp_path):
    """A PATH holding every system command but `bwrap`."""
    bin_dir = tmp_path / "bin-without-bwrap"
    bin_dir.mkdir()
    for entry in Path("/usr/bin").iterdir():
        if entry.name != "bwrap":
            (bin_dir / entry.name).symlink_to(entry)
    kept = [p for p in os.environ["PATH"].split(os.pathsep) if p and Path(p).resolve() not in (Path("/usr/bin"),)]
    monkeypatch.setenv("PATH", os.pathsep.join([str(bin_dir), *[p for p in kept if not Path(p, "bwrap").exists()]]))
    _forget()
    yield
    _forget()


def _deploy_check() -> str:
    out = StringIO()
    try:
        call_command("check", "--deploy", stdout=out, stderr=out)
    except Exception as exc:  # noqa: BLE001 — a system check error raises; its text is what we read
        return f"{out.getvalue()}\n{exc}"
    return out.getvalue()


def test_check_deploy_warns_without_bubblewrap_and_errs_when_it_is_required(without_bwrap, settings):
    assert not sandbox.status().confined
    settings.FUSION_SANDBOX = "auto"
    assert "fusion.W010" in _deploy_check() and "UNSANDBOXED" in _deploy_check()
    settings.FUSION_SANDBOX = "required"
    assert "fusion.E010" in _deploy_check()


def test_check_deploy_is_quiet_about_the_sandbox_where_it_works(settings):
    if not sandbox.status().confined:
        pytest.fail("bubblewrap is required for this test (docs/SANDBOX.md): apt install bubblewrap")
    settings.FUSION_SANDBOX = "auto"
    report = _deploy_check()
    assert "fusion.W010" not in report and "fusion.E010" not in report


def _judge(build_mission, git_repo):
    git_repo.commit({"data.txt": "payload\n"})
    build_mission({"one": [("VAL-1", {"run": "grep -qx payload data.txt"})]})
    run = feature_admit(feature_id=MissionFeature.objects.get(key="one").pk, trigger="manual", cause="validate").run
    runner.execute_run(run.pk)
    run.refresh_from_db()
    return run


def test_an_unsandboxed_run_says_so_on_its_page_in_the_api_and_on_every_page(
    without_bwrap, settings, build_mission, git_repo, client, staff, api_for
):
    settings.FUSION_SANDBOX = "auto"
    run = _judge(build_mission, git_repo)
    assert run.status == "passed"
    assert run.sandbox.startswith("none (bubblewrap is not installed")
    client.force_login(staff)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "Unsandboxed:" in page and "data-sandbox-warning" in page
    assert api_for(staff).get(f"/api/validation-runs/{run.pk}/").json()["sandbox"] == run.sandbox


def test_a_sandboxed_run_records_bubblewrap_and_no_page_warns(settings, build_mission, git_repo, client, staff):
    if not sandbox.status().confined:
        pytest.fail("bubblewrap is required for this test (docs/SANDBOX.md): apt install bubblewrap")
    run = _judge(build_mission, git_repo)
    assert run.status == "passed" and run.sandbox.startswith("bubblewrap ")
    client.force_login(staff)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert run.sandbox in page
    assert "Unsandboxed:" not in page and "data-sandbox-warning" not in page


def test_serve_says_at_start_whether_checks_run_sandboxed(without_bwrap, settings):
    from django.core.management.base import OutputWrapper

    from validation.management.commands.serve import Command

    settings.FUSION_SANDBOX = "auto"
    command = Command()
    out, err = StringIO(), StringIO()
    command.stdout, command.stderr = OutputWrapper(out), OutputWrapper(err)
    command._say_sandbox()
    assert "checks run UNSANDBOXED (bubblewrap is not installed" in err.getvalue()
    _forget()
    os.environ["PATH"] = os.pathsep.join(["/usr/bin", os.environ["PATH"]])  # bubblewrap back
    if not sandbox.status().confined:
        pytest.fail("bubblewrap is required for this test (docs/SANDBOX.md): apt install bubblewrap")
    out, err = StringIO(), StringIO()
    command.stdout, command.stderr = OutputWrapper(out), OutputWrapper(err)
    command._say_sandbox()
    assert "checks run sandboxed: bubblewrap" in out.getvalue() and not err.getvalue()


def test_a_check_reaches_the_network_only_when_it_declares_it_and_the_run_shows_it(
    settings, build_mission, git_repo, client, staff
):
    import socket

    from validation.views.common import describe_check

    if not sandbox.status().confined:
        pytest.fail("bubblewrap is required for this test (docs/SANDBOX.md): apt install bubblewrap")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    connect = f"python -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 5); print('connected')\""
    try:
        git_repo.commit({"data.txt": "payload\n"})
        build_mission(
            {
                "net": [
                    ("VAL-1", {"run": connect, "network": True}),
                    ("VAL-2", {"run": connect, "expect_exit": 1}),  # no network: refused
                ]
            }
        )
        run = feature_admit(feature_id=MissionFeature.objects.get(key="net").pk, trigger="manual", cause="validate").run
        runner.execute_run(run.pk)
        run.refresh_from_db()
    finally:
        listener.close()
    verdicts = {a["key"]: a for a in run.verdict["assertions"]}
    assert verdicts["VAL-1"]["verdict"] == "pass" and "connected" in verdicts["VAL-1"]["evidence"][0]["text"]
    assert verdicts["VAL-2"]["verdict"] == "pass" and "connected" not in verdicts["VAL-2"]["evidence"][0]["text"]
    assert describe_check({"run": connect, "network": True}).endswith("· with network")


def test_the_command_validator_never_mounts_a_folder_holding_the_services_state(tmp_path):
    import sys

    from django.conf import settings

    from validation.validators.command import _program_mount

    data = Path(settings.DATA_DIR)
    assert _program_mount(data.parent) is None  # `agent --dir /work`: not the data folder under it
    assert _program_mount(Path("/")) is None
    script = tmp_path / "validator.py"
    script.write_text("print('hi')\n")
    assert _program_mount(script) == script  # the file alone, not its folder's neighbours
    venv_python = Path(sys.executable)
    if venv_python.parent.name == "bin" and not data.resolve().is_relative_to(venv_python.parent.parent.resolve()):
        assert _program_mount(venv_python) == venv_python.parent.parent  # a program brings its prefix
