"""The ``tinycontext`` command: the stdio MCP server (default), doctor, and memory commands for humans.

Each subcommand is a function registered with ``@command(name, help, configure)`` (:mod:`.common`,
with the helpers the commands share), where ``configure`` adds its arguments; adding one is a single
decorated function. TinyContext errors
print ``code: message`` on stderr and exit 1; usage errors exit 2 (argparse).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import suppress
from io import TextIOWrapper
from pathlib import Path

from ..version import __version__
from ..config import TRANSPORTS
from ..errors import InvalidInputError, ModelUnavailableError, StorageError, TinyContextError
from ..budget.render import DETAILS, memory_block, one_line, plural, to_json
from .common import (COMMANDS, add_filter_args, add_json, command, config_of, emit, filters_of, id_ranges, open_engine, parse_metadata,
                     read_memories, summarised, with_defaults)


# -- commands -------------------------------------------------------------------------------


def _serve_stdio(server) -> None:
    import anyio
    from mcp.server.stdio import stdio_server

    # The protocol gets a private copy of stdout and fd 1 is pointed at stderr, so nothing else
    # (a stray print, a native library) can write into the JSON-RPC stream.
    sys.stdout.flush()
    protocol = TextIOWrapper(os.fdopen(os.dup(sys.stdout.fileno()), "wb"), encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    async def run() -> None:
        # FastMCP.run_stdio_async always writes to sys.stdout; its low-level server takes any streams.
        lowlevel = server._mcp_server
        async with stdio_server(stdout=anyio.wrap_file(protocol)) as (read, write):
            await lowlevel.run(read, write, lowlevel.create_initialization_options())

    anyio.run(run)


@command("mcp", "run the MCP server on stdio (the default when no command is given)")
def mcp(args):
    from ..memory.engine import close_engines
    from ..servers import otel
    from ..servers.mcp_server import build_server

    otel.configure()
    server = build_server(config_of(args))
    if sys.stdin.isatty():
        print("TinyContext MCP server on stdio; an MCP client should start it. Ctrl-C to stop; see tinycontext --help.", file=sys.stderr)
    try:
        _serve_stdio(server)
    finally:
        close_engines()


def _doctor_args(parser):
    add_json(parser)


@command("doctor", "check that everything TinyContext needs works (exit 0 when ready)", _doctor_args)
def doctor(args):
    from .doctor import render, run_checks

    report = run_checks(args.config)
    emit(args, report, render(report))
    return 0 if report["ok"] else 1


def _save_args(parser):
    parser.add_argument("content", nargs="+", help="memory text (several make several memories); '-' reads JSON/JSONL memories from stdin")
    parser.add_argument("--tag", action="append", default=[], help="tag (repeatable)")
    parser.add_argument("--session", help="session to save into (default: 'default')")
    parser.add_argument("--metadata", help="JSON object stored with each memory")
    parser.add_argument("--speaker", help="who said it (conversation turns)")
    parser.add_argument("--occurred-at", help="when it happened, ISO 8601 (2023-05-08 or 2023-05-08T13:56)")
    parser.add_argument("--attachment", action="append", default=[], help="text description of something shared, e.g. an image caption (repeatable)")
    parser.add_argument("--episode", help="episode key (thread); by default one call's turns form one episode")
    parser.add_argument("--supersedes", type=int, metavar="ID", help="the memory this one replaces (one memory): it gets valid_until, "
                        "recall prefers the new one")
    parser.add_argument("--valid-from", help="since when the fact holds, ISO 8601 (default: now)")
    add_json(parser)


@command("save", "save memories", _save_args)
def save(args):
    metadata = parse_metadata(args.metadata)
    if args.content == ["-"]:
        memories = [with_defaults(m, args.tag, metadata) for m in read_memories(sys.stdin.read())]
    else:
        memories = [{"content": text, "tags": args.tag, "metadata": metadata or {}} for text in args.content]
    if args.supersedes is not None and len(memories) != 1:
        raise InvalidInputError("--supersedes replaces one memory: save one memory with it (or give each its own supersedes on stdin).")
    turn = {k: v for k, v in (("speaker", args.speaker), ("occurred_at", args.occurred_at), ("attachments", args.attachment),
                              ("supersedes", args.supersedes), ("valid_from", args.valid_from)) if v}
    memories = [{**turn, **m} if isinstance(m, dict) else m for m in memories]  # a memory's own values win
    with open_engine(args) as engine:
        result = engine.save(memories, session_id=args.session, episode=args.episode)
    ids = result["ids"]
    lines = [f"Saved {plural(len(ids), 'memory', 'memories')} in session {result['session_id']}"
             + (f": {'id' if len(ids) == 1 else 'ids'} {id_ranges(ids)} ({plural(result['total_tokens'], 'token')})" if ids else "")]
    lines += summarised([f"  skipped #{s['index'] + 1}: {s['reason'].replace('_', ' ')} of id {s.get('duplicate_of', s.get('similar_to'))}"
                         for s in result["skipped"]], "skipped")
    lines += summarised([f"  note: #{n['index'] + 1} is similar to id {n['similar_to']} (cosine {n['similarity']})"
                         for n in result["near_duplicates"]], "near-duplicate notes")
    lines += [f"  superseded id {s['supersedes']}" for s in result["saved"] + result["skipped"] if s.get("supersedes")]
    lines += summarised([f"  note: #{c['index'] + 1} may supersede id {c['supersedes']} ({', '.join(c['was'])} -> {', '.join(c['now'])}); "
                         f"if so: tinycontext save --supersedes {c['supersedes']} ..." for c in result.get("supersession_candidates", [])],
                        "supersession candidates")
    emit(args, result, "\n".join(lines))


def _recall_args(parser):
    parser.add_argument("query", help="what to remember")
    parser.add_argument("--session", help="search only this session (default: all)")
    parser.add_argument("--max-tokens", type=int, help="token budget for the results")
    parser.add_argument("--top-k", type=int, help="at most this many memories")
    parser.add_argument("--tag", action="append", default=[], help="keep memories with any of these tags (repeatable)")
    parser.add_argument("--offset", type=int, default=0, help="skip this many ranked results (paging)")
    add_filter_args(parser)
    parser.add_argument("--detail", choices=DETAILS, default="compact", help="compact (default) or full: also session, metadata, scores")
    parser.add_argument("--include-superseded", action="store_true", help="also show facts a newer memory superseded (marked)")
    parser.add_argument("--json", action="store_true", help="print the structured answer (compact JSON, within --max-tokens)")


@command("recall", "find the memories most relevant to a query; the whole output fits --max-tokens", _recall_args)
def recall(args):
    with open_engine(args) as engine:
        page = engine.recall_rendered(args.query, session_id=args.session, max_tokens=args.max_tokens, top_k=args.top_k,
                                      tags=args.tag, offset=args.offset, detail=args.detail, filters=filters_of(args),
                                      include_superseded=args.include_superseded)
    # The output is exactly what the budget counted: the text, or the structured content as compact JSON.
    print(to_json(page.structured) if args.json else page.text)


def _search_args(parser):
    parser.add_argument("query", nargs="+", help="what to search for (several quoted queries run together, up to 5)")
    parser.add_argument("--domain", action="append", default=[], help="only results from this domain and its subdomains (repeatable)")
    parser.add_argument("--max-tokens", type=int, help="token budget for the whole answer")
    parser.add_argument("--json", action="store_true", help="print the structured answer (compact JSON, within --max-tokens)")


@command("search", "search the web (backend: search_backend); results and an outcome per query", _search_args)
def search(args):
    from ..web import search as web_search

    answer = web_search([{"query": q, "domains": args.domain} for q in args.query], args.max_tokens, config=config_of(args))
    text = answer.pop("text")
    print(to_json(answer) if args.json else text)


def _scrape_args(parser):
    parser.add_argument("url", nargs="+", help="page URL(s), up to 5, sharing one budget")
    parser.add_argument("--query", help="keep only the passages that answer this (default: the page in order)")
    parser.add_argument("--max-tokens", type=int, help="token budget shared by all pages")
    parser.add_argument("--order", choices=("page", "rank"), default="page", help="passages in page order or best first")
    parser.add_argument("--backend", choices=("http", "browser", "auto"),
                        help="fetch over HTTP, in the browser, or auto: the browser for script-built pages (default: scrape_backend)")
    parser.add_argument("--json", action="store_true", help="print the structured answer (compact JSON, within --max-tokens)")


@command("scrape", "read web pages: the passages that answer --query, within --max-tokens", _scrape_args)
def scrape(args):
    from ..web import scrape_urls

    answer = scrape_urls([{"url": u, "query": args.query} for u in args.url], args.max_tokens, order=args.order,
                         config=config_of(args), backend=args.backend)
    text = answer.pop("text")
    print(to_json(answer) if args.json else text)


def _id_args(parser):
    parser.add_argument("id", type=int, help="memory id")
    add_json(parser)


@command("get", "show one memory with its edit history", _id_args)
def get(args):
    with open_engine(args) as engine:
        memory = engine.get(args.id)
    emit(args, memory, memory_block(memory))


def _update_args(parser):
    parser.add_argument("id", type=int, help="memory id")
    parser.add_argument("content", nargs="?", help="new text")
    parser.add_argument("--tag", action="append", help="new tags, replacing the old ones (repeatable)")
    parser.add_argument("--clear-tags", action="store_true", help="remove all tags")
    parser.add_argument("--metadata", help="new metadata JSON object (replaces the old one)")
    parser.add_argument("--expected-version", type=int, help="only update if the memory is still at this version (else: conflict)")
    add_json(parser)


@command("update", "change a memory's text, tags or metadata (the old version is kept in its history)", _update_args)
def update(args):
    tags = [] if args.clear_tags else args.tag
    metadata = parse_metadata(args.metadata)
    if args.content is None and tags is None and metadata is None:
        raise InvalidInputError("Nothing to update: give new text, --tag, --clear-tags or --metadata.")
    with open_engine(args) as engine:
        memory = engine.update(args.id, args.content, tags=tags, metadata=metadata, expected_version=args.expected_version)
    emit(args, memory, memory_block(memory))


@command("delete", "delete a memory and its history", _id_args)
def delete(args):
    with open_engine(args) as engine:
        result = engine.delete(args.id)
    emit(args, result, f"Deleted memory {result['id']}.")


def _list_args(parser):
    parser.add_argument("--session", help="only this session (default: all)")
    parser.add_argument("--tag", action="append", default=None, help="only memories with any of these tags (repeatable)")
    add_filter_args(parser)
    parser.add_argument("--order", choices=("newest", "oldest", "id"), default="newest", help="newest (default), oldest or id")
    parser.add_argument("--offset", type=int, default=0, help="skip this many (paging)")
    parser.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    parser.add_argument("--max-tokens", type=int, help="token budget for the output")
    parser.add_argument("--detail", choices=DETAILS, default="compact", help="compact (default) or full")
    parser.add_argument("--json", action="store_true", help="print the structured answer (compact JSON)")


@command("list", "browse memories without a query (newest first), within a token budget", _list_args)
def list_(args):
    with open_engine(args) as engine:
        page = engine.list_memories(session_id=args.session, tags=args.tag, filters=filters_of(args), order=args.order,
                                    offset=args.offset, limit=args.limit, max_tokens=args.max_tokens, detail=args.detail)
    print(to_json(page.structured) if args.json else page.text)


def _forget_args(parser):
    parser.add_argument("--session", help="delete this session's memories")
    parser.add_argument("--tag", action="append", default=None, help="delete memories with any of these tags (repeatable)")
    add_filter_args(parser)
    parser.add_argument("--confirm", type=int, metavar="COUNT", help="delete for real; COUNT is what the dry run reported")
    add_json(parser)


@command("forget", "delete memories by session, tag or filter: a dry run first, then --confirm COUNT", _forget_args)
def forget(args):
    with open_engine(args) as engine:
        result = engine.delete_memories(session_id=args.session, tags=args.tag, filters=filters_of(args),
                                        dry_run=args.confirm is None, confirm=args.confirm)
    matched = plural(result["matched"], "memory", "memories") + (" matches" if result["matched"] == 1 else " match")
    text = (f"{matched}; nothing deleted. Run again with --confirm {result['matched']} to delete {'it' if result['matched'] == 1 else 'them'}."
            if result["dry_run"] else f"Deleted {plural(result['deleted'], 'memory', 'memories')}.")
    emit(args, result, text)


@command("sessions", "list sessions", add_json)
def sessions(args):
    with open_engine(args) as engine:
        rows = engine.sessions()
    text = "\n".join(f"{s['session_id']}\t{plural(s['memories'], 'memory', 'memories')}\t{plural(s['tokens'], 'token')}\tsince {s['created_at'][:10]}"
                     for s in rows)
    emit(args, rows, text or "No sessions yet.")


@command("stats", "show database statistics", add_json)
def stats(args):
    with open_engine(args) as engine:
        result = engine.stats()
    text = "\n".join(f"{key}: {json.dumps(value) if isinstance(value, dict) else value}" for key, value in result.items())
    emit(args, result, text)


@command("reindex", "re-embed every memory with the configured embedding model", add_json)
def reindex(args):
    with open_engine(args) as engine:
        reindexed = engine.reindex()
        if engine.embedder is None:
            raise ModelUnavailableError(f"Nothing to re-embed with: {engine.keyword_reason}. Configure an embedding model first.")
        result = {"reindexed": reindexed, "embedder": engine.embedder.identity}
    model = result["embedder"]["model"]
    text = f"Re-embedded {plural(result['reindexed'], 'memory', 'memories')} with {model}." if result["reindexed"] else f"Vectors already match {model}; nothing to re-embed."
    emit(args, result, text)


# -- network serving and data portability (servers/http.py, transfer.py) ----------------------


def _serve_args(parser):
    parser.add_argument("--host", help="address to listen on (default: $MCP_HOST or 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default: $MCP_PORT or 8765)")
    parser.add_argument("--transport", choices=TRANSPORTS, help="MCP transport (default: $MCP_TRANSPORT or streamable-http)")
    parser.add_argument("--rest", action="store_true", help="serve the REST API (FastAPI) instead of MCP")


@command("serve", "serve MCP over HTTP at /mcp, or --rest the REST API; beyond loopback it needs TINYCONTEXT_API_TOKEN", _serve_args)
def serve(args):
    from ..servers.http import ServeSettings
    from ..servers.http import serve as run_server

    settings = ServeSettings.from_env(host=args.host, port=args.port, transport=args.transport)
    if settings.transport == "stdio" and not args.rest:
        return mcp(args)
    run_server(settings, config_of(args), rest=args.rest)


@command("ui", "open the memory browser: the REST server on 127.0.0.1 with its page at /ui",
         lambda p: (p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)"),
                    p.add_argument("--no-open", action="store_true", help="print the URL only; do not start a web browser")))
def ui(args):
    import webbrowser

    from ..servers.http import ServeSettings
    from ..servers.http import serve as run_server

    def started(base: str) -> None:
        print(f"Memory browser: {base}/ui", flush=True)
        if not args.no_open:
            webbrowser.open(base + "/ui")

    # Loopback only, whatever MCP_HOST says: the browser is for the person at this machine.
    run_server(ServeSettings.from_env(host="127.0.0.1", port=args.port), config_of(args), rest=True, on_started=started)


def existing_store(args):
    from ..errors import StorageError
    from ..memory.store import Store

    path = config_of(args).memory_db_path
    if not path.is_file():
        raise StorageError(f"No database at {path}. Check --config / TINYCONTEXT_MEMORY_DB_PATH.")
    return Store(path)


def _export_args(parser):
    parser.add_argument("--session", help="export only this session")
    parser.add_argument("-o", "--output", help="file to write (default: stdout)")
    parser.add_argument("--no-vectors", action="store_true", help="leave vectors out (smaller; the importer re-embeds)")


@command("export", "write memories, sessions and history as JSONL (to stdout or --output)", _export_args)
def export(args):
    from ..memory.transfer import export_jsonl

    store = existing_store(args)
    try:
        if args.output:
            count = _export_to_file(store, Path(args.output).expanduser(), args)
        else:
            count = export_jsonl(store, sys.stdout, session_id=args.session, vectors=not args.no_vectors)
    finally:
        store.close()
    print(f"Exported {plural(count, 'memory', 'memories')}" + (f" to {args.output}." if args.output else "."), file=sys.stderr)


def _export_to_file(store, path: Path, args) -> int:
    """Write beside the target, then rename: a failed export never leaves a half-written file."""
    from ..memory.store import make_folder
    from ..memory.transfer import export_jsonl

    if path.is_dir():
        raise InvalidInputError(f"--output {path} is a folder; give a file name, e.g. {path / 'memories.jsonl'}.")
    make_folder(path, f"--output {path}", "Give --output")
    partial = path.with_name(path.name + ".partial")
    try:
        with open(partial, "w", encoding="utf-8") as out:
            count = export_jsonl(store, out, session_id=args.session, vectors=not args.no_vectors)
        os.replace(partial, path)
    except OSError as exc:
        with suppress(OSError):  # nothing to clean up where nothing could be written
            partial.unlink(missing_ok=True)
        raise StorageError(f"Cannot write --output {path}: {exc.strerror or exc}. Choose a path in a folder you can write to.") from exc
    return count


def _import_args(parser):
    from ..memory.transfer import FORMATS

    parser.add_argument("path", help="what to import: a file ('-' for stdin, TinyContext exports only), or a folder for basic-memory")
    parser.add_argument("--format", default="tinycontext", choices=list(FORMATS), metavar="NAME",
                        help="the tool that wrote it: " + "; ".join(f"{f.name}: {f.reads}" for f in FORMATS.values())
                        + " (default: tinycontext)")
    parser.add_argument("--session", help="session for other tools' memories (default: 'default'); TinyContext exports keep theirs")
    parser.add_argument("--dry-run", action="store_true", help="count what would be imported and skipped; change nothing")
    add_json(parser)


@command("import", "import memories: a TinyContext export or legacy database, or another tool's (--format)", _import_args)
def import_(args):
    from ..memory.transfer import import_jsonl, import_path

    if args.path == "-" and args.format != "tinycontext":
        raise InvalidInputError("Only a TinyContext export can be read from stdin ('-'); give the file's path for --format " + args.format + ".")
    with open_engine(args) as engine:
        report = (import_jsonl(engine, sys.stdin, source="stdin", dry_run=args.dry_run) if args.path == "-" else
                  import_path(engine, args.path, format=args.format, session_id=args.session, dry_run=args.dry_run)).to_dict()
    verb = "Would import" if report["dry_run"] else "Imported"
    text = (f"{verb} {plural(report['imported'], 'memory', 'memories')} ({plural(report['history'], 'old version')}, "
            f"{report['embedded']} embedded), skipped {report['skipped']} already present")
    text += f", ignored {report['ignored']} deleted at the source." if report["ignored"] else "."
    if report["renumbered"]:
        text += f" {len(report['renumbered'])} took new ids because theirs were taken (see --json)."
    if report["dry_run"]:
        text += " Dry run: nothing was changed."
    emit(args, report, text)


def _backup_args(parser):
    parser.add_argument("path", help="where to write the copy")
    parser.add_argument("--force", action="store_true", help="overwrite an existing file")
    add_json(parser)


@command("backup", "copy the live database to PATH (SQLite online backup, integrity-checked)", _backup_args)
def backup(args):
    from ..memory.transfer import backup as backup_db

    store = existing_store(args)
    try:
        result = backup_db(store, args.path, overwrite=args.force)
    finally:
        store.close()
    emit(args, result, f"Backed up {plural(result['memories'], 'memory', 'memories')} to {result['path']} ({plural(result['bytes'], 'byte')}).")


@command("optimize", "merge the full-text index into one segment and rebuild the BM25 postings snapshot when due "
                     "(one write transaction: safe while serving)", add_json)
def optimize(args):
    store = existing_store(args)
    try:
        result = store.optimize()
    finally:
        store.close()
    text = f"Full-text index: {plural(result['fts_segments_before'], 'segment')} merged into {result['fts_segments']}."
    if result["postings"] is not None:
        text += f" BM25 postings snapshot of {plural(result['postings']['memories'], 'memory', 'memories')}, built {result['postings']['built_at']}."
    emit(args, result, text)


# -- entry point ------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tinycontext", description="Token-light local memory for AI agents. "
                                     "With no command, runs the MCP server on stdio.")
    parser.add_argument("--version", action="version", version=f"tinycontext {__version__}")
    parser.add_argument("--config", metavar="PATH", help="JSON config file (default: $TINYCONTEXT_CONFIG_PATH or the per-user one)")
    parser.add_argument("--traceback", action="store_true", help="on an unexpected error, show the Python traceback (for a bug report)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for cmd in COMMANDS.values():
        cmd.configure(subparsers.add_parser(cmd.name, help=cmd.help, description=cmd.help))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command or "mcp"].run(args) or 0
    except TinyContextError as err:
        print(one_line(str(err)), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly; point stdout at devnull so the final flush cannot fail.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as err:  # a file or folder the command needed (TinyContext's own paths are typed where they are used)
        where = f" {err.filename}" if err.filename else ""
        print(f"storage_error: {err.strerror or err}:{where}. Check the path and its permissions, then retry.", file=sys.stderr)
        return 1
    except Exception as err:  # noqa: BLE001 - one line, not a traceback; --traceback shows it for a bug report
        if args.traceback:
            raise
        print(one_line(f"internal_error: {type(err).__name__}: {err}. This is a bug in TinyContext: please report it "
                       "with the output of the same command run with --traceback."), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
