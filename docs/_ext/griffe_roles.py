"""A griffe extension for the API reference: Sphinx roles in docstrings as Markdown code.

The docstrings are written for readers of the source, and some use Sphinx roles
(``:class:`~shardstore.ShardingStore```). mkdocstrings renders docstrings as
Markdown, where a role would show as ``:class:`` followed by code; this turns
``:role:`~a.b.C``` into ```C``` and ``:role:`a.b.C``` into ```a.b.C```. The
docstrings themselves are not changed.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|obj|exc|data|const):`(~?)([^`]+)`")


def _code(match: re.Match[str]) -> str:
    target = match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if match.group(1) else target}`"


class SphinxRolesAsCode(griffe.Extension):
    """Rewrite Sphinx cross-reference roles in every docstring as inline code."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_code, obj.docstring.value)
