"""A page's accessibility tree (CDP ``Accessibility.getFullAXTree``) as a compact text view with refs.

One line per node: ``- role "name" = "value" [states] ref=eN``, indented by depth. Wrapper nodes
without a name (``generic``, ``none``) are dropped and their children lifted, a node whose only
content is text is written on one line (``- listitem: text``), and text that repeats its parent's
name is left out. Only nodes an agent can act on (links, buttons, fields, focusable elements)
carry a ref; a ref names the DOM node (its ``backendDOMNodeId``), so it stays the same from one
view to the next for as long as the node exists.

``find`` keeps the matching nodes with their ancestors (where they are) and descendants (what they
hold); ``depth`` keeps the top levels and says how many nodes each cut branch hides; the result
always is a well-formed tree. :func:`fit_lines` cuts a view to a token budget.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

# Roles an agent clicks or types into; any focusable node also gets a ref.
ACTIONABLE = frozenset({
    "button", "link", "textbox", "searchbox", "combobox", "checkbox", "radio", "switch", "tab", "menuitem",
    "menuitemcheckbox", "menuitemradio", "option", "slider", "spinbutton", "treeitem", "listbox", "gridcell",
    "DisclosureTriangle", "ListBoxOption", "MenuListOption", "PopUpButton", "ToggleButton", "textField", "SearchField",
})
EDITABLE = frozenset({"textbox", "searchbox", "combobox", "spinbutton", "textField", "SearchField"})
# Nodes that only group others: dropped unless named or actionable.
TRANSPARENT = frozenset({"generic", "none", "presentation", "GenericContainer", "LayoutTable", "LayoutTableRow",
                         "LayoutTableCell", "Section", "Div", "Pre", "IframePresentational", "group", "Canvas",
                         "strong", "emphasis", "mark", "time", "subscript", "superscript", "abbr"})
# Containers that add nothing around a single element child of the same name.
LIFTED = frozenset({"listitem", "cell", "gridcell", "paragraph", "LabelText", "label"})
SKIPPED = frozenset({"InlineTextBox", "LineBreak", "ListMarker"})
TEXT = frozenset({"StaticText", "text"})
# AX properties worth a word: shown as ``name`` when true or ``name=value`` otherwise.
STATES = ("checked", "pressed", "selected", "expanded", "disabled", "required", "invalid", "readonly", "focused",
          "modal", "level")
MAX_NAME_CHARS = 200


@dataclass
class Node:
    role: str
    name: str = ""
    value: str = ""
    states: list[str] = field(default_factory=list)
    backend_id: int | None = None
    actionable: bool = False
    children: list["Node"] = field(default_factory=list)
    ref: str | None = None

    @property
    def is_text(self) -> bool:
        return self.role == "text"

    def label(self) -> str:
        """The node's line without indentation, marker or ref: what ``find`` matches."""
        if self.is_text:
            return self.name
        out = self.role
        if self.name:
            out += f' "{_quote(self.name)}"'
        if self.value:
            out += f' = "{_quote(self.value)}"'
        if self.states:
            out += f" [{', '.join(self.states)}]"
        return out


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _clip(text: str) -> str:
    text = _one_line(text)
    return text if len(text) <= MAX_NAME_CHARS else text[: MAX_NAME_CHARS - 1] + "…"


def _quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _value(ax: dict, key: str) -> str:
    item = ax.get(key) or {}
    value = item.get("value")
    return "" if value is None else _clip(str(value))


def _states(ax: dict) -> tuple[list[str], bool, bool]:
    """Rendered states, whether the node is focusable, whether it is editable."""
    props = {p["name"]: (p.get("value") or {}).get("value") for p in ax.get("properties", [])}
    if _value(ax, "role") != "heading":
        props.pop("level", None)  # list and tree nesting shows in the indentation already
    states = []
    for name in STATES:
        value = props.get(name)
        if value is None or value is False or value in ("false", ""):
            continue
        states.append(name if value is True or value == "true" else f"{name}={value}")
    return states, bool(props.get("focusable")), props.get("editable") not in (None, "", False)


def build_tree(ax_nodes: list[dict]) -> Node:
    """The compact tree of a ``getFullAXTree`` answer (root: the document)."""
    by_id = {n["nodeId"]: n for n in ax_nodes}
    root = ax_nodes[0] if ax_nodes else {"nodeId": "", "role": {"value": "RootWebArea"}}
    return _build(root, by_id, set())[0] if ax_nodes else Node("document")


def _build(ax: dict, by_id: dict, seen: set) -> list[Node]:
    """The nodes ``ax`` becomes: itself, or its children when it is transparent or ignored."""
    if ax["nodeId"] in seen:  # a malformed tree must not loop
        return []
    seen.add(ax["nodeId"])
    role = _value(ax, "role")
    if role in SKIPPED:
        return []
    children = [c for child in ax.get("childIds", []) if child in by_id for c in _build(by_id[child], by_id, seen)]
    if role in TEXT:
        name = _value(ax, "name")
        return [Node("text", name)] if name else []
    if ax.get("ignored"):
        return children
    name = _value(ax, "name")
    states, focusable, editable = _states(ax)
    # An editable field's inner wrapper is editable too, but only the field is worth a ref.
    actionable = role in ACTIONABLE or (focusable and role not in ("RootWebArea", "WebArea")) or (
        editable and role not in TRANSPARENT)
    if role in TRANSPARENT and not name and not actionable:
        return children
    if role in ("RootWebArea", "WebArea"):
        # The title goes in the view's header; "focused" on the document tells nothing.
        return [Node("document", name, children=children)]
    node = Node(role, name, _value(ax, "value"), states, ax.get("backendDOMNodeId"), actionable)
    # Text that only repeats the name (a button's label, a field's own value) is said once.
    node.children = [c for c in children if not (c.is_text and c.name in (node.name, node.value))]
    _merge_text(node)
    if role in LIFTED and not actionable and len(node.children) == 1 and not node.children[0].is_text \
            and node.name in ("", node.children[0].name):
        return node.children  # a list item or cell holding just a link: the link says it all
    return [node]


def _merge_text(node: Node) -> None:
    """Adjacent text children become one (inline markup splits a sentence into pieces)."""
    merged: list[Node] = []
    for child in node.children:
        if child.is_text and merged and merged[-1].is_text:
            merged[-1] = Node("text", _clip(merged[-1].name + " " + child.name))
        else:
            merged.append(child)
    node.children = merged


def assign_refs(root: Node, ref_for: Callable[[int], str]) -> None:
    """Give every actionable node with a DOM node its ref (``ref_for`` keeps them stable)."""
    for node in walk(root):
        if node.actionable and node.backend_id is not None:
            node.ref = ref_for(node.backend_id)


def walk(node: Node) -> Iterable[Node]:
    yield node
    for child in node.children:
        yield from walk(child)


def compile_find(find: str) -> Callable[[str], bool]:
    """A regex (case-insensitive); text that is not a valid regex is a literal substring."""
    try:
        pattern = re.compile(find, re.IGNORECASE)
    except re.error:
        needle = find.casefold()
        return lambda text: needle in text.casefold()
    return lambda text: pattern.search(text) is not None


def _marks(node: Node, match: Callable[[str], bool]) -> tuple[set[int], int]:
    """Ids of the nodes to keep for ``find`` (matches, their ancestors and descendants), and the match count."""
    keep: set[int] = set()
    count = 0

    def visit(n: Node, path: list[Node]) -> None:
        nonlocal count
        if match(n.label()) or (n.ref and match(f"ref={n.ref}")):
            count += 1
            keep.update(id(a) for a in path)
            keep.update(id(d) for d in walk(n))
            return  # its whole subtree is kept already
        for child in n.children:
            visit(child, [*path, n])

    visit(node, [])
    return keep, count


@dataclass
class View:
    lines: list[str]
    refs: list[str]  # refs on the lines, in order
    matches: int | None = None  # nodes matching find (None without find)


def render(root: Node, *, find: str | None = None, depth: int | None = None) -> View:
    """The lines of the view below the document node (depth 1 = its children)."""
    keep, matches = _marks(root, compile_find(find)) if find else (None, None)
    lines: list[str] = []
    refs: list[str] = []

    def hidden(n: Node) -> int:
        return sum(1 for d in walk(n) if d is not n and (keep is None or id(d) in keep))

    def emit(n: Node, level: int) -> None:
        kids = [c for c in n.children if keep is None or id(c) in keep]
        pad = "  " * (level - 1)
        ref = f" ref={n.ref}" if n.ref else ""
        if n.is_text:
            lines.append(f"{pad}- text: {n.name}")
            return
        if len(kids) == 1 and kids[0].is_text and not n.name and not kids[0].children:
            lines.append(f"{pad}- {n.label()}{ref}: {kids[0].name}")  # a node that only holds text: one line
        elif depth is not None and level >= depth and kids:
            lines.append(f"{pad}- {n.label()}{ref} (+{hidden(n)} inside)")
        else:
            lines.append(f"{pad}- {n.label()}{ref}")
            for child in kids:
                emit(child, level + 1)
        if n.ref:
            refs.append(n.ref)

    for child in root.children:
        if keep is None or id(child) in keep:
            emit(child, 1)
    return View(lines, refs, matches)


REF_RE = re.compile(r" ref=(e\d+)\b")


def fit_lines(lines: list[str], counts: list[int], max_tokens: int) -> tuple[list[str], int]:
    """The leading lines whose tokens (one per newline included) fit ``max_tokens``; and how many were cut."""
    used = 0
    for i, cost in enumerate(counts):
        used += cost + 1
        if used > max_tokens:
            return lines[:i], len(lines) - i
    return lines, 0
