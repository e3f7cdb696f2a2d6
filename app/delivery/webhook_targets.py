"""Which addresses a webhook may be POSTed to. Pure: no I/O.

A tenant must not make duetime POST into the network duetime runs in. By default every
address that is not public is refused: loopback, private (RFC 1918, unique-local), link-local
(cloud metadata at 169.254.169.254), carrier-grade NAT, multicast, reserved, unspecified;
IPv4 mapped into IPv6 is judged as IPv4, and an IPv6 address that carries traffic to an IPv4
one (6to4, Teredo, NAT64, IPv4-compatible) is refused when that one is. DUETIME_WEBHOOK_ALLOW
lists networks allowed all the same (the dev stack and the tests allow loopback). The
releaser checks the address it is about to connect to, after resolving the name, so a name
that resolves elsewhere later (DNS rebinding) is still refused; the API checks literal
addresses, in every spelling the resolver reads as one (2852039166, 0xa9fea9fe, 0251.0.0.1,
10.1), when a topic is saved. Both use refusal().
"""

from __future__ import annotations

import ipaddress
import re
import socket
from urllib.parse import urlsplit

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT: not "private" in Python
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_COMPATIBLE = ipaddress.ip_network("::/96")  # IPv4-compatible, deprecated (RFC 4291)
# what inet_aton (and so the resolver) may read as an IPv4 address: 1 to 4 parts, each
# decimal, octal (leading 0) or hex (0x)
_IPV4_SPELLING = re.compile(r"(0[xX][0-9a-fA-F]*|[0-9]+)(\.(0[xX][0-9a-fA-F]*|[0-9]+)){0,3}")


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


def _embedded(address: Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 one leads to: 6to4's, Teredo's server and client, the
    last 32 bits of NAT64's prefixes and of an IPv4-compatible address."""
    if isinstance(address, ipaddress.IPv4Address):
        return []
    found = [address.sixtofour] if address.sixtofour is not None else []
    found.extend(address.teredo or ())
    if address in _COMPATIBLE or any(address in prefix for prefix in _NAT64):
        found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return found


def _own_refusal(address: Address) -> str | None:
    if isinstance(address, ipaddress.IPv4Address) and address in _SHARED:
        return f"{address} is a shared (carrier-grade NAT) address"
    for kind in ("loopback", "private", "link_local", "multicast", "reserved", "unspecified"):
        if getattr(address, f"is_{kind}"):
            return f"{address} is a {kind.replace('_', '-')} address"
    return None


def refusal(ip: str, allow: tuple[Network, ...]) -> str | None:
    """Why a POST to this address is refused, or None if it may go."""
    address = _address(ip)
    if any(address in network for network in allow):
        return None
    refused = _own_refusal(address)
    for inner in _embedded(address):
        if refused is None and not any(inner in network for network in allow):
            inner_refused = _own_refusal(inner)
            refused = inner_refused and f"{address} leads to {inner}: {inner_refused}"
    return refused


def literal_address(host: str) -> Address | None:
    """The address a URL's host names literally, in any spelling the resolver reads as
    one (inet_aton's: 2852039166, 0xa9fea9fe, 0251.0376.0251.0376, 169.254.43518); None
    for a name."""
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        pass
    if not _IPV4_SPELLING.fullmatch(host):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:  # e.g. a part too large for its place
        return None


def url_refusal(url: str, allow: tuple[Network, ...]) -> str | None:
    """When a topic is saved: why its URL is refused already (a literal address that is not
    allowed, or localhost); names are checked again when they are resolved for each POST."""
    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return refusal("127.0.0.1", allow) and "localhost is a loopback address"
    address = literal_address(host)
    return None if address is None else refusal(str(address), allow)
