"""A message's own webhook headers: what a producer may set. One check, at enqueue (the
schema: single, batch, replace, Spark import) and again when a POST is built
(workers.webhook.request_headers), for rows written before it."""

from __future__ import annotations

import re

# RFC 9110 section 5.6.2: a field name is a token
TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# what duetime sets itself or HTTP/1.1 framing owns (an Expect would draw a 100 Continue
# ahead of the answer); compared lower-case
RESERVED = frozenset({"content-type", "content-length", "host", "transfer-encoding",
                      "connection", "expect", "te", "trailer", "upgrade", "keep-alive"})
# what a POST can carry intact: a tab, printable ASCII and printable Latin-1 (RFC 9110's
# obs-text); a field value is bytes, and past U+00FF no encoding is agreed on
VALUE = re.compile(r"[\t\x20-\x7e\xa0-\xff]*")
RESERVED_PREFIXES = ("webhook-", "duetime-")


def header_problem(name: str, value: str) -> str | None:
    """Why a message may not carry this header, or None."""
    if not TOKEN.fullmatch(name):
        return "Not a header name (an RFC 9110 token: letters, digits, !#$%&'*+-.^_`|~)."
    lower = name.lower()
    if lower in RESERVED or lower.startswith(RESERVED_PREFIXES):
        return "duetime sets this header itself, or HTTP/1.1 framing owns it."
    if not VALUE.fullmatch(value):
        return ("A header value is printable Latin-1 text or tabs: no CR, LF, NUL or other "
                "control character, nothing past U+00FF (HTTP sends bytes).")
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
VALUE_PATTERN = "^[\\t\\u0020-\\u007e\\u00a0-\\u00ff]*$"
