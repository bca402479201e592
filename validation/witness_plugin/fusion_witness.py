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


# Where each skip of a test phase was raised, by (node id, phase): the innermost frame of
# the project's own files. pytest reports a `unittest.SkipTest` at the test's own location
# whoever raised it, which would let the implementation skip a protected test as if the
# test had skipped itself.
_RAISED = {}  # type: dict


def _skip_location(report):
    raised = _RAISED.pop((report.nodeid, report.when), None)
    if raised is not None:
        return raised
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[0])
    return ""


def _raised_in(tb, root):
    found = ""
    while tb is not None:
        name = os.path.realpath(tb.tb_frame.f_code.co_filename)
        if root and (name + os.sep).startswith(root.rstrip(os.sep) + os.sep):
            found = name
        tb = tb.tb_next
    return found


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # After the other implementations: pytest's unittest support puts the exception unittest
    # caught into `call.excinfo` in its own.
    yield
    excinfo = call.excinfo
    if excinfo is None or excinfo.tb is None or not excinfo.errisinstance(pytest.skip.Exception):
        return
    if call.when == "call" and type(item).__name__ == "TestCaseFunction":
        # unittest caught the SkipTest and pytest raised it again from its own code: who
        # raised it is lost. The host knows which protected tests skip themselves at the
        # base (they are not required); any other such skip is no pass.
        _RAISED[(item.nodeid, call.when)] = ""
        return
    raised = _raised_in(excinfo.tb, os.path.realpath(_ROOT[0]) if _ROOT[0] else "")
    if raised:
        _RAISED[(item.nodeid, call.when)] = raised


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
