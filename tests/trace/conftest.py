"""The traced models of these tests are cached in a folder of the session's own, never the
user's."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _private_trace_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "xdg-cache"))
