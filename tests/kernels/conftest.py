"""Fixtures shared by the kernel tests."""

import pytest


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("smelt-cache")
