"""Write the settings reference in docs/configuration.md from TinyContextConfig itself.

Each setting's name, type, default, bounds and environment variable come from the pydantic model;
its description is the field's ``description`` or, failing that, the comment above it in
tinycontext/config.py. ``python scripts/config_reference.py`` rewrites the part of the page between
the markers; tests/test_docs.py fails when the page and the model disagree.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
import typing
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "configuration.md"
BEGIN, END = "<!-- config-reference:begin -->", "<!-- config-reference:end -->"


def _comments(source: str) -> dict[str, str]:
    """Field name -> the comment lines right above its line in the class body."""
    comments = {t.start[0]: t.string.lstrip("#").strip() for t in tokenize.generate_tokens(io.StringIO(source).readline)
                if t.type == tokenize.COMMENT and t.line.strip().startswith("#")}
    out = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == "TinyContextConfig":
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    line, text = item.lineno - 1, []
                    while line in comments:
                        text.insert(0, comments[line])
                        line -= 1
                    out[item.target.id] = " ".join(text)
    return out


def _type(annotation) -> str:
    text = str(annotation) if typing.get_origin(annotation) else getattr(annotation, "__name__", str(annotation))
    return re.sub(r"\b(typing|pathlib|pydantic\.types)\.", "", text).replace("NoneType", "None")


def _default(field) -> str:
    if field.default_factory is not None:
        return f"`{field.default_factory.__name__}()`"
    return f"`{field.default!r}`".replace("|", "\\|")


def _bounds(field) -> str:
    parts = []
    for meta in field.metadata:
        for name, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            value = getattr(meta, name, None)
            if value is not None:
                parts.append(f"{sign} {value}")
    return ", ".join(parts)


def reference() -> str:
    from tinycontext.config import ENV_PREFIX, TinyContextConfig

    comments = _comments((REPO / "tinycontext" / "config.py").read_text(encoding="utf-8"))
    rows = ["| setting | type | default | bounds | what it does |", "|---|---|---|---|---|"]
    for name, field in TinyContextConfig.model_fields.items():
        about = (field.description or comments.get(name, "")).replace("|", "\\|")
        kind = _type(field.annotation).replace("|", "\\|")
        rows.append(f"| `{name}`<br>`{ENV_PREFIX}{name.upper()}` | `{kind}` | {_default(field)} | {_bounds(field)} | {about} |")
    return "\n".join([BEGIN, *rows, END])


def render(page: str) -> str:
    start, end = page.index(BEGIN), page.index(END) + len(END)
    return page[:start] + reference() + page[end:]


if __name__ == "__main__":
    PAGE.write_text(render(PAGE.read_text(encoding="utf-8")), encoding="utf-8")
    sys.exit(0)
