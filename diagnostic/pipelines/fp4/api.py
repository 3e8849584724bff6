"""The two requests the FP4 checks make of an OpenAI-compatible endpoint.

A canary is one greedy, non-streamed chat completion; the likelihood check is one plain
completion with `echo` and `logprobs`, which returns the log-probability of every prompt
token. Nothing here counts tokens or converts clocks.
"""

from __future__ import annotations

from typing import Any

import httpx

from diagnostic.pipelines.client import EndpointError, bearer_headers, normalize_endpoint

REQUEST_TIMEOUT_S = 120.0


class ModelEndpoint:
    """One served model behind an endpoint URL."""

    def __init__(
        self, endpoint: str, *, model: str | None = None, timeout_s: float = REQUEST_TIMEOUT_S,
        api_key: str | None = None,
    ) -> None:
        self.base = normalize_endpoint(endpoint)
        # An engine started with an API key refuses /v1 requests without it (client.py).
        self._http = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10.0), trust_env=False,
                                  headers=bearer_headers(api_key))
        self._model = model

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ModelEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def model(self) -> str:
        if self._model is None:
            listed = self._json("GET", "/v1/models").get("data") or []
            if not listed:
                raise EndpointError(f"{self.base}/v1/models lists no model")
            self._model = str(listed[0]["id"])
        return self._model

    def _json(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            res = self._http.request(method, self.base + path, json=body)
        except httpx.HTTPError as exc:
            raise EndpointError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        if res.status_code != 200:
            raise EndpointError(f"{method} {path}: HTTP {res.status_code}: {res.text[:300]}")
        data = res.json()
        if not isinstance(data, dict):
            raise EndpointError(f"{method} {path}: the answer is not a JSON object")
        return data

    def chat(self, prompt: str, *, max_tokens: int) -> str:
        """The reply to one user message, greedy."""
        data = self._json(
            "POST",
            "/v1/chat/completions",
            {
                "model": self.model,
                "messages": [{"role": "user", "content": prompt}],
                "temperature": 0,
                "max_tokens": max_tokens,
                "stream": False,
            },
        )
        choices = data.get("choices") or [{}]
        message = choices[0].get("message") or {}
        return str(message.get("content") or "")

    def prompt_logprobs(self, text: str) -> dict[str, Any]:
        """The completions answer for `text` with echo and logprobs (one generated token,
        which the caller ignores: some servers refuse max_tokens 0)."""
        return self._json(
            "POST",
            "/v1/completions",
            {
                "model": self.model,
                "prompt": text,
                "max_tokens": 1,
                "temperature": 0,
                "echo": True,
                "logprobs": 1,
                "stream": False,
            },
        )
