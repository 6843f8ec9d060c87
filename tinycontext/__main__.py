"""`python -m tinycontext` runs the CLI (no arguments: the stdio MCP server)."""

from .cli.commands import main

raise SystemExit(main())
