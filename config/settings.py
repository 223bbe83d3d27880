"""Settings for every part of verimail, in one place.

Every setting is checked when it is read, so a bad one stops the start (the egress file's
models with them, in :mod:`verimail.config.egress`: the engine must not be the first to
read it).

Read from the environment (prefix ``VERIMAIL_``) and an optional ``.env`` file.
List settings take a comma-separated value in the environment, e.g.
``VERIMAIL_DNS_NAMESERVERS=127.0.1.53:53,127.0.1.54`` — JSON lists are accepted too.
The engine never reads the environment itself: callers pass a ``Settings`` object, so
tests and the testbed can run several differently-configured engines in one process.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    PrivateAttr,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from verimail.config.egress import EgressFile, fully_qualified, proxy_parts, read_egress_file

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Networks a blanket "allow private" switch would open; we refuse them as a whole so
# that allowing the loopback testbed can never silently allow the LAN as well.
_TOO_BROAD = {ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")}


def _split_list(value: Any) -> Any:
    """Accept ``a,b,c`` or a JSON list from the environment; pass lists through."""
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return []
        if text.startswith("["):
            return json.loads(text)
        return [part.strip() for part in text.split(",") if part.strip()]
    return value


class Settings(BaseSettings):
    """All runtime settings. Field docs double as the README's settings table."""

    model_config = SettingsConfigDict(
        env_prefix="VERIMAIL_",
        env_file=".env",
        extra="ignore",
        validate_default=True,
        hide_input_in_errors=True,  # (a proxy URL's password must not be quoted back)
    )

    # --- where state lives -------------------------------------------------------
    data_dir: Path = Field(Path(".verimail"), description="Directory for all runtime state.")
    database_url: str | None = Field(
        None, description="SQLAlchemy URL; default: SQLite file `<data_dir>/verimail.db`."
    )
    redis_url: str | None = Field(
        None,
        description="Redis URL for shared rate limits, SMTP politeness slots and what the "
        "prober learnt of servers; default: in-process memory.",
    )

    # --- DNS -----------------------------------------------------------------------
    dns_nameservers: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Nameservers as `address[:port]` (IPv6 `[address]:port`), comma-separated; "
        "empty: system resolver.",
    )
    dns_timeout: float = Field(3.0, gt=0, description="Seconds per DNS query (all tries).")

    # --- SMTP prober ---------------------------------------------------------------
    smtp_port: int = Field(25, ge=1, le=65535, description="TCP port of the MX hosts.")
    smtp_connect_timeout: float = Field(10.0, gt=0, description="Seconds to connect + greet.")
    smtp_command_timeout: float = Field(15.0, gt=0, description="Seconds per SMTP command.")
    smtp_helo_name: str = Field(
        "verimail.localhost",
        description="Name sent in EHLO/HELO: a fully qualified name (refused at start-up "
        "otherwise), ideally the reverse DNS name of the sending IP.",
    )
    smtp_mail_from: str = Field(
        "verify@verimail.localhost", description="Envelope sender for `MAIL FROM`."
    )
    smtp_proxy: SecretStr | None = Field(
        None,
        description="Send every SMTP session through this SOCKS5 proxy: "
        "`socks5://[user:password@]host:port` (docs/egress.md). Unset: direct. The password "
        "is never shown.",
    )
    smtp_egress_file: Path | None = Field(
        None,
        description="YAML file of egresses (direct and SOCKS5 proxies, each with its HELO "
        "name) and the routes choosing one by MX host (docs/egress.md); read and checked at "
        "start-up. Not together with `smtp_proxy`.",
    )
    smtp_allow_networks: Annotated[list[IPNetwork], NoDecode] = Field(
        default_factory=list,
        description="Private/reserved networks MX addresses may lie in (e.g. `127.0.0.0/8`). "
        "Default none: MX records pointing at internal addresses are refused.",
    )
    smtp_max_sessions_per_host: int = Field(
        5, ge=1, description="Concurrent SMTP sessions per mail host (politeness)."
    )
    smtp_max_sessions_total: int = Field(
        200, ge=1, description="Concurrent SMTP sessions of one process, all hosts together."
    )
    smtp_rcpts_per_session: int = Field(
        100, ge=1, description="`RCPT TO` commands per session before a fresh session."
    )
    smtp_max_rejections_per_session: int = Field(
        9,
        ge=1,
        description="Rejected recipients per session before a fresh one (Postfix slows "
        "down after 10 and drops after 20).",
    )
    smtp_mix_domains: bool = Field(
        True,
        description="Recipients of several domains in one SMTP transaction (saves RSET + "
        "MAIL FROM per domain); false: one domain per transaction.",
    )
    smtp_sessions_by_server: bool = Field(
        True,
        description="Domains whose MX hosts lead to the same server addresses share "
        "sessions (a shared host that gives each domain its own MX name); false: sessions "
        "per MX names, as before.",
    )
    smtp_greylist_retries: int = Field(
        3, ge=0, description="Retries of a greylisted (4xx) recipient within one run."
    )
    smtp_greylist_delay: float = Field(
        5.0, ge=0, description="Seconds before the first greylist retry (doubles each time)."
    )
    smtp_egress_cooldown: float = Field(
        1800.0,
        ge=0,
        description="Seconds an egress is left alone by a mail server IP that refused our "
        "sending IP (a blocklist, a 554 banner): its addresses end unknown/egress_blocked at "
        "once meanwhile (0: never cool down). Fleet-wide with VERIMAIL_REDIS_URL.",
    )
    doctor_domain: str = Field(
        "gmail.com",
        description="`verimail doctor` and the health's `smtp_egress`: the domain whose MX "
        "must greet us on port 25 through each egress.",
    )
    doctor_interval: float = Field(
        300.0,
        ge=0,
        description="Seconds between the API's background checks of SMTP egress "
        "(`smtp_egress` in /api/health and /metrics; 0: no checks, `smtp_egress` null).",
    )

    greylist_retry_after: int = Field(
        300,
        ge=1,
        description="`retry_after` (seconds) of a greylisted result when the server's reply "
        "names no delay (postgrey's default delay is 300 s).",
    )
    verify_timeout: float = Field(
        10.0,
        ge=1,
        le=60,
        description="Default `timeout` (seconds) of a synchronous call (single, batch, find, "
        "CLI `verify`): what is not settled by then is answered `unknown`.",
    )

    # --- reference lists ----------------------------------------------------------
    disposable_extra: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="More disposable domains, comma-separated."
    )
    disposable_allow: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Domains never treated as disposable."
    )
    free_providers_file: Path | None = Field(
        None, description="File of free-provider domains (one a line) replacing the shipped list."
    )
    role_names_file: Path | None = Field(
        None, description="File of role local parts (one a line) replacing the shipped list."
    )

    # --- credits -------------------------------------------------------------------
    signup_credits: int = Field(100, ge=0, description="Prepaid credits of a new account.")
    finder_charge: int = Field(
        10, ge=0, description="Credits charged for one verified Email Finder find."
    )
    finder_max_probes: int = Field(
        20,
        ge=1,
        description="Most candidate addresses (RCPTs) the finder sends per person; the "
        "catch-all probe is one more, once per domain.",
    )
    finder_pattern_scope: Literal["all", "account"] = Field(
        "all",
        description="Whose finds teach a domain's pattern to a lookup: `all` accounts "
        "(pattern names and counts only, never an address) or the `account` itself.",
    )

    # --- jobs and uploads ----------------------------------------------------------
    runner: Literal["local", "deployment"] = Field(
        "local", description="`local`: the API process runs flows; `deployment`: workers."
    )
    upload_max_bytes: int = Field(50 * 1024 * 1024, ge=1, description="Largest CSV upload.")
    upload_max_rows: int = Field(1_000_000, ge=1, description="Most rows in a CSV upload.")
    local_runner_workers: int = Field(
        2, ge=1, description="Jobs the API process runs at once with the `local` runner."
    )
    job_stale_after: float = Field(
        120.0, gt=0, description="Seconds without a heartbeat before a job counts as dead."
    )
    job_max_attempts: int = Field(
        2, ge=1, description="Runs of one job (first + resumes) before it fails with a refund."
    )
    job_shard_size: int = Field(
        50_000,
        ge=0,
        description="A bulk job of more distinct addresses than this is split into shards "
        "of about this many (by domain), each a flow run any worker takes (0: never split).",
    )
    job_retry_passes: int = Field(
        2,
        ge=0,
        description="Deferred retry passes of a job's greylisted and temporarily failed "
        "addresses (0: none; a job may opt out with `retry_unknowns=false`).",
    )
    job_retry_delay: float = Field(
        900.0,
        gt=0,
        description="Seconds from the end of a job's pass to its first deferred retry pass; "
        "each later pass waits twice the one before.",
    )
    job_greylist_retries: int = Field(
        0,
        ge=0,
        description="In-pass retries of a greylisted recipient in a job pass that a deferred "
        "retry pass follows (0: parked at once, the deferred pass asks again); a job's last "
        "pass, and a job that opted out, use `smtp_greylist_retries`.",
    )
    job_retry_max_wait: float = Field(
        3600.0,
        ge=0,
        description="Most seconds of deferred-retry delay one job may add in all (a pass "
        "that would pass it is not planned).",
    )
    prefect_warm_up: bool = Field(
        True, description="Start Prefect's embedded server at API start-up (local runner)."
    )
    prefect_work_pool: str = Field("verimail", description="Work pool of the deployments.")
    prefect_ui_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="`verimail serve` (local runner) starts a Prefect server with its UI on "
        "127.0.0.1 at this port; unset: no UI (the demo's default is 4200).",
    )

    # --- webhooks ------------------------------------------------------------------
    webhook_allow_networks: Annotated[list[IPNetwork], NoDecode] = Field(
        default_factory=list,
        description="Private networks webhook URLs may point into (default none).",
    )
    webhook_timeout: float = Field(
        10.0, gt=0, description="Seconds per webhook attempt (the whole attempt, to its status)."
    )

    # --- API server ----------------------------------------------------------------
    api_host: str = Field("127.0.0.1", description="Address `verimail serve` binds.")
    api_port: int = Field(8000, ge=1, le=65535, description="Port `verimail serve` binds.")
    public_url: str | None = Field(
        None,
        description="Address people reach the API at (e.g. `https://verify.example.com`), "
        "for the download links in job summaries; default `http://<api_host>:<api_port>`.",
    )

    http_max_body_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        description="Largest request body of every route but the CSV uploads (which have "
        "`upload_max_bytes`); refused with 413 while it streams in, before the key is checked. "
        "The largest legal JSON body (10,000 addresses of 320 characters) is about 3.3 MB.",
    )
    http_max_header_bytes: int = Field(
        16 * 1024,
        ge=1024,
        description="Largest request line plus header section; beyond it, 431.",
    )
    http_header_timeout: float = Field(
        10.0, gt=0, description="Seconds a client has to send a request's whole header section."
    )
    http_body_timeout: float = Field(
        30.0,
        gt=0,
        description="Seconds the server waits for the next piece of a request body; then 408.",
    )
    http_max_connections: int = Field(
        500,
        ge=1,
        description="Open HTTP connections per process; a request on one more gets 503.",
    )

    # --- metrics -------------------------------------------------------------------
    metrics_token: SecretStr | None = Field(
        None,
        description="Turns on `GET /metrics` (Prometheus), answered only to "
        "`Authorization: Bearer <token>`; unset: no metrics endpoint.",
    )

    # --- dashboard -----------------------------------------------------------------
    session_secret: SecretStr | None = Field(
        None,
        description="Key signing dashboard session cookies and CSRF tokens; default: a "
        "random key kept in `<data_dir>/session_secret`. Set it when API processes do not "
        "share a data dir, or their sessions will not be valid on each other.",
    )

    @field_validator(
        "dns_nameservers",
        "smtp_allow_networks",
        "webhook_allow_networks",
        "disposable_extra",
        "disposable_allow",
        mode="before",
    )
    @classmethod
    def _lists_from_env(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator("smtp_allow_networks", "webhook_allow_networks")
    @classmethod
    def _no_blanket_allow(cls, value: list[IPNetwork]) -> list[IPNetwork]:
        for net in value:
            if net in _TOO_BROAD:
                raise ValueError(f"{net} would allow every address; name the networks instead")
        return value

    _egress_routes: EgressFile | None = PrivateAttr(None)

    @field_validator("smtp_helo_name")
    @classmethod
    def _helo_fully_qualified(cls, value: str) -> str:
        return fully_qualified(value, "VERIMAIL_SMTP_HELO_NAME")

    @field_validator("smtp_proxy")
    @classmethod
    def _proxy_readable(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and value.get_secret_value().strip():
            proxy_parts(value.get_secret_value())  # (its refusal never quotes the password)
            return value
        return None

    @model_validator(mode="after")
    def _egress_file_readable(self) -> Settings:
        """Read the egress file now: a route to a missing egress or a HELO name that is no
        fully qualified name stops the start, not the thousandth session."""
        if self.smtp_egress_file is not None:
            if self.smtp_proxy is not None:
                raise ValueError(
                    "set VERIMAIL_SMTP_PROXY or VERIMAIL_SMTP_EGRESS_FILE, not both "
                    "(a proxy goes in the file as one of its egresses)"
                )
            self._egress_routes = read_egress_file(self.smtp_egress_file)
        return self

    @property
    def egress_routes(self) -> EgressFile | None:
        """The egress file, as read at start-up (None without one)."""
        return self._egress_routes

    @model_validator(mode="after")
    def _default_database(self) -> Settings:
        if not self.database_url:
            self.database_url = f"sqlite:///{self.data_dir / 'verimail.db'}"
        return self

    def nameserver_addresses(self) -> list[tuple[str, int]]:
        """``dns_nameservers`` as (host, port) pairs; IPv6 may be written ``[::1]:53``."""
        return [_nameserver(item) for item in self.dns_nameservers]

    @field_validator("dns_nameservers")
    @classmethod
    def _nameservers_readable(cls, value: list[str]) -> list[str]:
        """Refused when read, naming the entry: a bad port was a ValueError traceback at the
        first lookup, or an OverflowError per query and every address ``unknown``."""
        for item in value:
            _nameserver(item)
        return value


def _nameserver(item: str) -> tuple[str, int]:
    """``host[:port]`` (``[v6]:port``) as an IP address and a port 1-65535; ValueError
    naming the entry otherwise (dnspython takes addresses, not names)."""
    host, port_text = item.strip(), "53"
    if host.startswith("["):
        host, _, rest = host[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"nameserver {item!r}: write [address]:port")
            port_text = rest[1:]
    elif host.count(":") == 1:
        host, port_text = host.split(":")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"nameserver {item!r}: {host!r} is not an IP address") from None
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"nameserver {item!r}: the port must be a number 1-65535") from None
    return host, int(port_text)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()


_OVERRIDE: ContextVar[Settings | None] = ContextVar("verimail_settings", default=None)


def current_settings() -> Settings:
    """The settings in force here: an override set by ``using_settings``, else the environment.

    Flows call this instead of taking settings as a parameter, so a flow run started by an
    API process with explicit settings (tests, the demo) sees exactly those, while a worker
    started by Prefect reads its own environment.
    """
    return _OVERRIDE.get() or get_settings()


@contextmanager
def using_settings(settings: Settings) -> Iterator[Settings]:
    """Make ``settings`` current for this thread/task and everything it starts."""
    token = _OVERRIDE.set(settings)
    try:
        yield settings
    finally:
        _OVERRIDE.reset(token)
