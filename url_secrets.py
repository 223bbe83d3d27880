"""URLs that carry a password — the SOCKS5 proxies, the database, Redis — read and shown
without it. One reading for all of them, because a password is typed as is: it may hold
``#``, ``/``, ``?``, ``@``, ``:`` or ``%`` unencoded, and a URL parser (``urlsplit``) then
ends the credentials at the first ``#``, ``/`` or ``?`` and shows the rest — the password —
as the path or fragment (issue 47). Here the credentials run from ``scheme://`` to the
*last* ``@`` of the URL (a host name holds none), so a password is never part of what is
shown, whatever it holds."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_HOST_PORT = re.compile(
    r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[^\[\]:/?#@\s]+))(?::(?P<port>\d*))?$"
)
_KEEP = "%!$&'()*+,;="  # (sub-delims stay; "%" keeps meaning an escape)
UNREADABLE = "(a URL that cannot be read; not shown, as it may hold a password)"
"""What stands for a URL that has no ``scheme://`` but an ``@``: it is not echoed."""


def redact(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``: for logs, errors, health,
    metrics and the CLI. Everything between the user name's ``:`` and the URL's last ``@``
    goes, so a password is hidden whatever characters it holds."""
    text = url.strip()
    found = _SCHEME.match(text)
    if found is None:
        return UNREADABLE if "@" in text else text
    userinfo, at, rest = text[found.end() :].rpartition("@")
    if not at:
        return text
    user, colon, _ = userinfo.partition(":")
    return f"{found.group(1)}://{user}{':***' if colon else ''}@{rest}"


def encoded(url: str) -> str:
    """``url`` with the reserved characters of its user name and password percent-encoded,
    as the parsers of SQLAlchemy and redis-py need them (they end a password at its first
    ``@``, or ``#``, ``/``, ``?``); both decode them back, so they log in with the password
    as typed. A URL without credentials is returned as it is."""
    found = _SCHEME.match(url.strip())
    userinfo, at, rest = url.strip()[found.end() :].rpartition("@") if found else ("", "", "")
    if not found or not at:
        return url
    user, colon, secret = userinfo.partition(":")
    password = f":{quote(secret, safe=_KEEP)}" if colon else ""
    return f"{found.group(1)}://{quote(user, safe=_KEEP)}{password}@{rest}"


@dataclass(frozen=True)
class Authority:
    """``scheme://[user[:password]@]host[:port]`` read the way :func:`redact` reads it. The
    user name and password are percent-decoded (``%40`` is ``@``), so a URL written the
    standard way reads as before; a literal ``%`` before two hex digits is written ``%25``."""

    scheme: str
    host: str
    port: int | None
    user: str | None
    password: str | None = field(repr=False)
    path: str  # what follows host:port ("" or "/…")


def authority(url: str) -> Authority | None:
    """The parts of ``url``, or None when it is no ``scheme://…host[:port][/…]`` URL."""
    text = url.strip()
    found = _SCHEME.match(text)
    if found is None:
        return None
    userinfo, at, rest = text[found.end() :].rpartition("@")
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    where, path = rest[:cut], rest[cut:]
    parts = _HOST_PORT.match(where)
    if parts is None or (parts["port"] is not None and not parts["port"]):
        return None
    user = password = None
    if at:
        name, colon, secret = userinfo.partition(":")
        user = unquote(name)
        password = unquote(secret) if colon else None
    port = int(parts["port"]) if parts["port"] else None
    return Authority(
        found.group(1).lower(), parts["v6"] or parts["name"], port, user, password, path
    )
