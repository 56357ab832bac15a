"""Fixtures of the fault suite: the integration suite's fixtures (daemon, client, leak
check after every test, ...) reused as they are, plus host-wide leak inspection in
faultlib.py.

    /usr/bin/python3 -m pytest -q tests/faults        (root, after the build)
"""
import importlib.util
import pathlib
import sys

_IT = pathlib.Path(__file__).resolve().parents[1] / "integration"
sys.path.insert(0, str(_IT))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

# Loaded under its own name: pytest imports each directory's conftest.py as "conftest".
_spec = importlib.util.spec_from_file_location("tp_integration_conftest_faults", _IT / "conftest.py")
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
globals().update({k: v for k, v in vars(_mod).items() if not k.startswith("__")})
