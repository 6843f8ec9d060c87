"""The same 2-job sweep through Hydra's joblib, submitit (local executor) and Ray (a local cluster on
loopback) launchers: submitit and Ray give the joblib run's results."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pandas as pd
import psutil
import pytest
from loopback_guard import is_loopback

REPO = Path(__file__).resolve().parents[1]
SWEEP = ["-m", "dataset=tiny", "retrieval.dense_weight=0,1", "latency.queries=3", "latency.warmup=1",
         "latency.index_sample=10", "latency.probe_runs=1", "force=true"]
SAME = ["dense_weight", "ndcg@10", "recall@10", "recall@100", "mrr@10", "budget_recall", "tune_ndcg@10",
        "ndcg@10_ci_low", "ndcg@10_ci_high", "tokens_returned", "tokens_naive"]

pytestmark = pytest.mark.slow


def sweep(out: Path, cache: Path, *launcher: str) -> pd.DataFrame:
    result = subprocess.run([sys.executable, "-m", "evals.run", *SWEEP, *launcher, f"hydra.sweep.dir={out}"], cwd=REPO,
                            capture_output=True, text=True, timeout=900,
                            env={**os.environ, "TINYCONTEXT_EVAL_CACHE": str(cache)})
    assert result.returncode == 0, f"{launcher}: {result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return pd.read_csv(out / "results.csv").sort_values("dense_weight").reset_index(drop=True)


@pytest.fixture(scope="module")
def joblib_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    rows = sweep(root / "joblib", root / "cache", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2")
    assert len(rows) == 2 and not rows["index_reused"].all()
    return root, rows


def test_submitit_local_matches_joblib(joblib_run):
    root, expected = joblib_run
    rows = sweep(root / "submitit", root / "cache", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=15")
    assert (root / "submitit" / ".submitit").is_dir()  # the jobs really went through submitit
    pd.testing.assert_frame_equal(rows[SAME], expected[SAME])


def _inet_addresses(root: psutil.Process) -> set[str]:
    """Every local and remote address of the internet sockets held by ``root`` and its descendants."""
    seen: set[str] = set()
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return seen
    for proc in procs:
        try:
            conns = proc.net_connections(kind="inet") if hasattr(proc, "net_connections") else proc.connections("inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        for conn in conns:
            seen.update(addr.ip for addr in (conn.laddr, conn.raddr) if addr)
    return seen


def test_ray_local_cluster_matches_joblib_on_loopback_only(joblib_run):
    """Ray started by the launcher on this host, confined to loopback: Ray binds its node address, which
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 makes 127.0.0.1 (else the host's outward address). Every Python
    process of the sweep (driver, Ray's workers and agents) runs with the loopback guard refusing and logging
    any connect beyond loopback; the sockets of Ray's native processes are watched while it runs."""
    root, expected = joblib_run
    site, log, armed = root / "site", root / "netguard.log", root / "armed.log"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, sys\n"
        f"sys.path.append({str(Path(__file__).parent)!r})\n"
        "import loopback_guard\n"
        "loopback_guard.guard_process(os.environ['NETGUARD_LOG'])\n"
        "with open(os.environ['NETGUARD_ARMED'], 'a') as fh:\n"
        "    fh.write(' '.join(sys.argv[:1]) + '\\n')\n", encoding="utf-8")
    # Ray's dashboard process asks cloud metadata services (169.254.169.254, metadata.google.internal) which
    # cloud it runs on unless ~/ray_bootstrap_config.yaml names the provider: a home that names it "local".
    home = root / "home"
    home.mkdir()
    (home / "ray_bootstrap_config.yaml").write_text("provider:\n  type: local\n", encoding="utf-8")
    ray_dir = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # Ray's unix socket paths must stay short
    env = {**os.environ, "HOME": str(home), "TINYCONTEXT_EVAL_CACHE": str(root / "cache"), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "RAY_USAGE_STATS_ENABLED": "0", "NETGUARD_LOG": str(log), "NETGUARD_ARMED": str(armed),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    out = root / "ray"
    command = [sys.executable, "-m", "evals.run", *SWEEP, "hydra/launcher=ray", "+hydra.launcher.ray.init.num_cpus=2",
               "+hydra.launcher.ray.init.include_dashboard=false", f"+hydra.launcher.ray.init._temp_dir={ray_dir}",
               f"hydra.sweep.dir={out}"]
    addresses: set[str] = set()

    def launch() -> subprocess.Popen:
        with subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
            watched = psutil.Process(proc.pid)
            stop = threading.Event()

            def watch():
                while not stop.is_set():
                    addresses.update(_inet_addresses(watched))
                    stop.wait(0.2)

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            try:
                proc.output, _ = proc.communicate(timeout=900)
            finally:
                stop.set()
                watcher.join()
                proc.kill()
        return proc

    proc = launch()
    # Ray gives its raylet 30 s (fixed in ray/_private/node.py) to register with the GCS; on a heavily
    # loaded machine (load 10+ on 2 cores) its agents take longer to start. That is Ray's start-up, not
    # what this test checks: up to two more tries.
    for _ in range(2):
        if proc.returncode == 0 or "timed out during startup" not in proc.output:
            break
        shutil.rmtree(out, ignore_errors=True)
        proc = launch()
    output = proc.output
    shutil.rmtree(ray_dir, ignore_errors=True)
    assert proc.returncode == 0, output[-4000:]
    assert "Started a local Ray instance" in output  # the jobs really went through Ray
    assert any("default_worker" in line for line in armed.read_text().splitlines())  # the guard ran in Ray's workers
    assert addresses, "no socket of the Ray cluster was observed"
    beyond = {a for a in addresses if not is_loopback(a)}  # 0.0.0.0 / :: (every interface) included
    assert not beyond, f"the Ray cluster used addresses beyond loopback: {beyond}"
    assert not log.exists(), log.read_text()
    rows = pd.read_csv(out / "results.csv").sort_values("dense_weight").reset_index(drop=True)
    pd.testing.assert_frame_equal(rows[SAME], expected[SAME])
