"""A message's own webhook headers: what a producer may set. One check, at enqueue (the
schema: single, batch, replace, Spark import) and again when a POST is built
(workers.webhook.request_headers), for rows written before it."""

from __future__ import annotations

import re

# RFC 9110 section 5.6.2: a field name is a token
TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# what duetime sets itself or HTTP/1.1 framing owns; compared lower-case
RESERVED = frozenset({"content-type", "content-length", "host", "transfer-encoding",
                      "connection"})
RESERVED_PREFIXES = ("webhook-", "duetime-")


def header_problem(name: str, value: str) -> str | None:
    """Why a message may not carry this header, or None."""
    if not TOKEN.fullmatch(name):
        return "Not a header name (an RFC 9110 token: letters, digits, !#$%&'*+-.^_`|~)."
    lower = name.lower()
    if lower in RESERVED or lower.startswith(RESERVED_PREFIXES):
        return "duetime sets this header itself."
    if any(c in value for c in "\r\n\0"):
        return "A header value carries no CR, LF or NUL."
    return None


def header_problems(headers: dict[str, str]) -> dict[str, list[str]]:
    """Each header of `headers` a message may not carry, with why (a name given twice, in
    two cases, too: it would go out twice)."""
    problems, seen = {}, set()
    for name, value in headers.items():
        why = header_problem(name, value)
        if why is None and name.lower() in seen:
            why = "Given twice: header names are case-insensitive."
        seen.add(name.lower())
        if why is not None:
            problems[name] = [why]
    return problems


def allowed_headers(headers: dict[str, str]) -> dict[str, str]:
    """The headers of `headers` a message may carry, the first of a name in any case."""
    allowed: dict[str, str] = {}
    seen: set[str] = set()
    for name, value in headers.items():
        if header_problem(name, value) is None and name.lower() not in seen:
            allowed[name] = value
            seen.add(name.lower())
    return allowed


def _any_case(text: str) -> str:
    """A regex of text (letters and "-") in any case."""
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in text)


# the same rules as JSON Schema keywords, for the document (ECMA regexes have no (?i))
NAME_PATTERN = f"^{TOKEN.pattern}$"
RESERVED_PATTERN = ("^(" + "|".join(_any_case(n) for n in sorted(RESERVED)) + "|("
                    + "|".join(_any_case(p) for p in RESERVED_PREFIXES) + ").*)$")
VALUE_PATTERN = "^[^\\r\\n\\u0000]*$"
