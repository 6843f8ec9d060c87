"""The browser tools as MCP tools (:func:`register`) and REST endpoints (:func:`router`).

Each MCP client connection (one MCP session) gets its own browser session; REST callers name
theirs with ``session_id``. Both hand back the same view text; MCP's structured content carries
only the facts around it (tab, url, tokens...) so the agent does not pay for the view twice.
"""

from __future__ import annotations

import uuid
import weakref
from typing import Annotated, Any, Literal

from mcp.server.fastmcp import Context, FastMCP
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field

from ..config import TinyContextConfig, load_config
from .tool_results import error_result
from ..errors import InvalidInputError, TinyContextError
from ..budget.render import MIN_AGENT_TOKENS
from ..web.browser.service import ACTIONS, get_service

NAVIGATE_HELP = (
    "Open a URL in a real browser (JavaScript runs) and read the page as a compact accessibility tree: one line per "
    "element (role \"name\" = value [states]); elements you can act on end with ref=eN. Use it for pages a plain fetch "
    "cannot read: content rendered by scripts, behind a cookie banner, a 'load more' button or a search box. Then "
    "call browser_act with those refs. find (regex or text) keeps only matching elements and their context; depth "
    "keeps the top levels (cut branches say how much they hide); max_tokens caps the view."
)
ACT_HELP = (
    "Act in the browser page opened by browser_navigate and read the page after the action. Actions: look (just read; "
    "use find/depth to search a long page), click (ref), type (ref of a text field, text replaces its content), press "
    "(a key in text, e.g. Enter, Escape, Tab, End or PageDown to scroll and load more; ref focuses an element first), "
    "wait_for (text to appear, or the network to go quiet), tabs (list tabs), switch_tab (tab number in text), close "
    "(the current tab, or tab number in text; closing the last one ends the session). Only refs from a view you "
    "received are accepted."
)

Url = Annotated[str, Field(description="http(s) URL to open.")]
Find = Annotated[str | None, Field(description="Show only elements matching this regex (or text, case-insensitive) with their context.")]
Depth = Annotated[int | None, Field(description="Show only this many levels of the tree (1 = top level).", ge=1)]
MaxTokens = Annotated[int | None, Field(description="Token budget of the view (default browser_max_tokens).", ge=MIN_AGENT_TOKENS, le=1_000_000)]
ActionName = Literal[ACTIONS]  # type: ignore[valid-type]  # the service's tuple, one source of truth
Action = Annotated[ActionName, Field(description="What to do.")]
RefArg = Annotated[str | None, Field(description="ref=eN of the element, from the latest view (click, type, press).")]
Text = Annotated[str | None, Field(description="Text to type, key to press, text to wait for, or tab number.")]


def _mcp_result(result: dict) -> CallToolResult:
    facts = {k: v for k, v in result.items() if k != "view"}
    return CallToolResult(content=[TextContent(type="text", text=result["view"])], structuredContent=facts)


def register(server: FastMCP, config: TinyContextConfig) -> None:
    """Add browser_navigate and browser_act to ``server`` unless ``browser_backend`` is off."""
    if config.browser_backend == "off":
        return

    keys: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()

    def client(ctx: Context) -> str:
        # One browser session per MCP session; it closes when the client's session object goes away.
        session = ctx.session
        key = keys.get(session)
        if key is None:
            key = keys[session] = f"mcp-{uuid.uuid4().hex}"
            weakref.finalize(session, get_service(config).close_later, key)
        return key

    async def answer(ctx: Context, method: str, **kwargs) -> CallToolResult:
        try:
            return _mcp_result(await get_service(config).acall(method, client(ctx), **kwargs))
        except TinyContextError as err:
            return error_result(err)

    @server.tool(description=NAVIGATE_HELP, annotations=ToolAnnotations(
        title="Open a page in a browser", readOnlyHint=False, destructiveHint=False, openWorldHint=True))
    async def browser_navigate(ctx: Context, url: Url, find: Find = None, depth: Depth = None,
                               max_tokens: MaxTokens = None) -> CallToolResult:
        return await answer(ctx, "navigate", url=url, find=find, depth=depth, max_tokens=max_tokens)

    @server.tool(description=ACT_HELP, annotations=ToolAnnotations(
        title="Act in the browser page", readOnlyHint=False, destructiveHint=False, openWorldHint=True))
    async def browser_act(ctx: Context, action: Action, ref: RefArg = None, text: Text = None, find: Find = None,
                          depth: Depth = None, max_tokens: MaxTokens = None) -> CallToolResult:
        return await answer(ctx, "act", action=action, ref=ref, text=text, find=find, depth=depth, max_tokens=max_tokens)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    session_id: str = Field("default", min_length=1, max_length=200,
                            description="Your browser session (cookies, tabs); callers sharing a name share it.")
    find: str | None = Field(None, description="Keep only elements matching this regex (or text) with their context.")
    depth: int | None = Field(None, ge=1, description="Levels of the tree to show.")
    max_tokens: int | None = Field(None, ge=MIN_AGENT_TOKENS, le=1_000_000, description="Token budget of the view.")


class NavigateRequest(_Body):
    url: str = Field(description="http(s) URL to open.")


class ActRequest(_Body):
    action: ActionName
    ref: str | None = Field(None, description="ref=eN from the latest view.")
    text: str | None = Field(None, description="Text to type, key to press, text to wait for, or tab number.")


class BrowserView(BaseModel):
    view: str = Field(description="The page as the agent reads it: header, notes, one line per element.")
    tab: int | None
    tabs: int
    url: str | None = None
    title: str | None = None
    tokens: int = Field(description="Tokens of view.")
    structured_tokens: int = Field(description="Tokens of the other fields as compact JSON (MCP structured content).")
    truncated: bool
    refs: list[str] = Field(description="Refs shown in the view (the ones click and type accept).")
    matches: int | None = None
    closed: bool | None = None


def router(config: TinyContextConfig | None = None):
    """``POST /browser/navigate`` and ``/browser/act``; no routes when ``browser_backend`` is off."""
    from fastapi import APIRouter  # the http extra; MCP alone does not need it

    api = APIRouter(prefix="/browser", tags=["browser"])
    if config is not None and config.browser_backend == "off":
        return api

    def service():
        cfg = config or load_config()
        if cfg.browser_backend == "off":
            raise InvalidInputError("The browser tools are off (browser_backend=off).")
        return get_service(cfg)

    @api.post("/navigate", response_model=BrowserView, response_model_exclude_none=True, summary="Open a URL and read the page")
    def navigate(body: NavigateRequest) -> dict:
        return service().call("navigate", "rest:" + body.session_id, url=body.url, find=body.find, depth=body.depth,
                              max_tokens=body.max_tokens)

    @api.post("/act", response_model=BrowserView, response_model_exclude_none=True, summary="Act on the page by ref and read it again")
    def act(body: ActRequest) -> dict:
        return service().call("act", "rest:" + body.session_id, action=body.action, ref=body.ref, text=body.text,
                              find=body.find, depth=body.depth, max_tokens=body.max_tokens)

    return api
