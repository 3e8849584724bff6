"""A small fixed-window counter in Django's cache (Redis through CACHE_URL in a deployment,
so every gunicorn worker counts together; the process's own memory otherwise).

`allow` counts one more request for `key` in the current window and says whether it is
still within `limit`. The key is hashed, so what it names (an address, an email address)
never sits in the cache in the clear. A window is `window_s` seconds long, counted from
the epoch; the count starts again in the next one.
"""

from __future__ import annotations

import hashlib
import time

from django.core.cache import cache


def _cache_key(scope: str, key: str, window_s: int, now: float) -> str:
    digest = hashlib.sha256(f"{scope}\x00{key}".encode()).hexdigest()[:32]
    return f"throttle:{scope}:{digest}:{int(now // window_s)}"


def allow(scope: str, key: str, *, limit: int, window_s: int, now: float | None = None) -> bool:
    """Count a request; False once more than `limit` were counted in this window."""
    at = time.time() if now is None else now
    name = _cache_key(scope, key, window_s, at)
    # The first request of a window creates the counter; the window's end removes it.
    cache.add(name, 0, timeout=window_s + 1)
    try:
        count = cache.incr(name)
    except ValueError:  # expired between add and incr: this is the next window's first
        cache.add(name, 1, timeout=window_s + 1)
        count = 1
    return int(count) <= limit


def retry_after_s(window_s: int, now: float | None = None) -> int:
    """Seconds until the current window ends."""
    at = time.time() if now is None else now
    return max(1, int(window_s - at % window_s))
