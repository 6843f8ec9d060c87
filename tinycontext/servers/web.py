"""What both servers need to hand the web tools' answers on: the text/structured split, and the memory
engine's embedder lent to scrape_urls."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..config import TinyContextConfig
from ..errors import TinyContextError


def split_answer(answer: dict) -> tuple[str, dict]:
    """A web answer's text (for the model) and the rest (the structured content / REST body), as budgeted."""
    structured = dict(answer)
    return structured.pop("text"), structured


async def engine_embedder(engine: Callable[[], Any] | None, config: TinyContextConfig):
    """The memory engine's embedder, when ``engine()`` opens and embeds as ``config`` does (one copy of
    the model per server); None otherwise, and scrape loads its own."""
    from ..web.scrape import shared_embedder

    if engine is None:
        return None
    try:
        opened = await asyncio.to_thread(engine)
    except TinyContextError:
        return None  # the memory side is broken; scrape still works with a model of its own
    return shared_embedder(opened, config)
