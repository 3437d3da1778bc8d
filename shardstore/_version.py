"""The version of shardstore, in one place (pyproject.toml reads it from here)."""

__version__ = "0.1.0"
"""The installed shardstore's version (``shardstore --version`` prints it)."""
