"""Credentials in user text: where they are, and a copy with each replaced by a visible marker (F-51). Memory's own text
(summary, key facts, recall index) must never carry a password, key, token, one-time code or card number; the stored
message stays as sent. Found by shape (key blocks, provider keys, JWTs, IBANs, Luhn-valid card numbers …) or after a
cue word in five languages; ordinary identifiers are left alone. Pure regular expressions and checksums, fast enough
for every stored message."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

SecretKind = Literal[
    "password", "pin", "api_key", "token", "one_time_code", "card_number", "card_code", "iban", "ssn", "private_key"
]

PASSWORD_MARKER = "[password withheld]"
PIN_MARKER = "[PIN withheld]"
API_KEY_MARKER = "[api key withheld]"
TOKEN_MARKER = "[token withheld]"
ONE_TIME_CODE_MARKER = "[one-time code withheld]"
CARD_NUMBER_MARKER = "[card number withheld]"
CARD_CODE_MARKER = "[card security code withheld]"
IBAN_MARKER = "[IBAN withheld]"
SSN_MARKER = "[social security number withheld]"
PRIVATE_KEY_MARKER = "[private key withheld]"
MARKERS: dict[SecretKind, str] = {
    "password": PASSWORD_MARKER,
    "pin": PIN_MARKER,
    "api_key": API_KEY_MARKER,
    "token": TOKEN_MARKER,
    "one_time_code": ONE_TIME_CODE_MARKER,
    "card_number": CARD_NUMBER_MARKER,
    "card_code": CARD_CODE_MARKER,
    "iban": IBAN_MARKER,
    "ssn": SSN_MARKER,
    "private_key": PRIVATE_KEY_MARKER,
}


@dataclass(frozen=True, slots=True)
class SecretSpan:
    """One credential in a text: ``text[start:end]`` (character offsets) is a secret of ``kind``."""

    start: int
    end: int
    kind: SecretKind


# A marker already in the text (this module's or one of the same form) is never a secret itself,
# so redaction is idempotent.
_MARKER = re.compile(r"\[[A-Za-z][A-Za-z -]{0,40} withheld\]")

# Speed: Python's regex engine is slow at alternations tried at every position, so cue words are
# matched in the lower-cased text without IGNORECASE, word boundaries are checked in Python
# (:func:`_bounded`), and each detector first checks cheap substrings (its "needles").
_PRIVATE_KEY = re.compile(
    r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----.*?(?:-----END [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----|\Z)",
    re.DOTALL,
)
# Provider key formats (prefixes the providers document); each is a secret wherever it appears.
_KEY_SHAPE_NEEDLES = (
    *("sk-", "sk_", "rk_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    *("glpat-", "xox", "AKIA", "ASIA", "AIza", "hf_", "npm_"),
)
_KEY_SHAPES = re.compile(
    r"(?<![A-Za-z0-9_-])(?:"
    r"sk-[A-Za-z0-9_-]{20,}"
    r"|(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}"
    r"|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}"
    r"|glpat-[A-Za-z0-9_-]{20,}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,}"
    r"|(?:AKIA|ASIA)[A-Z0-9]{16}"
    r"|AIza[0-9A-Za-z_-]{35}"
    r"|hf_[A-Za-z0-9]{30,}|npm_[A-Za-z0-9]{36}"
    r")(?![A-Za-z0-9_-])"
)
_JWT = re.compile(r"eyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{8,}")
_BEARER = re.compile(r"bearer[^\S\n]+([A-Za-z0-9._~+/-]{16,}=*)")
_URL_CREDENTIALS = re.compile(r"://[^/\s:@]+:([^/\s@]+)@")

_IBAN = re.compile(r"(?<![A-Za-z0-9])[A-Z]{2}\d{2}(?:[ ]?[A-Z0-9]{4}){2,7}(?:[ ]?[A-Z0-9]{1,3})?(?![A-Za-z0-9])")
# Runs of digits with single spaces or dashes, at least 9 digits' worth of characters: where card
# numbers and social security numbers can be.
_DIGIT_CLUSTER = re.compile(r"\d[\d -]{8,}\d")
_CARD = re.compile(r"(?<![\w+.,/-])(?<!\d[ -])\d(?:[ -]?\d){12,18}(?![\w/-]|[.,]\d|[ -]\d)")
_SSN = re.compile(r"(?<![\w-])(\d{3})-(\d{2})-(\d{4})(?![\w-])")
# A long digit run labelled by these words is a reference, not a card (unless a card word is closer).
_NOT_CARD_CUE = re.compile(
    r"\b(?:tracking|order|booking|reservation|reference|ref|invoice|account|ticket|confirmation|parcel|shipment"
    r"|policy|case|customer|member(?:ship)?|loyalty|imei|serial)\b|运单|订单|快递|单号",
    re.IGNORECASE,
)
# Printed as a card is: four groups of four, or Amex's 4-6-5.
_CARD_GROUPS = re.compile(r"\d{4}([ -])\d{4}\1\d{4}\1\d{4}(?:\1\d{1,3})?|\d{4}([ -])\d{6}\2\d{5}")
_LABEL = re.compile(r"(?:[\s#:：.-]|number|num|no|nr|id|is|was|ref)*", re.IGNORECASE)
_CARD_CUE = re.compile(r"\b(?:card|visa|mastercard|amex|credit|debit)\b|卡号|信用卡|karte|carte|tarjeta", re.IGNORECASE)
_SSN_CUE = re.compile(
    r"(?:ssn|social security(?: number| no\.?)?|social insurance number|sozialversicherungsnummer)"
    r"[^\S\n]*(?:is|:|=|#)?[^\S\n]*(\d{3}[ -]?\d{2}[ -]?\d{4})(?!\d)"
)

# Cue words, as data: (needles, pattern over the lower-cased text, kind, strong). A strong cue's
# value may be a plain word ("my password is sunshine"); after a weak one (short or ambiguous
# words such as "pw", "PIN", "clave") the value must look like a code: a digit, a symbol with
# letters, or mixed case.
_PASSWORD_CUES: tuple[tuple[tuple[str, ...], str, SecretKind, bool], ...] = (
    (
        ("pass", "kennwort", "contrase"),
        r"pass(?:word|phrase|code)s?|passwd|kennwort|passwort|mot de passe|contrase[ñn]a",
        "password",
        True,
    ),
    (("密码", "口令", "密碼"), r"密码|口令|密碼", "password", True),
    (("pw", "mdp", "clave", "senha"), r"pwd?|mdp|clave|senha", "password", False),
    (
        ("pin", "geheimzahl", "code", "digicode"),
        r"pin(?:[ -]?(?:code|number|nummer))?|geheimzahl|access code|door code|gate code|alarm code|türcode|digicode",
        "pin",
        False,
    ),
    (("门禁",), r"门禁密码", "pin", False),
    (
        ("cvv", "cvc", "cid", "security code", "prüfziffer", "cryptogramme", "seguridad", "安全码"),
        r"cvv2?|cvc2?|cid|card security code|security code|prüfziffer|cryptogramme|código de seguridad|安全码",
        "card_code",
        False,
    ),
)
_ONE_TIME_NEEDLES = ("code", "otp", "pass", "pin", "码", "碼", "código")
_ONE_TIME_CUE = re.compile(
    r"one[- ]time (?:pass(?:word|code)|code|pin)|otp|2fa code|mfa code|two[- ]factor (?:auth(?:entication)? )?code"
    r"|verification code|verify code|log-?in code|sign[- ]?in code|auth(?:entication|orization)? code|sms code"
    r"|reset code|security code sent|bestätigungs-?code|verifizierungscode|einmalcode|einmalpasswort|sicherheitscode"
    r"|code de vérification|code à usage unique|código de verificación|código de un solo uso"
    r"|验证码|校验码|动态码|动态密码|短信码|一次性密码|驗證碼"
)
# German banks' transaction number: only as the capitalised abbreviation ("tan" is a colour).
_TAN = re.compile(r"(?<![A-Za-z])TAN(?![A-Za-z])")
# "your code is 482913": a bare "code" counts as a one-time code unless a word before it names
# another kind of code (zip, promo, booking, error ...).
_BARE_CODE = re.compile(r"\b(?:your|the|my|this)[^\S\n]+(?:([a-z-]+)[^\S\n]+)?code\b")
_NOT_ONE_TIME = frozenset(
    """
    zip postal post area country error status promo promotional discount coupon gift confirmation booking
    reservation reference product source qr airport tracking voucher referral invite invitation dress
    postcode colour color fare class bar sort swift bic iata tax door gate alarm access security pin
    """.split()  # noqa: SIM905 (a word list, not a sentence)
)
# The code first, as text messages put it ("G-482913 is your Google verification code").
_CODE_FIRST = re.compile(r"(?<![\w-])(?:g-)?(\d(?:[ -]?\d){3,7}) is your\b[^\n.]{0,40}?\b(?:code|otp|pin|passcode)\b")
_TOKEN_NEEDLES = ("key", "token", "secret", "jeton", "clé", "clave", "schlüssel", "密钥", "秘钥", "令牌")
_TOKEN_CUES: tuple[tuple[str, SecretKind], ...] = (
    (
        r"api[ _-]?keys?|access[ _-]?keys?|secret[ _-]?keys?|keys?|apikey|clé(?: d'api| api)?|clave(?: de api| api)?|schlüssel",
        "api_key",
    ),
    (
        r"(?:auth|access|refresh|session|bot|personal access)[ _-]?tokens?|tokens?|client[ _-]?secrets?|secrets?|jeton",
        "token",
    ),
    (r"密钥|秘钥|令牌", "api_key"),
)
_PASSWORD_CUE_RES = tuple((needles, re.compile(p), kind, strong) for needles, p, kind, strong in _PASSWORD_CUES)
_TOKEN_CUE_RES = tuple((re.compile(p), kind) for p, kind in _TOKEN_CUES)

# What joins a cue to its value: a colon or equals sign, or a copula ("is", "ist", "est", "es", "是").
_CONNECTOR = re.compile(
    r"[:：=]|(?<![\w])(?:is|was|ist|lautet|war|est|était|es|era|to)(?![\w])"
    r"(?:[^\S\n]+(?:now|still|actually|jetzt|maintenant|ahora))?|是|为|為|改成了?|改为|换成了?|设置为|设为",
    re.IGNORECASE,
)
# Between a cue and its connector: at most a few words ("my password for the VPN is …"), or the
# closing quote of a JSON or YAML key ("password": "…").
_FEW_WORDS = re.compile(r"[\"']?(?:[^\S\n]*[\w'’-]+){0,4}[^\S\n]*")
_QUOTED = re.compile(r"[^\S\n]*([\"“'‘«「])([^\"”'’»」\n]{1,64})[\"”'’»」]")
_UNQUOTED = re.compile(r"[^\S\n]*([^\s\"“”‘’«»「」，。；！？、]+)")
_BARE_DIGITS = re.compile(r"[^\S\n]*#?[^\S\n]*(\d{3,8})(?![\w-])")
_OTP_VALUE = re.compile(
    r"[^\S\n]*(?:[:：=#-]|is|was|是|为)?[^\S\n]*((?:[A-Z]-)?\d(?:[ -]?\d){3,7})(?![\w-])", re.IGNORECASE
)
_CJK = re.compile(r"[\u3000-\u9fff\uac00-\ud7af\uff00-\uffef]")
_CHANGE_VERB = re.compile(r"\b(?:chang|set|reset|updat|switch)\w*\b", re.IGNORECASE)
# Words that follow "password is" without being one ("my password is not working").
_NOT_A_VALUE = frozenset(
    """
    not no none nothing too very so quite really wrong incorrect invalid expired weak strong correct right fine ok okay
    the a an my your his her our their its same still being now also just different required needed missing saved
    stored case long short secure insecure safe unsafe reset changed locked blocked empty blank what where which that
    this it on in at for of and or but if when because please see use enter type click here below above there
    working broken lost forgotten stolen compromised known shared set new old easy hard simple complicated
    nicht kein falsch zu sehr abgelaufen korrekt richtig der die das mein meine ein eine noch jetzt hier
    pas trop faux incorrect expiré le la les mon ma mes un une encore ici oublié
    muy demasiado incorrecta incorrecto el mi mis una uno todavía aquí olvidé olvidada
    """.split()  # noqa: SIM905 (a word list, not a sentence)
)
_ENTROPY_RUN = re.compile(r"(?<![A-Za-z0-9+/_.=-])[A-Za-z0-9+/_.-]{16,}={0,2}")
_HEX = re.compile(r"[0-9a-fA-F]{20,}")
_TRAILING = ".,;:"
# How far after a cue its value may start (characters).
_CUE_WINDOW = 48
_ASCII_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyz")


def secret_spans(text: str) -> list[SecretSpan]:
    """The credentials in ``text``: non-overlapping spans ordered by ``start`` (character
    offsets). Shapes are tried before cue words, and an earlier detector wins an overlap; a
    marker already in the text (``[password withheld]``) is never a secret. Never raises."""
    lower = text.lower()
    if len(lower) != len(text):  # a few characters lower-case to two ("İ"): keep offsets aligned
        lower = "".join(char if len(char.lower()) != 1 else char.lower() for char in text)
    taken: list[SecretSpan] = [SecretSpan(m.start(), m.end(), "password") for m in _MARKER.finditer(text)]
    markers = len(taken)
    for detector in _DETECTORS:
        for span in detector(text, lower):
            if span.end > span.start and not any(span.start < t.end and t.start < span.end for t in taken):
                taken.append(span)
    return sorted(taken[markers:], key=lambda span: span.start)


def redact_secrets(text: str) -> str:
    """``text`` with each credential replaced by the marker of its kind (:data:`MARKERS`, e.g.
    ``[password withheld]``). Repeats until nothing is found, so the result holds no detected
    secret (removing one may expose a shape the first pass could not see); a text without
    secrets comes back unchanged. Never raises."""
    spans = secret_spans(text)
    while spans:
        parts: list[str] = []
        position = 0
        for span in spans:
            parts += [text[position : span.start], MARKERS[span.kind]]
            position = span.end
        text = "".join([*parts, text[position:]])
        spans = secret_spans(text)
    return text


# Known credentials shorter than this (characters) are not redacted by value: a 3-digit code would hit ordinary numbers.
MIN_ECHO_CHARS = 4


def secret_values(texts: Iterable[str]) -> dict[str, SecretKind]:
    """Each credential in ``texts`` as written, with its kind: what a model given these texts could echo."""
    found: dict[str, SecretKind] = {}
    for text in texts:
        for span in secret_spans(text):
            found.setdefault(text[span.start : span.end], span.kind)
    return found


def redact_values(text: str, values: Mapping[str, SecretKind]) -> str:
    """``text`` with every whole-word occurrence of a known credential (``values``, at least
    :data:`MIN_ECHO_CHARS` long) replaced by its marker, then :func:`redact_secrets`: a model's
    output holds no secret of its input, even one echoed without its cue word. Never raises."""
    for value in sorted((v for v in values if len(v) >= MIN_ECHO_CHARS), key=len, reverse=True):
        if value in text:
            # Not a part of a longer value: a PIN 2024 leaves the date 2024-05-01 alone.
            pattern = re.compile(rf"(?<![A-Za-z0-9])(?<!\d[-/.:,]){re.escape(value)}(?![A-Za-z0-9]|[-/.:,]\d)")
            text = pattern.sub(MARKERS[values[value]], text)
    return redact_secrets(text)


def _bounded(lower: str, match: re.Match[str]) -> bool:
    """The cue is a whole word: no ASCII letter right before or after it."""
    start, end = match.span()
    return (start == 0 or lower[start - 1] not in _ASCII_LETTERS) and (
        end == len(lower) or lower[end] not in _ASCII_LETTERS
    )


# --- detectors, in priority order; each takes the text and its lower-cased copy -------------


def _private_keys(text: str, lower: str) -> Iterator[SecretSpan]:
    if "PRIVATE KEY" in text:
        for match in _PRIVATE_KEY.finditer(text):
            yield SecretSpan(match.start(), match.end(), "private_key")


def _shapes(text: str, lower: str) -> Iterator[SecretSpan]:
    if any(needle in text for needle in _KEY_SHAPE_NEEDLES):
        for match in _KEY_SHAPES.finditer(text):
            yield SecretSpan(match.start(), match.end(), "api_key")
    if "eyJ" in text:
        for match in _JWT.finditer(text):
            if match.start() == 0 or not (text[match.start() - 1].isalnum() or text[match.start() - 1] in "_-"):
                yield SecretSpan(match.start(), match.end(), "token")
    if "bearer" in lower:
        for match in _BEARER.finditer(lower):
            yield SecretSpan(match.start(1), match.end(1), "token")
    if "://" in text:
        for match in _URL_CREDENTIALS.finditer(text):
            yield SecretSpan(match.start(1), match.end(1), "password")


def _ibans(text: str, lower: str) -> Iterator[SecretSpan]:
    if _digit_count(text) < 13:
        return
    for match in _IBAN.finditer(text):
        candidate = match.group()
        # A trailing capitalised word may have been taken as a last group: drop groups until valid.
        while len(candidate.replace(" ", "")) >= 15:
            if _iban_valid(candidate.replace(" ", "")):
                yield SecretSpan(match.start(), match.start() + len(candidate), "iban")
                break
            if " " not in candidate:
                break
            candidate = candidate[: candidate.rindex(" ")]


def _iban_valid(compact: str) -> bool:
    """ISO 13616: move the first four characters to the end, letters to numbers, mod 97 is 1."""
    if not 15 <= len(compact) <= 34:
        return False
    digits = "".join(str(int(char, 36)) for char in compact[4:] + compact[:4])
    return int(digits) % 97 == 1


def _digit_count(text: str) -> int:
    return sum(map(text.count, "0123456789"))


def _digit_runs(text: str, lower: str) -> Iterator[SecretSpan]:
    """Card numbers and social security numbers, looked for only where digits cluster."""
    if _digit_count(text) < 9:
        return
    for cluster in _DIGIT_CLUSTER.finditer(text):
        # The patterns' look-arounds see past the cluster: search the text within its bounds.
        start, end = cluster.span()
        for match in _CARD.finditer(text, start, min(len(text), end + 2)):
            if match.end() <= end and _card_number(text, match):
                yield SecretSpan(match.start(), match.end(), "card_number")
        for match in _SSN.finditer(text, start, min(len(text), end + 2)):
            area, group, serial = match.groups()
            if (
                match.end() <= end
                and area not in ("000", "666")
                and area[0] != "9"
                and group != "00"
                and serial != "0000"
            ):
                yield SecretSpan(match.start(), match.end(), "ssn")


def _card_number(text: str, match: re.Match[str]) -> bool:
    digits = re.sub(r"\D", "", match.group())
    if digits[0] not in "23456" or not _luhn_valid(digits) or _looks_like_timestamp(digits):
        return False
    if _CARD_GROUPS.fullmatch(match.group()):
        return True
    before = re.split(r"[.;!?\n。；！？]", text[max(0, match.start() - 40) : match.start()])[-1]
    card = list(_CARD_CUE.finditer(before))
    # A reference word counts only where it labels this number ("order number 4000…", "tracking: …").
    labels = [cue for cue in _NOT_CARD_CUE.finditer(before) if _LABEL.fullmatch(before[cue.end() :])]
    return not labels or bool(card and card[-1].start() > labels[-1].start())


def _luhn_valid(digits: str) -> bool:
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = int(char) * (2 if position % 2 else 1)
        total += value - 9 if value > 9 else value
    return total % 10 == 0


def _looks_like_timestamp(digits: str) -> bool:
    return len(digits) == 14 and digits[:2] in ("19", "20") and 1 <= int(digits[4:6]) <= 12


def _ssn_cued(text: str, lower: str) -> Iterator[SecretSpan]:
    if any(needle in lower for needle in ("ssn", "social", "sozialversicherung")):
        for match in _SSN_CUE.finditer(lower):
            if match.start() == 0 or lower[match.start() - 1] not in _ASCII_LETTERS:
                yield SecretSpan(match.start(1), match.end(1), "ssn")


def _one_time_codes(text: str, lower: str) -> Iterator[SecretSpan]:
    cues: list[int] = []
    if "TAN" in text:
        cues += [match.end() for match in _TAN.finditer(text)]
    if any(needle in lower for needle in _ONE_TIME_NEEDLES):
        for match in _CODE_FIRST.finditer(lower):
            yield SecretSpan(match.start(1), match.end(1), "one_time_code")
        cues += [match.end() for match in _ONE_TIME_CUE.finditer(lower) if _bounded(lower, match)]
        if "code" in lower:
            cues += [m.end() for m in _BARE_CODE.finditer(lower) if (m.group(1) or "") not in _NOT_ONE_TIME]
    for end in cues:
        window = text[end : end + _CUE_WINDOW].split("\n", 1)[0]
        # A few words may sit between cue and code ("your verification code for Acme is 482913").
        for value in _OTP_VALUE.finditer(window):
            if _FEW_WORDS.fullmatch(window[: value.start()]):
                yield SecretSpan(end + value.start(1), end + value.end(1), "one_time_code")
                break


def _passwords(text: str, lower: str) -> Iterator[SecretSpan]:
    for needles, cue, kind, strong in _PASSWORD_CUE_RES:
        if not any(needle in lower for needle in needles):
            continue
        for match in cue.finditer(lower):
            if not _bounded(lower, match):
                continue
            window = text[match.end() : match.end() + _CUE_WINDOW].split("\n", 1)[0]
            # A PIN or card code may follow its cue directly ("CVV 123", "PIN 4821").
            digits = _BARE_DIGITS.match(window) if kind in ("pin", "card_code") else None
            if digits:
                yield SecretSpan(match.end() + digits.start(1), match.end() + digits.end(1), kind)
                continue
            for connector in _CONNECTOR.finditer(window):
                if not _FEW_WORDS.fullmatch(window[: connector.start()]):
                    break
                if connector.group().lower() == "to" and not _CHANGE_VERB.search(
                    text[max(0, match.start() - 40) : match.start()]
                ):
                    continue
                found = _value(window, connector.end(), kind=kind, strong=strong)
                if found is not None:
                    start, end = found
                    yield SecretSpan(match.end() + start, match.end() + end, kind)
                    break


def _value(window: str, position: int, *, kind: SecretKind, strong: bool) -> tuple[int, int] | None:
    """Where the value after a connector is in ``window`` (offsets), or None when what follows
    is not a credential ("my password is not working")."""
    quoted = _QUOTED.match(window, position)
    if quoted:
        return quoted.start(2), quoted.end(2)
    unquoted = _UNQUOTED.match(window, position)
    if not unquoted:
        return None
    value = unquoted.group(1).rstrip(_TRAILING)
    if not value or _CJK.search(value) or value.lower() in _NOT_A_VALUE:
        return None
    looks_like_code = (
        any(char.isdigit() for char in value)
        or (any(not char.isalnum() for char in value) and any(char.isalpha() for char in value))
        or (value[1:] != value[1:].lower())
    )
    if kind in ("pin", "card_code") and not any(char.isdigit() for char in value):
        return None
    # A plain word after a strong cue is taken, unless it reads as a description ("expiring").
    if not looks_like_code and (not strong or len(value) < 3 or value.lower().endswith(("ing", "ed", "ly"))):
        return None
    return unquoted.start(1), unquoted.start(1) + len(value)


def _cued_tokens(text: str, lower: str) -> Iterator[SecretSpan]:
    if not any(needle in lower for needle in _TOKEN_NEEDLES):
        return
    for cue, kind in _TOKEN_CUE_RES:
        for match in cue.finditer(lower):
            if not _bounded(lower, match):
                continue
            window = text[match.end() : match.end() + _CUE_WINDOW].split("\n", 1)[0]
            for run in _ENTROPY_RUN.finditer(window):
                between = window[: run.start()]
                if not re.fullmatch(r"[\w\s'’\":：=-]*", between) or len(between.split()) > 4:
                    break
                value = run.group().rstrip(_TRAILING)
                if _high_entropy(value):
                    yield SecretSpan(match.end() + run.start(), match.end() + run.start() + len(value), kind)
                    break


def _high_entropy(value: str) -> bool:
    """A random-looking run: letters and digits, mixed case or long hex or long, and at least
    3 bits of entropy per character (identifiers such as ``ABC1234567890DEF`` fall short)."""
    if len(value) < 16 or "@" in value:
        return False
    has_digit = any(char.isdigit() for char in value)
    has_alpha = any(char.isalpha() for char in value)
    mixed_case = value != value.lower() and value != value.upper()
    if not (has_digit and has_alpha) or not (mixed_case or _HEX.fullmatch(value) or len(value) >= 24):
        return False
    counts = Counter(value)
    entropy = -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())
    return entropy >= 3.0


_DETECTORS: tuple[Callable[[str, str], Iterator[SecretSpan]], ...] = (
    _private_keys,
    _shapes,
    _ibans,
    _digit_runs,
    _ssn_cued,
    _one_time_codes,
    _passwords,
    _cued_tokens,
)
