"""`retrieval_search`: queries a retrieval service over HTTP (the Search-R1 protocol verl's search tool speaks).

The service is the user's (a local index server, e.g. Search-R1's `retrieval_server.py`): rlkit POSTs
`{"queries": [...], "topk": k, "return_scores": true}` to `url` and reads `{"result": [[{"document":
{"contents": "Title\\nText"}, "score": s}, ...], ...]}`, one list per query. The model sees the passages per
query, numbered, title first. A service that fails or times out gives the model an error result (the rollout
goes on); nothing the service returns is scored.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from rlkit.rollout.agent.tools import TOOLS, Tool, ToolResult


def passages_text(results: list[dict[str, Any]]) -> str:
    """One query's passages as the model reads them: `Doc i (Title: t)` then the text."""
    blocks = []
    for i, item in enumerate(results, 1):
        doc = item.get("document", item) if isinstance(item, dict) else {"contents": str(item)}
        title, _, body = str(doc.get("contents", "")).partition("\n")
        blocks.append(f"Doc {i} (Title: {title.strip()})\n{body.strip()}")
    return "\n\n".join(blocks)


@TOOLS.register("retrieval_search")
class RetrievalSearch(Tool):
    """Search a retrieval service for each query of `query_list` (verl's SearchTool maps here)."""

    name = "search"
    description = "Search for passages relevant to each query; returns the top passages per query."
    parameters = {
        "type": "object",
        "properties": {"query_list": {"type": "array", "items": {"type": "string"},
                                      "description": "fully-formed search queries"}},
        "required": ["query_list"],
    }

    def __init__(self, url: str, topk: int = 3, timeout_s: float = 30.0) -> None:
        if not str(url).startswith(("http://", "https://")):
            raise ValueError(f"retrieval_search url {url!r}: expected http(s)://host:port/path")
        self.url, self.topk, self.timeout_s = str(url), int(topk), float(timeout_s)

    def call(self, arguments: dict[str, Any], **_: Any) -> ToolResult:
        queries = arguments["query_list"]
        if isinstance(queries, str):
            queries = [queries]
        if not isinstance(queries, list) or not queries:
            return ToolResult("Error: query_list must be a non-empty list of strings", "bad_arguments")
        body = json.dumps({"queries": [str(q) for q in queries], "topk": self.topk, "return_scores": True})
        request = urllib.request.Request(self.url, data=body.encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                results = json.loads(response.read()).get("result")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            return ToolResult(f"Error: the retrieval service at {self.url} failed: {exc}", "service")
        if not isinstance(results, list) or len(results) != len(queries):
            return ToolResult(f"Error: the retrieval service at {self.url} returned no result per query", "service")
        return ToolResult("\n\n".join(f"Query: {q}\n{passages_text(r or [])}" for q, r in zip(queries, results)))
