"""A local search engine over a corpus: BM25 (bm25s) with titles, snippets and page lookup.

The index is built once per corpus and cached on disk, keyed by a hash of the corpus content,
so a second process loads it instead of rebuilding. After construction a `SearchIndex` is
read-only: `search` and `open` may be called concurrently from many coroutines or threads.
"""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import bm25s
import numpy as np

from environments.paths import cache_root
from environments.search.corpus import CorpusError, Document, corpus_fingerprint, load_corpus

INDEX_FORMAT = 1
_TOKEN = re.compile(r"\w+")
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "did",
        "do",
        "does",
        "for",
        "from",
        "had",
        "has",
        "have",
        "he",
        "her",
        "his",
        "in",
        "is",
        "it",
        "its",
        "of",
        "on",
        "or",
        "she",
        "that",
        "the",
        "their",
        "them",
        "they",
        "this",
        "to",
        "was",
        "were",
        "what",
        "when",
        "where",
        "which",
        "who",
        "whom",
        "whose",
        "why",
        "with",
    ]
)


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens without English stopwords (the index and queries share it)."""
    return [token for token in _TOKEN.findall(text.lower()) if token not in _STOPWORDS]


@dataclass(frozen=True)
class SearchHit:
    """One search result.

    Attributes:
        doc_id: The page id, for `SearchIndex.open`.
        title: The page title.
        snippet: The passage of the page that best matches the query.
        score: The BM25 score (higher is better).
    """

    doc_id: str
    title: str
    snippet: str
    score: float


def snippet(text: str, query_tokens: set[str], max_chars: int = 220) -> str:
    """The sentence (or infobox line) of `text` that shares the most tokens with the query."""
    best, best_overlap = "", -1
    for sentence in _SENTENCE.split(text):
        overlap = len(query_tokens.intersection(tokenize(sentence)))
        if overlap > best_overlap and sentence.strip():
            best, best_overlap = sentence.strip(), overlap
    return best if len(best) <= max_chars else best[: max_chars - 1].rstrip() + "…"


class SearchIndex:
    """BM25 search over documents.

    Titles count twice in the ranking, and a query that is exactly a page title returns that page
    first (like an encyclopedia's "go to page").

    Build it with `SearchIndex.build(documents)` or `SearchIndex.from_jsonl(path)`.

    Example:
        >>> from environments.search.corpus import Document
        >>> index = SearchIndex.build([
        ...     Document("a", "Kestrow", "Kestrow is a city in Ombria."),
        ...     Document("b", "Ombria", "Ombria is a country. Its capital is Kestrow."),
        ... ])
        >>> index.search("capital of Ombria", k=1)[0].title
        'Ombria'
        >>> index.open("a").title
        'Kestrow'
    """

    def __init__(self, documents: Sequence[Document], retriever: bm25s.BM25) -> None:
        self._documents = list(documents)
        self._by_id = {document.id: document for document in self._documents}
        self._by_title: dict[str, int] = {}
        for position, document in enumerate(self._documents):
            self._by_title.setdefault(document.title.casefold().strip(), position)
        self._retriever = retriever
        self._vocabulary: dict[str, int] = retriever.vocab_dict

    def __len__(self) -> int:
        return len(self._documents)

    @classmethod
    def build(
        cls, documents: Sequence[Document], cache_dir: str | Path | None = None
    ) -> SearchIndex:
        """Indexes documents, or loads the index of the same documents from `cache_dir`.

        Args:
            documents: The corpus.
            cache_dir: A folder for built indexes (one subfolder per corpus hash); `None`
                builds in memory without caching.

        Returns:
            The index.

        Raises:
            CorpusError: If `documents` is empty.

        Example:
            >>> from environments.search.corpus import Document
            >>> len(SearchIndex.build([Document("a", "A", "About A.")]))
            1
        """
        if not documents:
            raise CorpusError("cannot build a search index over an empty corpus; add documents")
        if cache_dir is None:
            return cls(documents, _index(documents))
        folder = Path(cache_dir) / f"{corpus_fingerprint(documents)}-v{INDEX_FORMAT}"
        if (folder / "done.json").is_file():
            return cls(documents, bm25s.BM25.load(str(folder), show_progress=False))
        retriever = _index(documents)
        folder.parent.mkdir(parents=True, exist_ok=True)
        # Save into a scratch folder and rename, so a concurrent reader never sees half an index.
        scratch = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".building-"))
        retriever.save(str(scratch), show_progress=False)
        (scratch / "done.json").write_text(json.dumps({"documents": len(documents)}))
        # If another process finished first, its index is identical: keep it.
        with contextlib.suppress(OSError):
            scratch.rename(folder)
        return cls(documents, retriever)

    @classmethod
    def from_jsonl(cls, path: str | Path, cache_dir: str | Path | None = "default") -> SearchIndex:
        """Loads a JSONL corpus (`{"id", "title", "text"}` per line) and indexes it.

        Args:
            path: The corpus file.
            cache_dir: Where built indexes are cached; `"default"` is
                `$AGENTSCOPE_RFT_CACHE/search-index`, `None` disables caching.

        Returns:
            The index.

        Example:
            >>> index = SearchIndex.from_jsonl("corpus.jsonl")  # doctest: +SKIP
        """
        if cache_dir == "default":
            cache_dir = cache_root() / "search-index"
        try:
            return cls.build(load_corpus(path), cache_dir)
        except CorpusError as error:
            message = str(error)
            if message.startswith(str(path)):
                raise
            raise CorpusError(f"{path}: {message}") from None

    def search(self, query: str, k: int = 5) -> list[SearchHit]:
        """The best `k` pages for a keyword query (fewer if fewer pages match any word).

        Args:
            query: Free text; case and stopwords are ignored.
            k: Maximum number of hits.

        Returns:
            Hits, best first.
        """
        query_tokens = [token for token in tokenize(query) if token in self._vocabulary]
        if not query_tokens or k < 1:
            return []
        # [num_documents] BM25 scores; top-k over the matching pages only (numpy's argpartition
        # over the whole, mostly-zero array is slow on 100k pages).
        scores = self._retriever.get_scores(query_tokens)
        matching = np.flatnonzero(scores > 0)
        if len(matching) > k:
            matching = matching[np.argpartition(-scores[matching], k - 1)[:k]]
        best = matching[np.argsort(-scores[matching], kind="stable")]
        ranked = [(int(position), float(scores[position])) for position in best]
        exact = self._by_title.get(query.casefold().strip())
        if exact is not None:
            top_score = ranked[0][1] if ranked else 1.0
            others = [hit for hit in ranked if hit[0] != exact]
            ranked = [(exact, top_score), *others[: k - 1]]
        wanted = set(query_tokens)
        return [
            SearchHit(
                self._documents[position].id,
                self._documents[position].title,
                snippet(self._documents[position].text, wanted),
                score,
            )
            for position, score in ranked
        ]

    def open(self, doc_id: str) -> Document | None:
        """The document with id `doc_id`, or None if there is none."""
        return self._by_id.get(doc_id)


def _index(documents: Sequence[Document]) -> bm25s.BM25:
    retriever = bm25s.BM25()
    corpus_tokens = [
        tokenize(f"{document.title}\n{document.title}\n{document.text}") for document in documents
    ]
    if not any(corpus_tokens):
        raise CorpusError(
            "cannot build a search index: no document contains a word (stopwords and "
            "punctuation are not indexed); add documents with text"
        )
    retriever.index(corpus_tokens, show_progress=False)
    return retriever
