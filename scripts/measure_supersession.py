"""Supersession candidates on hand-written pairs, with the bundled MiniLM model: for each (stored,
new, is-a-changed-fact) pair, a fresh database saves the stored memory, then the new one, and counts
whether the save reported a supersession candidate (tinycontext/memory/facts.py). Prints the misses
and the confusion counts; figures go in notes/supersession.md.

    python scripts/measure_supersession.py
"""

import pathlib
import tempfile

from tinycontext import MemoryEngine, TinyContextConfig
from tinycontext.models.embedder import Embedder
from tinycontext.models.hub import builtin_bundle
emb = Embedder(builtin_bundle())
pairs = [  # (stored, new, is a changed fact)
 ("The staging cluster runs Kubernetes 1.29", "The staging cluster runs Kubernetes 1.30", True),
 ("Ada reports to Bob", "Ada reports to Carol", True),
 ("Database credentials rotate every 90 days", "Database credentials rotate every 30 days", True),
 ("The release train leaves on Thursdays", "The release train leaves on Fridays", True),
 ("Harbor uses PostgreSQL 15 for metadata", "Harbor uses PostgreSQL 16 for metadata", True),
 ("The office is in Lyon", "The office is in Paris", True),
 ("Standup starts at 09:00", "Standup starts at 09:30", True),
 ("Alice's dog is 4 years old", "Alice's dog is 5 years old", True),
 ("Alice is allergic to peanuts", "Alice is allergic to peanuts and shellfish", False),
 ("The API is written in Go", "The API has 40 endpoints", False),
 ("Ada prefers tabs over spaces", "Ada prefers dark mode in her editor", False),
 ("Deploys happen on Tuesdays", "Backups run nightly at 02:00 UTC", False),
 ("Bob lives in Berlin", "Carol lives in Madrid", False),
 ("The cache holds 512 MB", "The cache evicts entries after 10 minutes", False),
]
tp=fp=fn=tn=0
for old, new, want in pairs:
    d = pathlib.Path(tempfile.mkdtemp())
    with MemoryEngine(TinyContextConfig(memory_db_path=d / "m.db", models_dir=d / "models"), embedder=emb) as e:
        e.save([old]); got = bool(e.save([new]).get("supersession_candidates"))
    tp += got and want; fp += got and not want; fn += want and not got; tn += not got and not want
    if got != want: print("MISS", old, "|", new, got)
print(dict(tp=tp, fp=fp, fn=fn, tn=tn))
