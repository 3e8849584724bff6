"""Whose request it is: the client's address as the login lockouts (django-axes) and the
password-reset throttle count it.

Behind the compose deployment's TLS proxy every request arrives from the proxy's own
address (REMOTE_ADDR). The proxy appends the address it received the request from to
X-Forwarded-For, so the hops a request took, in order, are what X-Forwarded-For says
followed by REMOTE_ADDR:

    client, proxy 1, ..., proxy N-1   (X-Forwarded-For)   proxy N   (REMOTE_ADDR)

AXES_IPWARE_PROXY_COUNT is N, the number of proxies this deployment puts in front of the
app (compose: 1). The client is the hop just before the last N, counted from the right:
whatever a client writes into X-Forwarded-For itself stands further left and is never
taken for its address. With N = 0 (clients connect directly) X-Forwarded-For is ignored,
since anyone can write it.

django-ipware does the reading (its hop-chain parser and its proxy count, not strict: a
chain longer than N + 1 is a client that wrote the header itself, and its real address is
still the hop before the proxies). django-axes would hand django-ipware X-Forwarded-For
alone, where the nearest proxy never appears, and by default only REMOTE_ADDR; so axes is
given this function (AXES_CLIENT_IP_CALLABLE) instead. A request with fewer hops than that
(one that reached the app without the proxy, as the container's health check does) is
counted by REMOTE_ADDR.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from ipware.ip import get_client_ip

# The one header the chain is handed to django-ipware in.
_CHAIN = "HTTP_X_FORWARDED_FOR"


class _Hops:
    """What django-ipware reads of a request (its META), holding just the hop chain."""

    def __init__(self, chain: str) -> None:
        self.META = {_CHAIN: chain}


def proxy_count() -> int:
    return int(getattr(settings, "AXES_IPWARE_PROXY_COUNT", 0) or 0)


def client_address(request: Any) -> str | None:
    """The client's address: REMOTE_ADDR, or behind N proxies the hop before them."""
    meta = getattr(request, "META", {}) or {}
    remote = str(meta.get("REMOTE_ADDR", "") or "").strip()
    proxies = proxy_count()
    if proxies <= 0:
        return remote or None
    forwarded = str(meta.get(_CHAIN, "") or "").strip()
    chain = f"{forwarded}, {remote}" if forwarded else remote
    found, _routable = get_client_ip(
        _Hops(chain),  # type: ignore[arg-type]
        proxy_count=proxies, request_header_order=[_CHAIN], strict=False,
    )
    return found or remote or None
