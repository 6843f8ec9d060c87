"""The notebooks run headless (nbclient) on the shipped results fixture, so they never rot."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "eval_sweep"


@pytest.mark.parametrize("notebook", sorted((REPO / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_notebook_executes(notebook, monkeypatch):
    monkeypatch.setenv("TINYCONTEXT_SWEEP_DIR", str(FIXTURE))
    nb = nbformat.read(notebook, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(notebook.parent)}}).execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "configs from" in text and "wins" in text and "losses" in text
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) >= 4
