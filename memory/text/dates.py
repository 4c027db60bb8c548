"""Relative dates and times in a message, resolved against the message's own time.

"Tomorrow at 3pm" said on 2026-11-22 means 2026-11-23 15:00 for ever after; a fact that keeps
only the words is wrong the next day (docs/memory.md F-52). Pure: regular expressions
and calendar arithmetic in the zone of the message's time, no I/O. English and Chinese.

Conventions (weeks start on Monday, as ISO 8601 weeks do):

- a bare weekday, "this/on/coming Friday", 周五: the nearest Friday on or after the message's day
  (the same day when it is a Friday);
- "next Friday", 下周五: the Friday of the following week (said on Monday 2026-11-23 that is
  2026-12-04; said on Saturday 2026-11-28, 2026-12-04 too);
- "last Friday": the most recent Friday before the message's day; 上周五: the Friday of the
  previous week; 这周五/本周五: the Friday of the message's week, past or not;
- "next/this/last week", 下周: the week, given by its Monday; "next month", 下个月: ``YYYY-MM``;
- a bare hour with no am/pm ("tomorrow at 3") is afternoon for 1-7 and morning for 8-11, unless
  a part of the day says otherwise ("tomorrow morning at 7", "tonight at 8", 下午3点).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Literal

Granularity = Literal["minute", "day", "week", "month"]


class NaiveTimeError(ValueError):
    """The reference time has no time zone: relative dates would be resolved in an unknown zone."""


@dataclass(frozen=True, slots=True)
class ResolvedDate:
    """One relative expression: ``text[start:end]`` is ``words`` (the original words), meaning
    ``value``: ``YYYY-MM-DD HH:MM`` (granularity ``minute``), ``YYYY-MM-DD`` (``day``, and
    ``week``: the week's Monday) or ``YYYY-MM`` (``month``), in the zone of the reference time."""

    start: int
    end: int
    words: str
    value: str
    granularity: Granularity


@dataclass(frozen=True, slots=True)
class _Match:
    start: int
    end: int
    day: date
    granularity: Granularity
    part: str = ""  # a part of the day ("morning", "evening", ...) said with the date
    minutes: int | None = None  # a time of day (minutes after midnight) said with the date


_WEEKDAYS_EN = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_WEEKDAYS_ZH = {"一": 0, "二": 1, "三": 2, "四": 3, "五": 4, "六": 5, "日": 6, "天": 6, "1": 0, "2": 1, "3": 2}
_WEEKDAYS_ZH |= {"4": 3, "5": 4, "6": 5, "7": 6}
_NUMBER_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}
_NUMBER_WORDS |= {"eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12}
_ZH_DIGITS = {"零": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9}
_PARTS_EN = {"morning": "morning", "afternoon": "afternoon", "evening": "evening", "night": "night"}
_PARTS_ZH = {"早上": "morning", "早晨": "morning", "上午": "morning", "凌晨": "early", "中午": "noon"}
_PARTS_ZH |= {"下午": "afternoon", "傍晚": "evening", "晚上": "evening", "夜里": "night"}
_AFTERNOON = frozenset({"afternoon", "evening", "night"})

_N = r"(?P<n>\d{1,3}|an?|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)"
_WD = r"(?P<wd>monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
_ZN = r"(?P<n>\d{1,3}|[一二两三四五六七八九十]{1,3})"
_TIME_EN = (
    r"(?P<h>\d{1,2})(?::(?P<m>\d{2}))?\s*(?P<ap>am|pm|a\.m\.|p\.m\.)(?![a-z])"
    r"|(?P<h24>\d{1,2}):(?P<m24>\d{2})(?!\d)"
    r"|(?P<hoc>\d{1,2})\s*o'?clock"
    r"|(?P<noon>noon|midday|midnight)"
)
_TIME_ZH = r"(?P<zpart>早上|早晨|上午|凌晨|中午|下午|傍晚|晚上|夜里)?(?P<zh>\d{1,2}|[一二两三四五六七八九十]{1,3})[点點时](?:(?P<zhalf>半)|(?P<zm>\d{1,2}|[一二三四五六七八九十]{1,3})分?)?"
_TIME_AFTER = re.compile(rf"[^\S\n]*,?[^\S\n]*(?:at|@|around|about|by|from)?[^\S\n]*(?:{_TIME_EN})", re.IGNORECASE)
_BARE_HOUR_AFTER = re.compile(
    r"[^\S\n]*,?[^\S\n]*(?:at|@|around|about|by)[^\S\n]+(?P<h>\d{1,2})(?![\d:]|[.,]\d|\s*(?:%|days?|weeks?|hours?|people|of))",
    re.IGNORECASE,
)
_TIME_BEFORE = re.compile(rf"(?:(?:at|@|around|by)[^\S\n]+)?(?:{_TIME_EN})[^\S\n]+(?:on[^\S\n]+)?$", re.IGNORECASE)
_TIME_ZH_AFTER = re.compile(rf"[^\S\n]*(?:{_TIME_ZH})")
_PART_ZH_AFTER = re.compile(r"(早上|早晨|上午|凌晨|中午|下午|傍晚|晚上|夜里)")

_Resolver = Callable[[re.Match[str], datetime], _Match]


def resolve_relative(text: str, at: datetime) -> list[ResolvedDate]:
    """The relative date and time expressions of ``text`` resolved against ``at`` (the message's
    time, timezone-aware; results are in its zone), ordered by position, never overlapping (the
    longest expression at a position wins). Absolute dates are not reported. Raises
    :class:`NaiveTimeError` for a naive ``at``."""
    if at.tzinfo is None or at.utcoffset() is None:
        raise NaiveTimeError("resolve_relative needs a timezone-aware reference time")
    found = [resolve(match, at) for pattern, resolve in _RULES for match in pattern.finditer(text)]
    found.sort(key=lambda m: (m.start, -m.end))
    kept: list[_Match] = []
    for candidate in found:
        if not kept or candidate.start >= kept[-1].end:
            kept.append(candidate)
    results = []
    for match in kept:
        if match.granularity == "day" and match.minutes is None:
            match = _with_time(text, match)
        results.append(_result(text, match, at))
    return results


def _result(text: str, match: _Match, at: datetime) -> ResolvedDate:
    if match.granularity == "month":
        value = f"{match.day.year:04d}-{match.day.month:02d}"
    elif match.minutes is not None:
        value = f"{match.day.isoformat()} {match.minutes // 60:02d}:{match.minutes % 60:02d}"
    else:
        value = match.day.isoformat()
    granularity: Granularity = "minute" if match.minutes is not None else match.granularity
    return ResolvedDate(
        start=match.start, end=match.end, words=text[match.start : match.end], value=value, granularity=granularity
    )


def _with_time(text: str, match: _Match) -> _Match:
    """``match`` widened over a time of day said right after or right before it ("tomorrow at
    3pm", "at 10:30 on Friday", 明天下午3点)."""
    after = _TIME_AFTER.match(text, match.end) or _TIME_ZH_AFTER.match(text, match.end)
    if after:
        minutes = _minutes(after, match.part)
        if minutes is not None:
            return _Match(match.start, after.end(), match.day, "minute", match.part, minutes)
    bare = _BARE_HOUR_AFTER.match(text, match.end)
    if bare:
        return _Match(match.start, bare.end(), match.day, "minute", match.part, _hour(int(bare["h"]), match.part) * 60)
    before = _TIME_BEFORE.search(text, max(0, match.start - 24), match.start)
    if before:
        minutes = _minutes(before, match.part)
        if minutes is not None:
            return _Match(before.start(), match.end, match.day, "minute", match.part, minutes)
    part = _PART_ZH_AFTER.match(text, match.end)
    if part:
        return _Match(match.start, part.end(), match.day, match.granularity, _PARTS_ZH[part[1]])
    return match


def _minutes(match: re.Match[str], part: str) -> int | None:
    """Minutes after midnight of a time-of-day match (English or Chinese), None when out of range."""
    groups = match.groupdict()
    if groups.get("noon"):
        return 0 if groups["noon"].lower() == "midnight" else 12 * 60
    if groups.get("h") and groups.get("ap"):
        hour, minute = int(groups["h"]), int(groups.get("m") or 0)
        if not 1 <= hour <= 12:
            return None
        hour = hour % 12 + (12 if groups["ap"].lower().startswith("p") else 0)
    elif groups.get("h24"):
        hour, minute = int(groups["h24"]), int(groups["m24"])
        if part in _AFTERNOON and hour < 12:
            hour += 12
    elif groups.get("hoc"):
        hour, minute = _hour(int(groups["hoc"]), part), 0
    elif groups.get("zh"):
        zh_part = _PARTS_ZH.get(groups.get("zpart") or "", part)
        hour = _hour(_zh_number(groups["zh"]), zh_part, chinese=True)
        minute = 30 if groups.get("zhalf") else _zh_number(groups["zm"]) if groups.get("zm") else 0
    else:
        return None
    if not (0 <= hour <= 23 and 0 <= minute <= 59):
        return None
    return hour * 60 + minute


def _hour(hour: int, part: str, *, chinese: bool = False) -> int:
    """A bare hour in 24-hour time: moved to the afternoon when the part of the day says so;
    without one, English 1-7 is afternoon ("at 3") and Chinese hours stay as said (3点)."""
    if part in _AFTERNOON or part == "noon":
        return hour + 12 if hour < 12 and not (part == "noon" and hour >= 11) else hour
    if part in ("morning", "early") or chinese:
        return hour % 12 if hour == 12 and part else hour
    return hour + 12 if 1 <= hour <= 7 else hour


def _zh_number(text: str) -> int:
    """A number in Arabic or Chinese digits up to 99 ("3", "十二", "二十一")."""
    if text.isdigit():
        return int(text)
    if "十" in text:
        tens, _, ones = text.partition("十")
        return (_ZH_DIGITS[tens] if tens else 1) * 10 + (_ZH_DIGITS[ones] if ones else 0)
    return _ZH_DIGITS.get(text, 0)


def _count(word: str) -> int:
    word = word.lower()
    return int(word) if word.isdigit() else _NUMBER_WORDS[word]


def _add_months(day: date, months: int) -> date:
    month = day.month - 1 + months
    year, month = day.year + month // 12, month % 12 + 1
    for last in (31, 30, 29, 28):
        try:
            return date(year, month, min(day.day, last))
        except ValueError:
            continue
    raise AssertionError("unreachable: every month has 28 days")


def _monday(day: date) -> date:
    return day - timedelta(days=day.weekday())


def _offset(day: date, count: int, unit: str) -> date:
    unit = unit.lower()
    if unit.startswith(("month", "个月", "月")):
        return _add_months(day, count)
    if unit.startswith(("week", "fortnight", "周", "个星期", "个礼拜", "星期", "礼拜")):
        return day + timedelta(weeks=count * (2 if unit.startswith("fortnight") else 1))
    return day + timedelta(days=count)


# --- rules: (pattern, resolver) -------------------------------------------------------------


def _fixed(days: int, part: str = "") -> _Resolver:
    def resolve(match: re.Match[str], at: datetime) -> _Match:
        said_part = part or _PARTS_EN.get((match.groupdict().get("part") or "").lower(), "")
        return _Match(match.start(), match.end(), at.date() + timedelta(days=days), "day", said_part)

    return resolve


def _in_n(match: re.Match[str], at: datetime) -> _Match:
    sign = -1 if (match.groupdict().get("ago") or "") else 1
    return _Match(match.start(), match.end(), _offset(at.date(), sign * _count(match["n"]), match["unit"]), "day")


def _in_hours(match: re.Match[str], at: datetime) -> _Match:
    count = _count(match["n"])
    later = at + (timedelta(hours=count) if match["unit"].lower().startswith("h") else timedelta(minutes=count))
    return _Match(match.start(), match.end(), later.date(), "minute", minutes=later.hour * 60 + later.minute)


def _weekday_en(match: re.Match[str], at: datetime) -> _Match:
    today = at.date()
    which, target = (match["which"] or "").lower(), _WEEKDAYS_EN.index(match["wd"].lower())
    if which == "next":
        day = _monday(today) + timedelta(days=7 + target)
    elif which == "last":
        day = today - timedelta(days=(today.weekday() - target) % 7 or 7)
    else:
        day = today + timedelta(days=(target - today.weekday()) % 7)
    part = _PARTS_EN.get((match["part"] or "").lower(), "")
    return _Match(match.start(), match.end(), day, "day", part)


def _weekend(match: re.Match[str], at: datetime) -> _Match:
    today = at.date()
    saturday = _monday(today) + timedelta(days=5)
    day = saturday + timedelta(days=7) if (match["which"] or "").lower() in ("next", "下") else max(saturday, today)
    return _Match(match.start(), match.end(), day, "day")


def _period_en(match: re.Match[str], at: datetime) -> _Match:
    today = at.date()
    step = {"next": 1, "this": 0, "last": -1}[match["which"].lower()]
    if match["unit"].lower() == "month":
        return _Match(match.start(), match.end(), _add_months(today.replace(day=1), step), "month")
    return _Match(match.start(), match.end(), _monday(today) + timedelta(weeks=step), "week")


def _weekday_zh(match: re.Match[str], at: datetime) -> _Match:
    today = at.date()
    which, target = match["which"] or "", _WEEKDAYS_ZH[match["wd"]]
    if which == "下":
        day = _monday(today) + timedelta(days=7 + target)
    elif which == "上":
        day = _monday(today) - timedelta(days=7) + timedelta(days=target)
    elif which in ("这", "本", "這"):
        day = _monday(today) + timedelta(days=target)
    else:
        day = today + timedelta(days=(target - today.weekday()) % 7)
    return _Match(match.start(), match.end(), day, "day")


def _period_zh(match: re.Match[str], at: datetime) -> _Match:
    today = at.date()
    step = {"下": 1, "这": 0, "這": 0, "本": 0, "上": -1}[match["which"]]
    if match["unit"] == "月":
        return _Match(match.start(), match.end(), _add_months(today.replace(day=1), step), "month")
    return _Match(match.start(), match.end(), _monday(today) + timedelta(weeks=step), "week")


def _in_n_zh(match: re.Match[str], at: datetime) -> _Match:
    sign = -1 if match["dir"].endswith("前") else 1
    return _Match(match.start(), match.end(), _offset(at.date(), sign * _zh_number(match["n"]), match["unit"]), "day")


_I = re.IGNORECASE
_PART = r"(?:[^\S\n]+(?P<part>morning|afternoon|evening|night))?"
_RULES: tuple[tuple[re.Pattern[str], _Resolver], ...] = (
    (re.compile(r"\bthe day after tomorrow\b", _I), _fixed(2)),
    (re.compile(r"\bthe day before yesterday\b", _I), _fixed(-2)),
    (re.compile(r"\btonight\b", _I), _fixed(0, "evening")),
    (re.compile(r"\bthis[^\S\n]+(?P<part>morning|afternoon|evening)\b", _I), _fixed(0)),
    (re.compile(rf"\btoday\b{_PART}", _I), _fixed(0)),
    (re.compile(rf"\b(?:tomorrow|tmrw)\b{_PART}", _I), _fixed(1)),
    (re.compile(rf"\byesterday\b{_PART}", _I), _fixed(-1)),
    (re.compile(rf"\b(?:in|within)[^\S\n]+{_N}[^\S\n]+(?P<unit>days?|weeks?|months?|fortnights?)\b", _I), _in_n),
    (
        re.compile(rf"\b{_N}[^\S\n]+(?P<unit>days?|weeks?|months?)[^\S\n]+(?:from now|later|(?P<ago>ago))\b", _I),
        _in_n,
    ),
    (
        re.compile(rf"\b(?:(?P<which>next|this|last|coming|on)[^\S\n]+)?{_WD}\b{_PART}", _I),
        _weekday_en,
    ),
    (re.compile(r"\b(?P<which>next|this)[^\S\n]+weekend\b", _I), _weekend),
    (re.compile(rf"\bin[^\S\n]+{_N}[^\S\n]+(?P<unit>hours?|minutes?|mins?)\b", _I), _in_hours),
    (re.compile(r"\b(?P<which>next|this|last)[^\S\n]+(?P<unit>week|month)\b", _I), _period_en),
    (re.compile(r"大后天"), _fixed(3)),
    (re.compile(r"后天|後天"), _fixed(2)),
    (re.compile(r"明晚"), _fixed(1, "evening")),
    (re.compile(r"明早"), _fixed(1, "morning")),
    (re.compile(r"明天|明日"), _fixed(1)),
    (re.compile(r"今晚"), _fixed(0, "evening")),
    (re.compile(r"今天|今日|今早"), _fixed(0)),
    (re.compile(r"昨天|昨日|昨晚"), _fixed(-1)),
    (re.compile(r"前天"), _fixed(-2)),
    (re.compile(r"(?P<which>下|这|這|本)?个?(?:周末|週末)"), _weekend),
    (re.compile(r"(?P<which>下|上|这|這|本)?个?(?:周|星期|礼拜|禮拜)(?P<wd>[一二三四五六日天1-7])"), _weekday_zh),
    (re.compile(r"(?P<which>下|上|这|這|本)个?(?P<unit>周|星期|礼拜|月)(?![一二三四五六日天1-7])"), _period_zh),
    (re.compile(rf"{_ZN}[^\S\n]*(?P<unit>天|周|个星期|个礼拜|个月)(?P<dir>后|以后|之后|後|前|以前|之前)"), _in_n_zh),
)
