"""Loaded by pytest (`-p fusion_witness`) in a check the host runs (validation/witness.py):
writes every test report, as it happens, to the file the host created outside the check's
folder, so that the host reads which tests ran and how they ended without trusting the
process's exit code. It writes nothing when the host did not ask for it (a pytest started
by a test). Kept tiny and free of anything newer than pytest 7 and Python 3.7."""

import json
import os

import pytest

# Taken out of the environment at once: the code under test, imported later, and the
# processes it starts do not find them there.
_PATH = os.environ.pop("FUSION_WITNESS_FILE", "")
_TOKEN = os.environ.pop("FUSION_WITNESS_TOKEN", "")
_FD = os.open(_PATH, os.O_WRONLY | os.O_APPEND) if _PATH else -1
_ROOT = [""]


def _write(record):
    if _FD >= 0:
        record["token"] = _TOKEN
        os.write(_FD, (json.dumps(record) + "\n").encode())


def _skip_location(report):
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[0])
    return ""


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    _ROOT[0] = str(getattr(config, "rootpath", None) or config.rootdir)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report):
    _write(
        {
            "root": _ROOT[0],
            "nodeid": report.nodeid,
            "when": report.when,
            "outcome": report.outcome,
            "skipped_at": _skip_location(report) if report.outcome == "skipped" else "",
        }
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collectreport(report):
    if report.outcome != "passed":
        _write(
            {
                "root": _ROOT[0],
                "nodeid": report.nodeid,
                "when": "collect",
                "outcome": report.outcome,
                "skipped_at": _skip_location(report) if report.outcome == "skipped" else "",
            }
        )


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    _write({"root": _ROOT[0], "finished": int(exitstatus)})
