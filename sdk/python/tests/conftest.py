"""Fixtures of the SDK unit tests: the package from the checkout and a fake daemon."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # sdk/python, so `import tidepool` uses the checkout
sys.path.insert(0, HERE)

from fake_server import FakeDaemon  # noqa: E402

import tidepool  # noqa: E402


@pytest.fixture
def fake():
    with FakeDaemon() as f:
        yield f


@pytest.fixture
def client(fake):
    c = tidepool.Client(fake.url, timeout=10)
    yield c
    c.close()
