"""tools/test_durations.py on a real pytest report: a small suite of known durations and outcomes
run in its own folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

import test_durations  # noqa: E402

SUITE = '''
import time
import pytest

@pytest.fixture(scope="module")
def shared():
    time.sleep(1.0)  # a shared fixture's time goes to the first test that asks for it

def test_first_user(shared):
    pass

def test_second_user(shared):
    pass

class TestGroup:
    def test_sleeps(self):
        time.sleep(0.3)

def test_fails():
    assert False

@pytest.mark.skip(reason="shown skipped")
def test_skipped():
    pass
'''


def test_slowest_tests_from_a_junit_report(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "test_small.py").write_text(SUITE)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not this repository's settings
    junit = tmp_path / "junit.xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           f"--junitxml={junit}", "sub"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout  # the failing test
    got = test_durations.summarize(junit, top=2, root=tmp_path)
    assert got["tests"] == 5 and got["outcomes"] == {"passed": 3, "failed": 1, "skipped": 1}
    first, second = got["slowest"]
    assert first["test"] == "sub/test_small.py::test_first_user" and first["seconds"] >= 1.0
    assert second["test"] == "sub/test_small.py::TestGroup::test_sleeps" and second["seconds"] >= 0.3
    assert first["outcome"] == second["outcome"] == "passed"
    assert got["wall_seconds"] >= 1.3 and got["test_seconds_total"] >= 1.3
