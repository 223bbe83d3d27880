"""Where SMTP sessions leave from, as the settings read it: the egress file
(``VERIMAIL_SMTP_EGRESS_FILE``: egresses and the routes choosing one by MX host), the proxy
URLs (``socks5://``, never quoting a password) and the HELO names each egress presents.

Checked when read, as every setting is: a route to a missing egress or a HELO name that is
no fully qualified name stops the start (the engine must not be the first to read it).
:class:`verimail.config.Settings` reads the file; ``engine/smtp/egress.py`` turns it into
the routes sessions take.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$", re.IGNORECASE)


def fully_qualified(name: str, what: str) -> str:
    """``name`` when it is a fully qualified host name (two labels or more, letters, digits
    and hyphens, not all digits at the end); ValueError naming ``what`` otherwise. Servers
    refuse a HELO name that is no such name (Postfix's reject_non_fqdn_helo_hostname)."""
    labels = name.rstrip(".").split(".")
    if (
        len(name) > 253
        or len(labels) < 2
        or not all(_LABEL.match(label) for label in labels)
        or labels[-1].isdigit()
    ):
        raise ValueError(
            f"{what} {name!r} is not a fully qualified host name (e.g. mail.example.com): "
            "mail servers refuse such a HELO name"
        )
    return name


def proxy_parts(url: str) -> tuple[str, int, str | None, str | None]:
    """``socks5://[user:password@]host:port`` as (host, port, user, password); ValueError
    otherwise, never quoting the password. ``socks5h`` is refused: verimail resolves the MX
    hosts itself, so the private-range guard decides on the address the proxy is asked for."""
    parsed = urlsplit(url.strip())
    shown = mask_proxy_url(url)
    if parsed.scheme.lower() != "socks5":
        raise ValueError(f"proxy {shown}: write socks5://[user:password@]host:port")
    try:
        port = parsed.port
    except ValueError:
        port = None
    if not parsed.hostname or port is None:
        raise ValueError(f"proxy {shown}: write socks5://[user:password@]host:port")
    user = unquote(parsed.username) if parsed.username else None
    password = unquote(parsed.password) if parsed.password is not None else None
    return parsed.hostname, port, user, password


def mask_proxy_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``: for logs, errors, health."""
    parsed = urlsplit(url.strip())
    netloc = parsed.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:***@{host}" if ":" in userinfo else f"{user}@{host}"
    return parsed._replace(netloc=netloc).geturl()


class EgressSpec(BaseModel):
    """One egress of the egress file: where sessions leave from, and who they say they are."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    url: SecretStr = Field(description="`direct` or `socks5://[user:password@]host:port`.")
    helo_name: str
    mail_from: str | None = None
    max_sessions_per_host: int | None = Field(None, ge=1)

    @field_validator("url")
    @classmethod
    def _url(cls, value: SecretStr) -> SecretStr:
        if value.get_secret_value().strip().lower() != "direct":
            proxy_parts(value.get_secret_value())
        return value

    @field_validator("helo_name")
    @classmethod
    def _helo(cls, value: str) -> str:
        return fully_qualified(value, "helo_name")


class RouteSpec(BaseModel):
    """A rule of the egress file: MX hosts matching a pattern go out through these
    egresses, spread by weight."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    match: list[str] = Field(min_length=1)
    use: dict[str, float] = Field(min_length=1)

    @field_validator("match", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("use", mode="before")
    @classmethod
    def _weights(cls, value: Any) -> Any:
        return _weights(value)


def _weights(value: Any) -> Any:
    """``name``, ``[a, b]`` (equal weights) or ``{a: 2, b: 1}``; each weight above zero."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list):
        value = {name: 1.0 for name in value}
    if isinstance(value, dict) and any(
        not isinstance(w, int | float) or w <= 0 for w in value.values()
    ):
        raise ValueError("every weight must be a number above 0")
    return value


class EgressFile(BaseModel):
    """``VERIMAIL_SMTP_EGRESS_FILE``: the egresses, the rules (first match wins) and the
    default route (docs/egress.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    egresses: list[EgressSpec] = Field(min_length=1)
    routes: list[RouteSpec] = Field(default_factory=list)
    default: dict[str, float] | None = None

    @field_validator("default", mode="before")
    @classmethod
    def _default_weights(cls, value: Any) -> Any:
        return None if value is None else _weights(value)

    @model_validator(mode="after")
    def _names_known(self) -> EgressFile:
        names = [e.name for e in self.egresses]
        if len(set(names)) != len(names):
            raise ValueError("egress names must be unique")
        for used in [r.use for r in self.routes] + [self.default or {}]:
            for name in used:
                if name not in names:
                    raise ValueError(f"route names egress {name!r}, which is not defined")
        return self


def read_egress_file(path: Path) -> EgressFile:
    """The egress file at ``path``; ValueError naming the file and what is wrong (never a
    password: pydantic's message quotes the input, so it is not passed on)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"egress file {path}: cannot read it ({type(exc).__name__})") from None
    try:
        return EgressFile.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'file'}: {err['msg']}"
            for err in exc.errors(include_input=False)
        )
        raise ValueError(f"egress file {path}: {problems}") from None
