"""The package as released: one version everywhere, typed, licensed."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import shardstore

ROOT = Path(__file__).resolve().parent.parent


def test_version_is_in_one_place_and_public() -> None:
    assert "__version__" in shardstore.__all__
    assert shardstore.__version__ == version("shardstore")  # what pip installed, read from _version.py
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "shardstore._version.__version__"}


def test_version_command_prints_the_version() -> None:
    expected = (0, f"shardstore {shardstore.__version__}\n", "")
    script = Path(sys.executable).with_name("shardstore")  # the console script beside this Python
    commands = [[sys.executable, "-m", "shardstore"]]
    if script.exists() or (script := Path(shutil.which("shardstore") or "")).is_file():
        commands.append([str(script)])
    for command in commands:
        done = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=120)
        assert (done.returncode, done.stdout, done.stderr) == expected, command


def test_typed_and_licensed() -> None:
    assert (Path(shardstore.__file__).parent / "py.typed").is_file()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["shardstore"]
    assert project["project"]["license"] == "MIT"
    license_text = (ROOT / "LICENSE").read_text()
    assert license_text.startswith("MIT License") and "the shardstore developers" in license_text
    assert "## [Unreleased]" in (ROOT / "CHANGELOG.md").read_text()
