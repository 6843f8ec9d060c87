"""Local pages for the browser tests: each needs a real browser (script, clicks, typing, scrolling)."""

from __future__ import annotations

import json
from urllib.parse import parse_qs, urlsplit

from netguard import LocalServer, redirect, send


def _page(title: str, body: str) -> bytes:
    return f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{title}</title></head><body>{body}</body></html>".encode()


CLICK = _page("Product", """
<h1>Widget 3000</h1>
<button id=more onclick="document.getElementById('details').hidden = false">Show details</button>
<div id=details hidden><p>Battery life: 42 hours</p></div>
""")

# The article's button sits under a full-page banner until the banner is dismissed.
BANNER = _page("News", """
<style>#banner{position:fixed;inset:0;background:#fff;z-index:9}</style>
<div id=banner role=dialog aria-label="Cookie consent"><p>We use cookies.</p>
  <button onclick="document.getElementById('banner').remove()">Accept all</button></div>
<main><h1>Local news</h1>
  <button onclick="document.getElementById('story').textContent = 'The bridge reopens on Monday.'">Read story</button>
  <p id=story></p></main>
""")

SEARCH = _page("Search", """
<h1>Find a recipe</h1>
<form id=f><input type=search aria-label="Search recipes" id=q><button>Search</button></form>
<ul id=results></ul>
<script>
const recipes = ["Tomato soup", "Lentil curry", "Apple pie", "Tomato salad", "Pumpkin bread"];
document.getElementById('f').addEventListener('submit', e => {
  e.preventDefault();
  const q = document.getElementById('q').value.toLowerCase();
  document.getElementById('results').innerHTML =
    recipes.filter(r => r.toLowerCase().includes(q)).map(r => `<li>${r}</li>`).join('') || '<li>No recipe found</li>';
});
</script>
""")

TABS = _page("Home", """
<h1>Home</h1><a href="/second" target="_blank">Open the manual</a>
""")
SECOND = _page("Manual", "<h1>Manual</h1><p>Chapter 1: Unpacking the widget.</p>")

# Scrolling to the end fetches the next page of items from the server, like a feed.
SCROLL = _page("Feed", """
<style>li{height:40px}</style><h1>Feed</h1><ul id=feed></ul><p id=end>Loading…</p>
<script>
let page = 0, loading = false;
async function more() {
  if (loading) return; loading = true;
  const items = await (await fetch('/items?page=' + (++page))).json();
  for (const item of items) { const li = document.createElement('li'); li.textContent = item; feed.appendChild(li); }
  loading = false;
}
new IntersectionObserver(entries => { if (entries[0].isIntersecting) more(); }).observe(document.getElementById('end'));
</script>
""")


def items(handler) -> None:
    page = int(parse_qs(urlsplit(handler.path).query).get("page", ["1"])[0])
    start = (page - 1) * 40
    send(handler, 200, json.dumps([f"Post number {i}" for i in range(start + 1, start + 41)]).encode(), "application/json")


def sneaky(port: int) -> bytes:
    """A page that tries to make the browser reach other loopback addresses every way it can."""
    targets = [f"http://127.0.0.2:{port}/secret?img", f"http://2130706434:{port}/secret?decimal",
               f"http://[::1]:{port}/secret?v6", f"http://localhost:{port}/secret?name"]
    imgs = "".join(f'<img alt="" src="{t}">' for t in targets)
    return _page("Sneaky", f"""
<h1>Harmless page</h1>{imgs}
<img alt="" src="/hop">
<script>
fetch('http://0x7f000003:{port}/secret?fetch').catch(() => {{}});
try {{ new WebSocket('ws://127.0.0.3:{port}/secret?ws'); }} catch (e) {{}}
</script>""")


def set_cookie(handler) -> None:
    name = parse_qs(urlsplit(handler.path).query).get("who", ["anon"])[0]
    send(handler, 200, _page("Cookie", f"<h1>Hello {name}</h1>"), headers={"Set-Cookie": f"who={name}; Path=/"})


def show_cookie(handler) -> None:
    cookie = handler.headers.get("Cookie") or "none"
    send(handler, 200, _page("Cookie", f"<h1>Cookie: {cookie}</h1>"))


def big(handler) -> None:
    """A long page: navigation, a table of 300 rows with links, a footer (for view-size figures)."""
    rows = "".join(f"<tr><td><a href='/item/{i}'>Item {i}</a></td><td>Part {i * 7 % 101}</td>"
                   f"<td><button>Add {i}</button></td></tr>" for i in range(1, 301))
    nav = "".join(f"<li><a href='/section/{i}'>Section {i}</a></li>" for i in range(1, 31))
    body = (f"<header><nav><ul>{nav}</ul></nav></header><main><h1>Catalogue</h1><table><thead><tr><th>Name</th>"
            f"<th>Part</th><th>Cart</th></tr></thead><tbody>{rows}</tbody></table>"
            f"<form><label>Quantity <input name=q value=1></label><button>Checkout</button></form></main>"
            f"<footer><p>Contact: help@example.test</p></footer>")
    send(handler, 200, _page("Catalogue", body))


def server() -> LocalServer:
    srv = LocalServer({})
    srv.routes.update({
        "/click": lambda h: send(h, 200, CLICK), "/banner": lambda h: send(h, 200, BANNER),
        "/search": lambda h: send(h, 200, SEARCH), "/tabs": lambda h: send(h, 200, TABS),
        "/second": lambda h: send(h, 200, SECOND), "/scroll": lambda h: send(h, 200, SCROLL), "/items": items,
        "/sneaky": lambda h: send(h, 200, sneaky(srv.port)),
        "/hop": redirect(f"http://127.0.0.4:{srv.port}/secret?redirect"),
        "/hop-tls": redirect(f"https://127.0.0.5:{srv.port}/secret?redirect"),
        "/secret": lambda h: send(h, 200, b"secret", "text/plain"),
        "/set_cookie": set_cookie, "/show_cookie": show_cookie, "/big": big,
    })
    return srv
