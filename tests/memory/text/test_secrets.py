"""The credential detector: what it withholds, in several languages and formats, and the
ordinary identifiers it must leave alone (docs/memory.md F-51)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory.text.secrets import (
    API_KEY_MARKER,
    CARD_CODE_MARKER,
    CARD_NUMBER_MARKER,
    IBAN_MARKER,
    MARKERS,
    ONE_TIME_CODE_MARKER,
    PASSWORD_MARKER,
    PIN_MARKER,
    PRIVATE_KEY_MARKER,
    SSN_MARKER,
    TOKEN_MARKER,
    SecretSpan,
    redact_secrets,
    redact_values,
    secret_spans,
    secret_values,
)

# (text, the secret as it appears in the text, its kind)
FOUND = [
    # passwords after a cue word, in five languages
    ("my password is hunter2", "hunter2", "password"),
    ("My password is now Blue-Falcon-88, please remember it.", "Blue-Falcon-88", "password"),
    ("my wifi password is sunshine", "sunshine", "password"),
    ("pw: Tr0ub4dor&3", "Tr0ub4dor&3", "password"),
    ("PWD=qwerty2024", "qwerty2024", "password"),
    ("The password for the staging box was Xy7#kL2p.", "Xy7#kL2p", "password"),
    ("I changed my password to Blue42! yesterday", "Blue42!", "password"),
    ("passcode: 9911", "9911", "password"),
    ("my password is 'correct horse battery staple'", "correct horse battery staple", "password"),
    ("密码是abc123，记住了吗", "abc123", "password"),
    ("我的登录密码：Qw3rty!", "Qw3rty!", "password"),
    ("密码改成了 zx81spectrum", "zx81spectrum", "password"),
    ("Mein Passwort ist Sommer2026", "Sommer2026", "password"),
    ("Passwort: geheim99", "geheim99", "password"),
    ("Kennwort lautet Tannenbaum7", "Tannenbaum7", "password"),
    ("mot de passe : soleil2024", "soleil2024", "password"),
    ("Mon mot de passe est Chaton!77", "Chaton!77", "password"),
    ("contraseña: gato123", "gato123", "password"),
    ("Mi contraseña es Luna2025", "Luna2025", "password"),
    ("DB_PASSWORD=s3cr3t-value", "s3cr3t-value", "password"),
    ("connect to postgres://admin:Pa55word@db.example.com/app", "Pa55word", "password"),
    # PINs and card security codes
    ("my PIN is 4821", "4821", "pin"),
    ("PIN: 0007", "0007", "pin"),
    ("PIN码是 6655", "6655", "pin"),
    ("Meine PIN ist 1357", "1357", "pin"),
    ("the door code is 2580#", "2580#", "pin"),
    ("CVV 123", "123", "card_code"),
    ("the security code is 9042", "9042", "card_code"),
    # API keys and tokens by shape
    ("key sk-proj-abcdefghijklmnopqrstuvwxyz123456", "sk-proj-abcdefghijklmnopqrstuvwxyz123456", "api_key"),
    ("use sk_live_51HxAbCdEfGhIjKlMn please", "sk_live_51HxAbCdEfGhIjKlMn", "api_key"),
    (
        "ghp_1234567890abcdefghijklmnopqrstuvwxyzAB is my GitHub token",
        "ghp_1234567890abcdefghijklmnopqrstuvwxyzAB",
        "api_key",
    ),
    ("slack: xoxb-123456789012-abcdefghijkl", "xoxb-123456789012-abcdefghijkl", "api_key"),
    ("aws AKIAIOSFODNN7EXAMPLE region eu-west-1", "AKIAIOSFODNN7EXAMPLE", "api_key"),
    ("maps key AIzaSyA1234567890abcdefghijklmnopqrstuv", "AIzaSyA1234567890abcdefghijklmnopqrstuv", "api_key"),
    (
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "token",
    ),
    ("Authorization: Bearer abcDEF123456ghiJKL789", "abcDEF123456ghiJKL789", "token"),
    ("my token: 3f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c", "3f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c", "token"),
    ("the api key is Zx8qLm3NvB7tR2wY9pKd", "Zx8qLm3NvB7tR2wY9pKd", "api_key"),
    ("client secret = q8Rt2LmZx9Vb4NpW7sKd1Fh", "q8Rt2LmZx9Vb4NpW7sKd1Fh", "token"),
    ("密钥：Zx8qLm3NvB7tR2wY9pKd", "Zx8qLm3NvB7tR2wY9pKd", "api_key"),
    # one-time codes
    ("your code is 482913", "482913", "one_time_code"),
    ("OTP 4829", "4829", "one_time_code"),
    ("验证码 482913", "482913", "one_time_code"),
    ("验证码是482913，五分钟内有效", "482913", "one_time_code"),
    ("Your verification code for Acme is 482 913.", "482 913", "one_time_code"),
    ("G-482913 is your Google verification code", "482913", "one_time_code"),
    ("Ihr Bestätigungscode: 774411", "774411", "one_time_code"),
    ("Votre code de vérification est 551234", "551234", "one_time_code"),
    ("Tu código de verificación es 908172", "908172", "one_time_code"),
    ("Ihre TAN lautet 123456", "123456", "one_time_code"),
    # card numbers, IBANs, SSNs
    ("card 4111 1111 1111 1111 exp 12/28", "4111 1111 1111 1111", "card_number"),
    ("pay with 5500-0000-0000-0004 please", "5500-0000-0000-0004", "card_number"),
    ("Amex 378282246310005", "378282246310005", "card_number"),
    ("I paid for order #W5520147 with 4111 1111 1111 1111 twice", "4111 1111 1111 1111", "card_number"),
    ("order number 4000-1234-1234-1234? no, that's my card", "4000-1234-1234-1234", "card_number"),
    ("卡号 6011111111111117", "6011111111111117", "card_number"),
    ("IBAN DE89 3704 0044 0532 0130 00 THANKS", "DE89 3704 0044 0532 0130 00", "iban"),
    ("virement sur FR1420041010050500013M02606", "FR1420041010050500013M02606", "iban"),
    ("GB82WEST12345698765432 is my account", "GB82WEST12345698765432", "iban"),
    ("ssn 123-45-6789", "123-45-6789", "ssn"),
    ("my social security number is 123 45 6789", "123 45 6789", "ssn"),
    ("It's 078-05-1120 on the form", "078-05-1120", "ssn"),
]

PRIVATE_KEY = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmU=\nAAAA\n-----END OPENSSH PRIVATE KEY-----"
)

# Ordinary text that holds no credential.
NOT_SECRETS = [
    "my order is #W2378156",
    "booking reference ZFA04Y, and the other one is KX-55190",
    "my user id is mia_li_3668",
    "订单号是A-48213",
    "flight UA 1234 leaves at 15:40 from gate B22",
    "call me on +44 7700 900123 or (415) 555-0134",
    "+86 138 0013 8000",
    "on 2026-11-22 at 10:30, or 11/23/2026",
    "it cost $1,249.99 or 1.249,99 €",
    "zip code 94110, postal code SW1A 1AA",
    "The zip code is 94110",
    "tracking number 1Z999AA10123456784",
    "tracking 9400 1000 0000 0000 0000 00",
    "my FedEx tracking number is 449044304137821",
    "order number 4000123412341234",
    "card ending in 4421",
    "my visa ending 7447",
    "the promo code is 482913",
    "error code 4040 again",
    "the confirmation code is 582019",
    "my password is not working",
    "the password is wrong",
    "my password is expiring next week",
    "I forgot my password",
    "please reset the password",
    "I sent the password to Tom",
    "the key is patience",
    "la clave es paciencia",
    "密码是什么？",
    "pin the message to the top",
    "the keys are on the table",
    "my license key ABCDEF1234567890 came by mail",
    "timestamp 20261122120001 in the log",
    "2026-11-02 12:00:01 ERROR worker 3 failed",
    "I'm saving 1200 a month",
    "room 1204, floor 12",
    "the tan leather jacket",
    "I got the token of appreciation",
    "Your table for 4 is at 7pm",
]


@pytest.mark.parametrize(("text", "secret", "kind"), FOUND)
def test_finds_the_secret(text, secret, kind):
    spans = secret_spans(text)
    assert [(text[s.start : s.end], s.kind) for s in spans] == [(secret, kind)]


@pytest.mark.parametrize(("text", "secret", "kind"), FOUND)
def test_redaction_withholds_it_with_the_marker_of_its_kind(text, secret, kind):
    redacted = redact_secrets(text)
    assert secret not in redacted
    assert MARKERS[kind] in redacted
    assert redacted == text.replace(secret, MARKERS[kind], 1)


@pytest.mark.parametrize("text", NOT_SECRETS)
def test_ordinary_text_is_left_alone(text):
    assert secret_spans(text) == []
    assert redact_secrets(text) == text


def test_private_key_block_is_withheld_whole():
    text = f"here is my key:\n{PRIVATE_KEY}\nthanks"
    assert redact_secrets(text) == f"here is my key:\n{PRIVATE_KEY_MARKER}\nthanks"


def test_a_cut_off_private_key_is_withheld_to_the_end():
    text = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA7"
    assert secret_spans(text) == [SecretSpan(0, len(text), "private_key")]


def test_several_secrets_in_one_message_keep_the_words_between():
    text = "user mia_li_3668, pw: Tr0ub4dor&3, card 4111 1111 1111 1111, code is 4829. Order #W2378156."
    assert redact_secrets(text) == (
        f"user mia_li_3668, pw: {PASSWORD_MARKER}, card {CARD_NUMBER_MARKER}, code is 4829. Order #W2378156."
    )


def test_card_tail_beside_a_pin_keeps_the_tail():
    text = "card ending in 4421, and the PIN is 7788"
    assert redact_secrets(text) == f"card ending in 4421, and the PIN is {PIN_MARKER}"


def test_a_card_word_closer_than_a_reference_word_wins():
    assert redact_secrets("order paid by card 4111111111111111") == f"order paid by card {CARD_NUMBER_MARKER}"


def test_failed_checksums_are_not_secrets():
    assert secret_spans("4111 1111 1111 1112") == []  # Luhn fails
    assert secret_spans("DE89 3704 0044 0532 0130 01") == []  # mod 97 fails
    assert secret_spans("000-12-3456 and 666-12-3456") == []  # never issued


def test_markers_are_distinct_and_visible():
    assert len(set(MARKERS.values())) == len(MARKERS)
    for marker in (
        API_KEY_MARKER,
        CARD_CODE_MARKER,
        IBAN_MARKER,
        ONE_TIME_CODE_MARKER,
        SSN_MARKER,
        TOKEN_MARKER,
    ):
        assert marker.startswith("[") and marker.endswith(" withheld]")


def test_a_marker_is_not_a_secret():
    for marker in MARKERS.values():
        text = f"my password is {marker}, pw: {marker}, token {marker}"
        assert secret_spans(text) == []


# --- properties ------------------------------------------------------------------------------

_FRAGMENTS = st.sampled_from(
    [
        *(text for text, _, _ in FOUND),
        *NOT_SECRETS,
        PRIVATE_KEY,
        "my password is",
        "pw:",
        "密码是",
        "code",
        "OTP",
        "token",
        "4111",
        "1111",
        "-",
        ":",
        "'",
        "[",
        "withheld]",
        "\n",
        " ",
        ".",
        *MARKERS.values(),
    ]
)
_TEXTS = st.lists(st.one_of(_FRAGMENTS, st.text(max_size=12)), max_size=8).map(" ".join)


@settings(max_examples=300, deadline=None)
@given(_TEXTS)
def test_redaction_is_idempotent_and_leaves_nothing_detectable(text):
    redacted = redact_secrets(text)
    assert secret_spans(redacted) == []
    assert redact_secrets(redacted) == redacted


@settings(max_examples=300, deadline=None)
@given(_TEXTS)
def test_a_text_without_secrets_is_unchanged(text):
    if not secret_spans(text):
        assert redact_secrets(text) == text


@settings(max_examples=300, deadline=None)
@given(_TEXTS)
def test_spans_are_ordered_and_disjoint_and_outside_the_marker(text):
    spans = secret_spans(text)
    for span in spans:
        assert 0 <= span.start < span.end <= len(text)
        assert "withheld]" not in text[span.start : span.end]
    assert all(a.end <= b.start for a, b in itertools.pairwise(spans))


def test_f51_a_credential_under_a_json_key_is_found():
    assert (
        redact_secrets('{"user": "bob", "password": "hunter2x"}')
        == '{"user": "bob", "password": "[password withheld]"}'
    )
    assert redact_secrets('{"api_key": "abcDEF1234567890xyzQ"}') == '{"api_key": "[api key withheld]"}'


def test_f51_a_known_credential_echoed_without_its_cue_is_redacted_by_value():
    values = secret_values(["my password is Blue-Falcon-88", "PIN: 482"])
    assert values == {"Blue-Falcon-88": "password", "482": "pin"}
    echoed = "Remember Blue-Falcon-88; not Blue-Falcon-889; room 482."
    assert redact_values(echoed, values) == "Remember [password withheld]; not Blue-Falcon-889; room 482."
    pin = secret_values(["my PIN is 2024"])
    assert redact_values("PIN 2024 noted; flight on 2024-05-01, 12.2024", pin) == (
        "PIN [PIN withheld] noted; flight on 2024-05-01, 12.2024"
    )
