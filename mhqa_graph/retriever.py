"""A LangChain retriever over a store corpus."""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever

from .store.base import KnowledgeStore
from .types import SearchMode


class StoreRetriever(BaseRetriever):
    """Returns `Document`s with `metadata = {id, title, score, corpus}`."""

    store: Any  # a KnowledgeStore; Any keeps pydantic from validating the class
    corpus: str
    k: int = 5
    mode: SearchMode = "hybrid"

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        store: KnowledgeStore = self.store
        return [
            Document(page_content=h.text,
                     metadata={"id": h.id, "title": h.title, "score": h.score, "corpus": self.corpus})
            for h in store.search(self.corpus, query, k=self.k, mode=self.mode)
        ]
