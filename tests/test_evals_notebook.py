"""Notebooks run headless (nbclient) against a small real sweep made here, on a LoCoMo slice (two
conversations, so cross-validation by conversation has folds), and JupyterLab serves /lab."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import nbformat
import pandas as pd
import pytest
from nbclient import NotebookClient

from evals.run import _commands

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def locomo_slice(shared_dir: Path, out: Path) -> Path:
    """The first two sessions of two real LoCoMo conversations, with the questions they answer."""
    samples = json.loads((shared_dir / "datasets" / "locomo" / "locomo-dev.json").read_text(encoding="utf-8"))[:2]
    for sample in samples:
        conv = sample["conversation"]
        for key in [k for k in conv if re.fullmatch(r"session_\d+(_date_time)?", k) and k.split("_")[1] not in ("1", "2")]:
            del conv[key]
    out.write_text(json.dumps(samples), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def locomo_sweep(tmp_path_factory, shared_dir):
    root = tmp_path_factory.mktemp("nb")
    data = locomo_slice(shared_dir, root / "locomo-slice.json")
    out = root / "sweep"
    result = subprocess.run(
        [sys.executable, "-m", "evals.run", "-m", "dataset=locomo", f"dataset.path={data}", "retrieval.dense_weight=0,0.5",
         "latency.queries=5", "latency.warmup=2", "latency.index_sample=20", "latency.probe_runs=1", f"hydra.sweep.dir={out}"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "TINYCONTEXT_EVAL_CACHE": str(root / "cache")})
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_locomo_runs_report_categories_and_cross_validated_test(locomo_sweep, tmp_path, capsys):
    rows = pd.read_csv(locomo_sweep / "results.csv")
    assert set(rows["test_split"]) == {"dev"} and set(rows["cross_validate"]) == {"session"}
    cats = sorted(int(c[3]) for c in rows.columns if c.startswith("cat") and c.endswith("_queries"))
    assert cats and set(cats) <= {1, 2, 3, 4}
    for c in cats:
        assert (rows[f"cat{c}_recall@10_ci_low"] <= rows[f"cat{c}_recall@10"]).all()
    assert rows[[f"cat{c}_queries" for c in cats]].sum(axis=1).eq(rows["queries_test"]).all()
    # The naive baseline is the whole conversation, the same for every config.
    assert rows["tokens_naive"].nunique() == 1 and (rows["tokens_naive"] > rows["tokens_returned"]).all()
    report = (locomo_sweep / "report.md").read_text()
    assert "leave-one-conversation-out" in report and "category 5" in report
    target = tmp_path / "context_config.json"
    assert _commands(["recommend", str(locomo_sweep), "--out", str(target)]) == 0
    provenance = json.loads(target.read_text())["provenance"]
    assert provenance["test"]["split"].startswith("dev (leave-one-conversation-out)")
    assert [f["held_out"] for f in provenance["test"]["folds"]] == ["conv-26", "conv-30"]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(notebook, locomo_sweep, monkeypatch):
    monkeypatch.setenv("TINYCONTEXT_SWEEP_DIR", str(locomo_sweep))
    monkeypatch.delenv("TINYCONTEXT_RUN_DIR", raising=False)
    nb = nbformat.read(notebook, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(notebook.parent)}}).execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    if notebook.name == "sweep_tradeoffs.ipynb":
        assert "configs from" in text and "recommended" in text and "wins" in text and len(images) >= 4
    else:
        assert "questions have no evidence turn in the top 10" in text and len(images) >= 1


def test_every_notebook_is_tested():
    assert {p.name for p in NOTEBOOKS} == {"sweep_tradeoffs.ipynb", "locomo_error_analysis.ipynb"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_jupyter_lab_serves_lab(tmp_path):
    port, token = _free_port(), "tinycontext-test"
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_DATA_DIR": str(tmp_path / "data"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         f"--IdentityProvider.token={token}", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         "--LabApp.extension_manager=readonly", "--allow-root",  # CI runs as root
         f"--ServerApp.root_dir={REPO / 'notebooks'}"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline, status = time.monotonic() + 120, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status = httpx.get(f"http://127.0.0.1:{port}/lab", params={"token": token}, timeout=5).status_code
                break
            except httpx.TransportError:
                time.sleep(0.5)
        assert status == 200, proc.stderr.read() if proc.poll() is not None else f"status {status}"
        listing = httpx.get(f"http://127.0.0.1:{port}/api/contents", params={"token": token}, timeout=10).json()
        assert {"sweep_tradeoffs.ipynb", "locomo_error_analysis.ipynb"} <= {c["name"] for c in listing["content"]}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_sweep_notebook_runs_from_a_fresh_clone(tmp_path, monkeypatch):
    """No sweep yet (a fresh clone): the notebook sweeps the shipped tiny dataset itself."""
    monkeypatch.delenv("TINYCONTEXT_SWEEP_DIR", raising=False)
    monkeypatch.setenv("TINYCONTEXT_SWEEP_ROOT", str(tmp_path / "sweeps"))
    monkeypatch.setenv("TINYCONTEXT_EVAL_CACHE", str(tmp_path / "cache"))
    notebook = next(p for p in NOTEBOOKS if p.name == "sweep_tradeoffs.ipynb")
    nb = nbformat.read(notebook, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(notebook.parent)}}).execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "3 configs from" in text and "(tiny)" in text and "rule:" in text
    assert (tmp_path / "sweeps" / "tiny-notebook" / "results.csv").is_file()
