"""A local Azure Blob Storage API for tests: azurite behind a counting proxy.

azurite (npm) honours Azure's conditions (``If-Match``, ``If-None-Match``,
on uploads, downloads and deletes: checked by the tests), so nothing is
added in front of it but counting. It is installed with npm, once, into a
directory of its own (``SHARDSTORE_AZURITE_DIR``, default
``~/.cache/shardstore/azurite-<version>``); without Node.js and npm this
fails with a message saying so. It runs in memory, listens on 127.0.0.1
only, sends no telemetry, and is stopped by its PID.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardstore.testing.proxy import Traffic, free_port, proxied, server_process

__all__ = ["AZURITE_VERSION", "LocalAzure", "azurite_main", "local_azure"]

AZURITE_VERSION = "3.35.0"
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
"""azurite's well-known development account and key (public, in Azure's documentation)."""


@dataclass
class LocalAzure(Traffic):
    """An azurite Blob server on 127.0.0.1 with a container, and its request counts."""

    endpoint_url: str = ""
    container: str = "shardstore"

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
            f"BlobEndpoint={self.endpoint_url}/{ACCOUNT};"
        )

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"connection_string": self.connection_string}

    @property
    def obstore_options(self) -> dict[str, Any]:
        """The same account for ``ObstoreInner.from_url`` (obstore's Azure config names)."""
        return {
            "account_name": ACCOUNT,
            "account_key": KEY,
            "endpoint": f"{self.endpoint_url}/{ACCOUNT}",
            "client_options": {"allow_http": True},
        }

    def url(self, path: str) -> str:
        return f"az://{self.container}/{path}"


def azurite_main() -> Path:
    """azurite's Blob server script, installed with npm first if need be."""
    home = Path(
        os.environ.get("SHARDSTORE_AZURITE_DIR")
        or Path.home() / ".cache" / "shardstore" / f"azurite-{AZURITE_VERSION}"
    )
    main = home / "node_modules" / "azurite" / "dist" / "src" / "blob" / "main.js"
    if main.exists():
        return main
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise RuntimeError(
            "the Azure tests run azurite, an npm package: install Node.js and npm "
            f"(found node: {node or 'no'}, npm: {npm or 'no'})"
        )
    home.mkdir(parents=True, exist_ok=True)
    (home / "package.json").write_text("{}\n")
    done = subprocess.run(
        [npm, "install", "--prefix", str(home), "--no-audit", "--no-fund", f"azurite@{AZURITE_VERSION}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0 or not main.exists():
        raise RuntimeError(
            f"npm could not install azurite@{AZURITE_VERSION} into {home}: {done.stderr[-2000:]}"
        )
    return main


@contextmanager
def local_azure(container: str = "shardstore", latency_s: float = 0.0) -> Iterator[LocalAzure]:
    """Start azurite's Blob server (in memory) and a counting proxy on 127.0.0.1, with
    ``container`` made; stop both on exit."""
    main = azurite_main()
    node = shutil.which("node")
    assert node is not None  # azurite_main checked
    port = free_port()
    command = [
        node,
        str(main),
        "--blobHost=127.0.0.1",
        f"--blobPort={port}",
        "--inMemoryPersistence",
        "--silent",
        "--skipApiVersionCheck",
        "--loose",
        "--disableTelemetry",
    ]
    with server_process(command, port, "azurite", timeout_s=60):
        azure = LocalAzure(container=container)
        with proxied(port, azure) as url:
            azure.endpoint_url = url
            _make_container(azure)
            azure.reset()
            azure.latency_s = latency_s
            yield azure


def _make_container(azure: LocalAzure) -> None:
    from azure.storage.blob import BlobServiceClient

    with BlobServiceClient.from_connection_string(azure.connection_string) as service:
        service.create_container(azure.container)
