"""The package itself: public names documented, typed marker shipped, offline wheel build."""
import importlib.util
import inspect
import os
import sys
import zipfile

import tidepool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_public_name_is_documented():
    missing = []
    for name in tidepool.__all__:
        obj = getattr(tidepool, name)
        if name.startswith("__") or isinstance(obj, str):
            continue
        if not inspect.getdoc(obj):
            missing.append(name)
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_"):
                    continue
                if inspect.isfunction(member) or isinstance(member, (property, classmethod, staticmethod)):
                    target = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
                    if not inspect.getdoc(target):
                        missing.append(f"{name}.{attr}")
    assert not missing, f"undocumented public names: {missing}"


def test_py_typed_marker_present():
    assert os.path.exists(os.path.join(ROOT, "tidepool", "py.typed"))


def test_backend_builds_a_wheel_without_network(tmp_path):
    spec = importlib.util.spec_from_file_location("tidepool_build", os.path.join(ROOT, "_build", "tidepool_build.py"))
    backend = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backend)
    assert backend.get_requires_for_build_wheel() == []
    name = backend.build_wheel(str(tmp_path))
    assert name == f"tidepool-{tidepool.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(tmp_path / name) as zf:
        names = set(zf.namelist())
        assert {"tidepool/__init__.py", "tidepool/client.py", "tidepool/py.typed"} <= names
        dist = f"tidepool-{tidepool.__version__}.dist-info"
        assert {f"{dist}/METADATA", f"{dist}/WHEEL", f"{dist}/RECORD"} <= names
        record = zf.read(f"{dist}/RECORD").decode()
        assert all(n in record for n in names)
        # The wheel imports on its own.
        zf.extractall(tmp_path / "site")
    sys.path.insert(0, str(tmp_path / "site"))
    try:
        import subprocess
        out = subprocess.run([sys.executable, "-c", "import tidepool, sys; print(tidepool.__file__)"],
                             cwd=str(tmp_path), env={"PYTHONPATH": str(tmp_path / "site")},
                             capture_output=True, text=True, check=True).stdout
        assert out.startswith(str(tmp_path / "site"))
    finally:
        sys.path.remove(str(tmp_path / "site"))
    sdist = backend.build_sdist(str(tmp_path))
    assert sdist.endswith(".tar.gz")
