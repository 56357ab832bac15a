"""Fixtures of the fault suite: the integration suite's fixtures (daemon, client, leak
check after every test, ...) reused as they are, plus host-wide leak inspection in
faultlib.py.

    /usr/bin/python3 -m pytest -q tests/faults        (root, after the build)
"""
import pathlib
import sys

_IT = pathlib.Path(__file__).resolve().parents[1] / "integration"
sys.path.insert(0, str(_IT))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from tp_testlib import reuse_integration_fixtures  # noqa: E402

reuse_integration_fixtures(globals(), "tp_integration_conftest_faults")
