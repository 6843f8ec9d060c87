"""LoCoMo loading shared by the engine benchmark and the 0.5.1 baseline (stdlib only: the baseline
runs in its own Python 3.12 venv without this project installed).

A conversation becomes one memory session; each turn becomes one memory; each ``session_N`` of the
conversation is saved in one call, as an agent saving after every chat session would.
Format ``turns`` (the engine's conversation API, not for the baseline) saves each turn as
``{content, speaker, occurred_at, attachments}``: the README's "Saving a conversation" recipe.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

LOCOMO = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "locomo" / "locomo-dev.json"
EVIDENCE_CATEGORIES = (1, 2, 3, 4)  # 5 is adversarial (no evidence)
FORMATS = ("plain", "dated", "dated_caption", "turns")
_EVIDENCE = re.compile(r"D:?(\d+):(\d+)")


def load(path: Path | str = LOCOMO) -> list[dict]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def memory_text(turn: dict, date: str, fmt: str) -> str:
    """plain: "Speaker: text"; dated: "[8 May, 2023] Speaker: text"; dated_caption also appends
    the shared image's caption, which is what the other speaker sees."""
    text = f"{turn['speaker']}: {turn['text']}"
    if fmt == "plain":
        return text
    day = date.split(" on ", 1)[-1]  # "1:56 pm on 8 May, 2023" -> "8 May, 2023"
    text = f"[{day}] {text}"
    if fmt == "dated_caption" and turn.get("blip_caption"):
        text += f" [shares {turn['blip_caption']}]"
    return text


def occurred_at(date: str) -> str:
    """LoCoMo's "1:56 pm on 8 May, 2023" -> ISO "2023-05-08T13:56"."""
    return datetime.strptime(" ".join(date.split()), "%I:%M %p on %d %B, %Y").isoformat(timespec="minutes")


def turn_memory(turn: dict, date: str) -> dict:
    """A turn as the engine's conversation API takes it: what was said, by whom, when, what was shared."""
    memory = {"content": turn["text"], "speaker": turn["speaker"], "occurred_at": occurred_at(date)}
    if turn.get("blip_caption"):
        memory["attachments"] = [turn["blip_caption"]]
    return memory


def sessions(conv: dict, fmt: str = "plain") -> list[list[tuple[str, str | dict]]]:
    """The conversation's chat sessions in order, each a list of (dia_id, memory text or dict)."""
    c = conv["conversation"]
    numbers = sorted(int(k.split("_")[1]) for k in c if re.fullmatch(r"session_\d+", k) and c[k])
    make = (lambda t, d: turn_memory(t, d)) if fmt == "turns" else (lambda t, d: memory_text(t, d, fmt))
    return [[(t["dia_id"], make(t, c.get(f"session_{n}_date_time", ""))) for t in c[f"session_{n}"]] for n in numbers]


def evidence_ids(raw: list[str]) -> list[str]:
    """Normalise evidence: 'D8:6; D9:17' -> two ids, 'D:11:26' -> 'D11:26'; junk like 'D' is dropped."""
    out: list[str] = []
    for item in raw:
        for a, b in _EVIDENCE.findall(item):
            dia = f"D{a}:{b}"
            if dia not in out:
                out.append(dia)
    return out


def questions(conv: dict) -> list[dict]:
    """Questions with evidence (categories 1-4): {qid, question, category, evidence[dia_id]}."""
    return [
        {"qid": f"{conv['sample_id']}:{i}", "question": q["question"], "category": q["category"], "evidence": evidence_ids(q["evidence"])}
        for i, q in enumerate(conv["qa"]) if q.get("category") in EVIDENCE_CATEGORIES and q.get("evidence")
    ]


def qrels_for(conv: dict, dia_to_id: dict[str, str]) -> list[tuple[str, str, int]]:
    """(qid, doc_id, 1) per evidence turn; a dia_id absent from the conversation stays as an
    unreachable doc so it still counts against recall."""
    rows = []
    for q in questions(conv):
        docs = {dia_to_id.get(d, f"missing:{conv['sample_id']}:{d}") for d in q["evidence"]}
        rows += [(q["qid"], d, 1) for d in sorted(docs)]
    return rows
