"""Time a question names: "on 13 October 2023", "in May", "last year", "two weeks ago".

:func:`question_windows` finds date phrases in a question with a regular expression (precise
about what counts as a date: "May" is a month only after "in", "of" ... or next to a day or a
year) and lets ``dateparser`` resolve each one against a reference time (weekdays, "ago", "last"),
with the period it names (day, week, month, year). Recall boosts a memory whose ``occurred_at``
falls inside such a window (``recall_time_boost``). A day or month without a year ("on 3 May",
"in June") matches that day or month in any year.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from .fusion import Candidate

_MONTH = (r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?"
          r"|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)")
_DAY = r"(?:[12]\d|3[01]|0?[1-9])(?:st|nd|rd|th)?"
_YEAR = r"(?:19|20)\d\d"
_WEEKDAY = r"(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
_COUNT = r"(?:\d{1,3}|a|an|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|(?:a\s+)?few|several|(?:a\s+)?couple\s+of)"
_UNIT = r"(?:day|week|month|year)s?"
# A phrase is matched once, by the first alternative that fits, after an optional preposition; a
# month alone counts only after one ("in May", not "May said").
_PHRASE = re.compile(
    rf"""\b(?P<prep>(?:in|on|of|during|since|until|from|early|late|mid|around|before|after|by)\s+)?(?:
        (?P<iso>{_YEAR}-[01]\d-[0-3]\d)
      | (?P<dmy>{_DAY}\s+(?:of\s+)?{_MONTH}\.?(?:,?\s+{_YEAR})?)
      | (?P<mdy>{_MONTH}\.?\s+{_DAY}(?:,?\s+{_YEAR})?)
      | (?P<my>{_MONTH}\.?,?\s+{_YEAR})
      | (?P<month>{_MONTH})
      | (?P<ago>{_COUNT}\s+{_UNIT}\s+ago)
      | (?P<last>(?:last|this|past)\s+(?:{_WEEKDAY}|week|weekend|month|year))
      | (?P<word>yesterday|today|tonight)
      | (?P<year>{_YEAR})
    )\b(?!-)""",
    re.IGNORECASE | re.VERBOSE,
)
_NO_YEAR = ("dmy", "mdy", "month")  # these, without a year, name the day or month of any year
_COUNTS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
           "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "a few": 3, "few": 3, "several": 3, "couple of": 2,
           "a couple of": 2}


@dataclass(frozen=True)
class TimeWindow:
    """Days ``start`` (inclusive) to ``end`` (exclusive); ``any_year``: only month and day count."""

    start: date
    end: date
    any_year: bool = False

    def contains(self, occurred_at: str | None) -> bool:
        """Whether the day of ``occurred_at`` (ISO text; a time with an offset counts in local time,
        as the question's "yesterday" does) is inside."""
        if not occurred_at:
            return False
        if len(occurred_at) > 10:
            moment = datetime.fromisoformat(occurred_at.replace("Z", "+00:00"))
            day = (moment.astimezone() if moment.tzinfo else moment).date()
        else:
            day = date.fromisoformat(occurred_at)
        if not self.any_year:
            return self.start <= day < self.end
        start, end = (self.start.month, self.start.day), ((self.end - timedelta(days=1)).month, (self.end - timedelta(days=1)).day)
        return start <= (day.month, day.day) <= end


def _window(day: date, period: str, any_year: bool) -> TimeWindow:
    if period == "year":
        return TimeWindow(date(day.year, 1, 1), date(day.year + 1, 1, 1), any_year)
    if period == "month":
        nxt = date(day.year + (day.month == 12), day.month % 12 + 1, 1)
        return TimeWindow(day.replace(day=1), nxt, any_year)
    if period == "week":
        monday = day - timedelta(days=day.weekday())
        return TimeWindow(monday, monday + timedelta(days=7), any_year)
    return TimeWindow(day, day + timedelta(days=1), any_year)


def _parser(now: datetime):
    # Imported on first use: dateparser loads its language data lazily, and most recalls name no time.
    from dateparser.date import DateDataParser

    return DateDataParser(languages=["en"], settings={"PREFER_DATES_FROM": "past", "RETURN_TIME_AS_PERIOD": True,
                                                      "RELATIVE_BASE": now})


def _normalise_count(phrase: str) -> str:
    """"a couple of weeks ago" -> "2 weeks ago": dateparser reads digits."""
    phrase = " ".join(phrase.split())
    lowered = phrase.lower()
    for word in sorted(_COUNTS, key=len, reverse=True):
        if lowered.startswith(word + " "):
            return f"{_COUNTS[word]} {phrase[len(word) + 1:]}"
    return phrase


def question_windows(query: str, now: datetime) -> list[TimeWindow]:
    """The time windows ``query`` names, resolved against ``now`` (naive local or UTC, as memories' times)."""
    windows: list[TimeWindow] = []
    for match in _PHRASE.finditer(query):
        kind = next(k for k, v in match.groupdict().items() if v is not None and k != "prep")
        phrase = match.group(kind)
        if kind == "month" and not match.group("prep"):
            continue
        if kind == "iso":
            try:
                day = date.fromisoformat(phrase)
            except ValueError:
                continue
            windows.append(_window(day, "day", False))
            continue
        if kind == "year":
            windows.append(_window(date(int(phrase), 1, 1), "year", False))
            continue
        if kind == "ago":
            phrase = _normalise_count(phrase)
        elif kind == "last":
            phrase = re.sub(r"^past\b", "last", phrase, flags=re.IGNORECASE)
        if kind == "last" and phrase.lower().endswith("weekend"):
            saturday = now.date() - timedelta(days=(now.weekday() - 5) % 7 or 7)
            windows.append(TimeWindow(saturday, saturday + timedelta(days=2)))
            continue
        data = _parser(now).get_date_data(re.sub(r"(\d)(st|nd|rd|th)\b", r"\1", phrase))
        if data.date_obj is None:
            continue
        any_year = kind in _NO_YEAR and not re.search(_YEAR, phrase)
        windows.append(_window(data.date_obj.date(), data.period or "day", any_year))
    return windows


def boost(ranked: list[Candidate], times: dict[int, str], windows: list[TimeWindow], weight: float) -> list[Candidate]:
    """``ranked`` with the score of each memory whose time (``times``) falls in a window multiplied
    by ``1 + weight``, best first (a stable sort: ties keep their order)."""
    for c in ranked:
        if any(w.contains(times.get(c.id)) for w in windows):
            c.rrf *= 1.0 + weight
    return sorted(ranked, key=lambda c: -c.rrf)
