"""The notes table of scripts/bench_scale_suite.py, written from the JSON of a real (small) run of the command:
every figure of the run reaches its row and column, and a failed part is shown without hiding the others."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import bench_scale_suite  # noqa: E402

RUN = REPO / "notes" / "bench_engine_runs" / "scale_suite_smoke.json"


@pytest.fixture
def run() -> dict:
    return json.loads(RUN.read_text())


def _rows(text: str, first_cell: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith(f"| {first_cell} |")]


def test_every_part_of_the_run_reaches_the_table(run):
    text = bench_scale_suite.table(run)
    for name, point in run["scale"]["points"].items():
        (row,) = _rows(text, name)
        d = point["recall_default_ms"]
        assert row[1] == f"{point['memories']:,}"
        assert row[5] == f"{d['p50']:.1f} / {d['p95']:.1f} ({d['cpu_p50']:.1f})"
        assert row[9].startswith(f"{point['dense_recall@10_vs_exact']:.3f}")
        assert row[3].startswith(f"{point['build']['import_s']:.0f} s")
    for i, p in enumerate(run["tc051"]["passes"], start=1):
        (row,) = [r for r in _rows(text, f"{i} ({' then '.join(p['order'])})")]
        assert row[2].startswith(f"{p['tc051']['p50_ms']:.1f} / {p['tc051']['p95_ms']:.1f}")
        assert row[3] == f"x{p['ratio_p50']:.1f} / x{p['ratio_p95']:.1f}"
        assert p["tc051"]["p50_ms"] / p["ours"]["p50_ms"] == pytest.approx(p["ratio_p50"])
    for n, r in enumerate(run["ingest"]["rounds"], start=1):
        (row,) = _rows(text, str(n))
        assert row[1] == f"{r['ours']['turns_per_s']:.1f} ({r['ours']['stored']})" and row[4] == f"x{r['ratio_vs_ort_longest']:.2f}"
    for r in run["import"]["rows"]:
        assert _rows(text, f"{r['memories']:,}")[0][1] == f"{r['per_s_wall']:,}"
    cells = [r for r in run["serve"]["results"] if "mix" in r]
    clients = sorted({r["clients"] for r in cells})
    for r in cells:
        (row,) = [row for row in _rows(text, r["server"]) if row[1] == r["mix"]]
        assert row[2 + clients.index(r["clients"])] == f"{r['per_s']:.1f}, {r['p95_ms']:.1f}"
    for r in run["serve"]["results"]:
        if "lost_writes" in r:
            assert f"- {r['server']}: {r['acknowledged_saves']} saves acknowledged, {r['memories_after']} memories after" in text


def test_a_failed_part_is_shown_and_the_others_still_are(run):
    run["serve"] = {"error": "scripts/bench_serve.py exited 1", "loadavg_before": [1.0], "loadavg_after": [1.0]}
    name = next(iter(run["scale"]["points"]))
    run["scale"]["points"][name] = {"error": "scale.db missing"}
    other = list(run["scale"]["points"])[1]
    run["scale"]["points"][other]["memories"] -= 1  # measured a database the build record does not describe
    text = bench_scale_suite.table(run)
    assert "Serving (scripts/bench_serve.py): scripts/bench_serve.py exited 1" in text
    assert _rows(text, name)[0][1] == "scale.db missing"
    assert f"**record of {run['scale']['points'][other]['build']['memories']:,} memories**" in _rows(text, other)[0][3]
    assert _rows(text, "1")  # the ingest round is still there


def test_a_build_record_with_its_optimize_shows_it(run):
    name = next(iter(run["scale"]["points"]))
    assert "optimize" not in _rows(bench_scale_suite.table(run), name)[0][3]  # records from before it was timed
    run["scale"]["points"][name]["build"]["optimize_s"] = 12.4
    assert _rows(bench_scale_suite.table(run), name)[0][3].endswith(", optimize 12 s")
