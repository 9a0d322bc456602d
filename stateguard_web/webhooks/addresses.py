"""Which URLs a webhook may go to (SSRF): http(s) only, and no host that is, or resolves to,
a private, loopback, link-local, multicast or reserved address, unless
``STATEGUARD_WEBHOOKS_ALLOW_PRIVATE``. Every address the name resolves to is checked (one bad
address among good ones is refused), at submission and again before each delivery: a name
that resolved to a public address then may resolve to 127.0.0.1 now (DNS rebinding).

The sender then connects to the address checked here (``services``), not to the name again."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from django.conf import settings


class UrlRefused(ValueError):
    """The URL may not receive webhooks (the message says why, for a 422 or an attempt)."""


def _allowed(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    return address.is_global and not address.is_multicast


def url_check(url: str, *, allow_private: bool | None = None) -> list[str]:
    """The addresses ``url``'s host resolves to, all allowed; raises ``UrlRefused``."""
    if allow_private is None:
        allow_private = settings.STATEGUARD_WEBHOOKS_ALLOW_PRIVATE
    if len(url) > 2000:
        raise UrlRefused("the URL is longer than 2000 characters")
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise UrlRefused(f"not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UrlRefused("must be an http:// or https:// URL with a host")
    if parts.username or parts.password:
        raise UrlRefused("must not carry a user name or password")
    try:
        found = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise UrlRefused(f"the host {parts.hostname!r} does not resolve: {exc}") from None
    addresses = sorted({str(info[4][0]) for info in found})
    if not allow_private:
        for text in addresses:
            address = ipaddress.ip_address(text.split("%", 1)[0])
            if not _allowed(address):
                raise UrlRefused(
                    f"the host {parts.hostname!r} resolves to {address}, a private, loopback, "
                    f"link-local or reserved address: webhooks go to public addresses only")
    if not addresses:
        raise UrlRefused(f"the host {parts.hostname!r} has no address")
    return addresses
