"""The soak suite reuses the integration fixtures (see tests/faults/conftest.py)."""
import pathlib
import sys

_IT = pathlib.Path(__file__).resolve().parents[1] / "integration"
sys.path.insert(0, str(_IT))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from tp_testlib import reuse_integration_fixtures  # noqa: E402

reuse_integration_fixtures(globals(), "tp_integration_conftest_soak")
