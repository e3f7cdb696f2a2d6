"""Which addresses a webhook may be POSTed to. Pure: no I/O.

A tenant must not make duetime POST into the network duetime runs in. By default every
address that is not public is refused: loopback, private (RFC 1918, unique-local), link-local
(cloud metadata at 169.254.169.254), carrier-grade NAT, multicast, reserved, unspecified, and
IPv4 mapped into IPv6 is judged as IPv4. DUETIME_WEBHOOK_ALLOW lists networks allowed all the
same (the dev stack and the tests allow loopback). The releaser checks the address it is about
to connect to, after resolving the name, so a name that resolves elsewhere later (DNS
rebinding) is still refused; the API checks literal addresses when a topic is saved.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT: not "private" in Python


def parse_allow(text: str) -> tuple[Network, ...]:
    """Networks from a comma-separated list ("127.0.0.0/8,::1"); ValueError names a bad one."""
    networks = []
    for part in (p.strip() for p in text.split(",")):
        if part:
            try:
                networks.append(ipaddress.ip_network(part, strict=False))
            except ValueError as exc:
                raise ValueError(f"not a network: {part!r}") from exc
    return tuple(networks)


def _address(ip: str) -> Address:
    address = ipaddress.ip_address(ip.split("%", 1)[0])  # drop an IPv6 zone
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def refusal(ip: str, allow: tuple[Network, ...]) -> str | None:
    """Why a POST to this address is refused, or None if it may go."""
    address = _address(ip)
    if any(address in network for network in allow):
        return None
    if isinstance(address, ipaddress.IPv4Address) and address in _SHARED:
        return f"{address} is a shared (carrier-grade NAT) address"
    for kind in ("loopback", "private", "link_local", "multicast", "reserved", "unspecified"):
        if getattr(address, f"is_{kind}"):
            return f"{address} is a {kind.replace('_', '-')} address"
    return None


def url_refusal(url: str, allow: tuple[Network, ...]) -> str | None:
    """When a topic is saved: why its URL is refused already (a literal address that is not
    allowed, or localhost); names are checked again when they are resolved for each POST."""
    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return refusal("127.0.0.1", allow) and "localhost is a loopback address"
    try:
        return refusal(host, allow)
    except ValueError:  # a name, not an address
        return None
