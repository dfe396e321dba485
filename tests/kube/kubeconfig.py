"""A kubeconfig for the tests' small HTTP servers that speak the API's protocol."""

from __future__ import annotations

import json
from pathlib import Path


def kubeconfig_for(tmp_path: Path, server: str) -> Path:
    """A kubeconfig naming `server`, with a token: what Api and WatchStreams read."""
    kubeconfig = tmp_path / "kubeconfig"
    cluster = {"name": "k", "cluster": {"server": server}}
    context = {"name": "c", "context": {"cluster": "k", "user": "u"}}
    kubeconfig.write_text(
        json.dumps({"current-context": "c", "contexts": [context], "clusters": [cluster], "users": [{"name": "u", "user": {"token": "t"}}]})
    )
    return kubeconfig
