"""The soak suite reuses the integration fixtures (see tests/faults/conftest.py)."""
import importlib.util
import pathlib
import sys

_IT = pathlib.Path(__file__).resolve().parents[1] / "integration"
sys.path.insert(0, str(_IT))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

_spec = importlib.util.spec_from_file_location("tp_integration_conftest_soak", _IT / "conftest.py")
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
globals().update({k: v for k, v in vars(_mod).items() if not k.startswith("__")})
