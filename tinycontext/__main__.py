"""`python -m tinycontext` runs the CLI (no arguments: the stdio MCP server)."""

from .cli import main

raise SystemExit(main())
