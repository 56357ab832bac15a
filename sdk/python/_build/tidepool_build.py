"""In-tree PEP 517 build backend for the Tidepool SDK, standard library only.

Why not setuptools: pip builds in an isolated environment and first downloads the
backend (setuptools, wheel) from an index; on an offline host that fails. This backend
needs nothing but the standard library, declares no build requirements, and so
`pip install ./sdk/python` works offline. The package is pure Python: the wheel is the
`tidepool/` directory plus a `.dist-info` directory, built with `zipfile`.
"""
from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile
from typing import Dict, List, Optional, Tuple

NAME = "tidepool"
SUMMARY = "Python SDK for Tidepool, a sandbox platform for RL training"
REQUIRES_PYTHON = ">=3.9"
LICENSE = "Apache-2.0"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE_DIR = os.path.join(ROOT, NAME)


def _version() -> str:
    with open(os.path.join(PACKAGE_DIR, "version.py"), encoding="utf-8") as f:
        m = re.search(r'__version__\s*=\s*"([^"]+)"', f.read())
    if not m:
        raise RuntimeError("tidepool/version.py has no __version__")
    return m.group(1)


def _readme() -> str:
    try:
        with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


def _metadata() -> str:
    return (
        "Metadata-Version: 2.1\n"
        f"Name: {NAME}\n"
        f"Version: {_version()}\n"
        f"Summary: {SUMMARY}\n"
        f"License: {LICENSE}\n"
        f"Requires-Python: {REQUIRES_PYTHON}\n"
        "Classifier: Programming Language :: Python :: 3\n"
        "Classifier: Typing :: Typed\n"
        "Description-Content-Type: text/markdown\n"
        "\n" + _readme()
    )


def _dist_info() -> str:
    return f"{NAME}-{_version()}.dist-info"


def _dist_info_files() -> Dict[str, bytes]:
    wheel = "Wheel-Version: 1.0\nGenerator: tidepool_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    return {
        "METADATA": _metadata().encode("utf-8"),
        "WHEEL": wheel.encode("utf-8"),
        "top_level.txt": f"{NAME}\n".encode("utf-8"),
    }


def _package_files() -> List[Tuple[str, str]]:
    """(archive name, file path) of every file of the package, sorted for reproducibility."""
    out = []
    for dirpath, dirnames, filenames in os.walk(PACKAGE_DIR):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for fn in sorted(filenames):
            if fn.endswith((".py", ".typed")):
                full = os.path.join(dirpath, fn)
                out.append((os.path.relpath(full, ROOT).replace(os.sep, "/"), full))
    return out


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")
    return f"{name},sha256={digest},{len(data)}"


def get_requires_for_build_wheel(config_settings: Optional[dict] = None) -> List[str]:
    """PEP 517: nothing to install before building."""
    return []


def get_requires_for_build_sdist(config_settings: Optional[dict] = None) -> List[str]:
    """PEP 517: nothing to install before building."""
    return []


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: Optional[dict] = None) -> str:
    """PEP 517: writes the .dist-info directory."""
    d = os.path.join(metadata_directory, _dist_info())
    os.makedirs(d, exist_ok=True)
    for fn, data in _dist_info_files().items():
        with open(os.path.join(d, fn), "wb") as f:
            f.write(data)
    return _dist_info()


def build_wheel(wheel_directory: str, config_settings: Optional[dict] = None,
                metadata_directory: Optional[str] = None) -> str:
    """PEP 517: builds tidepool-<version>-py3-none-any.whl."""
    name = f"{NAME}-{_version()}-py3-none-any.whl"
    records = []
    os.makedirs(wheel_directory, exist_ok=True)
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as zf:
        for arc, full in _package_files():
            with open(full, "rb") as f:
                data = f.read()
            zf.writestr(arc, data)
            records.append(_record_line(arc, data))
        for fn, data in _dist_info_files().items():
            arc = f"{_dist_info()}/{fn}"
            zf.writestr(arc, data)
            records.append(_record_line(arc, data))
        records.append(f"{_dist_info()}/RECORD,,")
        zf.writestr(f"{_dist_info()}/RECORD", ("\n".join(records) + "\n").encode("utf-8"))
    return name


def build_sdist(sdist_directory: str, config_settings: Optional[dict] = None) -> str:
    """PEP 517: builds tidepool-<version>.tar.gz with the package, this backend and PKG-INFO."""
    base = f"{NAME}-{_version()}"
    name = f"{base}.tar.gz"
    files = [(arc, full) for arc, full in _package_files()]
    for extra in ("pyproject.toml", "README.md", "_build/tidepool_build.py"):
        full = os.path.join(ROOT, extra)
        if os.path.exists(full):
            files.append((extra, full))
    os.makedirs(sdist_directory, exist_ok=True)
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as tf:
        for arc, full in files:
            tf.add(full, arcname=f"{base}/{arc}", recursive=False)
        info = _metadata().encode("utf-8")
        ti = tarfile.TarInfo(f"{base}/PKG-INFO")
        ti.size = len(info)
        ti.mode = 0o644
        tf.addfile(ti, io.BytesIO(info))
    return name
