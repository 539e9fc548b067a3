"""Search tools for an agent: `search` and `open_page`, ready to wrap as AgentScope tools.

One `SearchTools` per episode: it shares the (read-only) index and records what the agent did
(`queries`, `opened`), which a workflow can use for metrics or reward shaping.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from environments.search.index import SearchIndex

if TYPE_CHECKING:
    from agentscope.tool import FunctionTool


class SearchTools:
    """The agent-facing search tools over one index.

    Args:
        index: The search index (shared by all episodes).
        max_results: Upper bound on `k` in `search`.
        max_page_chars: Pages longer than this are cut (the cut is marked).

    Example:
        >>> from environments.search.corpus import Document
        >>> import asyncio
        >>> tools = SearchTools(SearchIndex.build([Document("d1", "Kestrow", "A city.")]))
        >>> print(asyncio.run(tools.search("Kestrow")))
        [1] Kestrow (id: d1)
            A city.
    """

    def __init__(self, index: SearchIndex, max_results: int = 10, max_page_chars: int = 4000):
        self.index = index
        self.max_results = max_results
        self.max_page_chars = max_page_chars
        self.queries: list[str] = []
        self.opened: list[str] = []

    async def search(self, query: str, k: int = 5) -> str:
        """Search the encyclopedia and list the best matching pages with a short snippet each.

        Use names and keywords (for example a person's full name, or a city name with the word
        "capital"). Open a page with `open_page` to read all of it.

        Args:
            query: Keywords to search for.
            k: How many results to return (1 to 10).
        """
        self.queries.append(query)
        k = max(1, min(int(k), self.max_results))
        hits = self.index.search(query, k)
        if not hits:
            return f"No results for {query!r}. Try other keywords."
        return "\n".join(
            f"[{rank}] {hit.title} (id: {hit.doc_id})\n    {hit.snippet}"
            for rank, hit in enumerate(hits, start=1)
        )

    async def open_page(self, doc_id: str) -> str:
        """Open an encyclopedia page by the id shown in search results and return its full text.

        Args:
            doc_id: The page id from a search result, for example "d000123".
        """
        document = self.index.open(doc_id.strip())
        if document is None:
            return f"No page with id {doc_id!r}. Use an id from the search results."
        self.opened.append(document.id)
        text = document.text
        if len(text) > self.max_page_chars:
            text = text[: self.max_page_chars] + "\n[... page truncated]"
        return f"# {document.title} (id: {document.id})\n\n{text}"

    def function_tools(self) -> list[FunctionTool]:
        """Both tools as AgentScope `FunctionTool`s, allowed to run without confirmation.

        Returns:
            `[search, open_page]`, for `agentscope.tool.Toolkit(tools=...)`.

        Example:
            >>> from agentscope.tool import Toolkit  # doctest: +SKIP
            >>> toolkit = Toolkit(tools=SearchTools(index).function_tools())  # doctest: +SKIP
        """
        from agentscope.permission import PermissionBehavior, PermissionDecision
        from agentscope.tool import FunctionTool

        allow = PermissionDecision(
            behavior=PermissionBehavior.ALLOW, message="Read-only search of a local corpus."
        )
        return [
            FunctionTool(self.search, permission=allow, is_read_only=True),
            FunctionTool(self.open_page, permission=allow, is_read_only=True),
        ]
