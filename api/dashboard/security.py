"""Passwords, session cookies, CSRF tokens and the login throttle of the dashboard.

* **Passwords** are argon2id hashes (argon2-cffi) with OWASP's minimum parameters
  (19 MiB, 2 passes, 1 lane): slow enough to make offline guessing expensive, cheap enough
  that the login form is no lever for exhausting the server's two cores. At most
  :data:`HASH_CONCURRENCY` hashes run at once, so a burst of logins queues instead of
  starving the verification engine's threads. Logging in with an unknown email still
  verifies a (dummy) hash, so response time does not tell which emails have accounts.
* **Sessions** live in the cookie, signed with the server secret (itsdangerous,
  HMAC-SHA256): no table, nothing to clean up, valid on every API process sharing the
  secret. Each holds a random session id (what CSRF tokens are bound to), the account id
  and a fingerprint of the account's password hash, so changing a password signs every
  browser out. A session is valid for :data:`SESSION_MAX_AGE` from login; logging out
  replaces the cookie and records the session id as ended (``store/sessions.py``), so a
  copy of the old cookie is logged out too.
* **CSRF tokens** are an HMAC of the session id: every form carries one, anonymous forms
  (login, sign-up) included, and a login rotates the session id.
* **Login throttle**: :data:`LOGIN_FAILURES` failed logins per email and client address in
  :data:`LOGIN_WINDOW_SECONDS` block that pair (429) until the oldest failure leaves the
  window; a looser per-address limit slows one client spraying many emails. Counters live
  in Redis when the API uses Redis (shared by all processes), else in process memory.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import math
import os
import secrets
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from anyio import to_thread
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from itsdangerous import BadSignature, URLSafeTimedSerializer
from limits import RateLimitItemPerHour, RateLimitItemPerMinute
from limits.aio.storage import MemoryStorage, RedisStorage, Storage
from limits.aio.strategies import MovingWindowRateLimiter

from verimail.config import Settings

log = logging.getLogger("verimail.dashboard")

# --- passwords -----------------------------------------------------------------------------

PASSWORD_MIN_LENGTH = 10
PASSWORD_MAX_LENGTH = 1024
HASH_CONCURRENCY = 4
"""Password hashes computed at once; further logins wait their turn."""

_hasher = PasswordHasher(time_cost=2, memory_cost=19 * 1024, parallelism=1)
_dummy_hash: str | None = None


def new_hash_slots() -> anyio.CapacityLimiter:
    """The per-app cap on concurrent password hashing (made inside the app's event loop)."""
    return anyio.CapacityLimiter(HASH_CONCURRENCY)


def hash_password_sync(password: str) -> str:
    """An argon2id hash of ``password`` (for the CLI and tests; requests use the async one)."""
    return _hasher.hash(password)


async def hash_password(password: str, slots: anyio.CapacityLimiter) -> str:
    """:func:`hash_password_sync` in a worker thread, within the hashing concurrency cap."""
    return await to_thread.run_sync(_hasher.hash, password, limiter=slots)


def _verify_sync(stored: str | None, password: str) -> tuple[bool, bool]:
    global _dummy_hash
    if stored is None:
        # Same work as a real check, so timing does not reveal that the email is unknown.
        if _dummy_hash is None:
            _dummy_hash = _hasher.hash(secrets.token_urlsafe(16))
        with contextlib.suppress(VerificationError, InvalidHashError):
            _hasher.verify(_dummy_hash, password)
        return False, False
    try:
        _hasher.verify(stored, password)
    except (VerificationError, InvalidHashError):
        return False, False
    return True, _hasher.check_needs_rehash(stored)


async def verify_password(
    stored: str | None, password: str, slots: anyio.CapacityLimiter
) -> tuple[bool, bool]:
    """(matches, needs_rehash); ``stored`` None (no such account) always fails, just as slowly."""
    return await to_thread.run_sync(_verify_sync, stored, password, limiter=slots)


def password_problem(password: str, confirm: str | None = None) -> str | None:
    """Why a new password is refused, or None."""
    if len(password) < PASSWORD_MIN_LENGTH:
        return f"Choose a password of at least {PASSWORD_MIN_LENGTH} characters."
    if len(password) > PASSWORD_MAX_LENGTH:
        return f"Choose a password of at most {PASSWORD_MAX_LENGTH} characters."
    if confirm is not None and confirm != password:
        return "The two passwords differ."
    return None


# --- the server secret ---------------------------------------------------------------------

SECRET_FILE = "session_secret"


def load_secret(settings: Settings) -> bytes:
    """``settings.session_secret``, else the one in the data dir (created once, mode 0600).

    Kept on disk so a restart keeps everyone signed in. Creation is race-free between
    processes sharing the data dir: the secret is written to a private temporary file and
    hard-linked into place, so a process sees either no file or a complete one.
    """
    if settings.session_secret is not None:
        value = settings.session_secret.get_secret_value()
        if len(value) < 32:
            log.warning("session_secret is shorter than 32 characters; use a longer one")
        return value.encode("utf-8")
    path = Path(settings.data_dir) / SECRET_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{SECRET_FILE}.{uuid.uuid4().hex}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, secrets.token_urlsafe(48).encode("ascii"))
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process won the race; use its secret
        finally:
            tmp.unlink()
    value = path.read_text("ascii").strip()
    if not value:
        raise RuntimeError(f"{path} is empty; delete it to have a new secret made")
    return value.encode("ascii")


# --- sessions and CSRF ---------------------------------------------------------------------

SESSION_COOKIE = "vm_session"
SESSION_MAX_AGE = 14 * 24 * 3600
"""Seconds a login lasts (also the longest life of an anonymous session)."""
COOKIE_PATH = "/dashboard"


@dataclass
class Session:
    """What the signed cookie carries; ``changed`` means the cookie must be written again."""

    sid: str
    account_id: int | None = None
    pw: str | None = None
    changed: bool = field(default=False, compare=False)

    @classmethod
    def new(cls) -> Session:
        return cls(sid=secrets.token_urlsafe(18), changed=True)

    def log_in(self, account_id: int, pw_fingerprint: str) -> None:
        """Bind to the account under a *new* id (no session fixation, old tokens void)."""
        self.sid = secrets.token_urlsafe(18)
        self.account_id = account_id
        self.pw = pw_fingerprint
        self.changed = True

    def log_out(self) -> None:
        self.sid = secrets.token_urlsafe(18)
        self.account_id = None
        self.pw = None
        self.changed = True


class Signer:
    """Everything signed with the server secret: sessions, CSRF tokens, pending uploads."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret
        self._sessions = URLSafeTimedSerializer(
            secret,
            salt="verimail.dashboard.session",
            signer_kwargs={"digest_method": hashlib.sha256},
        )
        self._tokens = URLSafeTimedSerializer(
            secret,
            salt="verimail.dashboard.token",
            signer_kwargs={"digest_method": hashlib.sha256},
        )

    def _mac(self, purpose: str, value: str) -> str:
        message = f"{purpose}\0{value}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def dump_session(self, session: Session) -> str:
        data: dict[str, Any] = {"s": session.sid}
        if session.account_id is not None:
            data["a"] = session.account_id
            data["p"] = session.pw
        return self._sessions.dumps(data)

    def load_session(self, cookie: str | None) -> Session | None:
        """The session in a cookie; None when absent, forged or older than SESSION_MAX_AGE."""
        if not cookie:
            return None
        try:
            data = self._sessions.loads(cookie, max_age=SESSION_MAX_AGE)
        except BadSignature:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("s"), str):
            return None
        account_id = data.get("a")
        return Session(
            sid=data["s"],
            account_id=account_id if isinstance(account_id, int) else None,
            pw=data.get("p") if isinstance(data.get("p"), str) else None,
        )

    def password_fingerprint(self, password_hash: str) -> str:
        """Short MAC of the password hash: sessions die when the password changes."""
        return self._mac("password", password_hash)[:32]

    def csrf_token(self, session: Session) -> str:
        return self._mac("csrf", session.sid)

    def csrf_ok(self, session: Session, token: object) -> bool:
        return isinstance(token, str) and hmac.compare_digest(self.csrf_token(session), token)

    def dump_token(self, data: dict[str, Any]) -> str:
        """A signed, timestamped value to hand to the browser (e.g. a pending upload)."""
        return self._tokens.dumps(data)

    def load_token(self, token: str, max_age: int) -> dict[str, Any] | None:
        try:
            data = self._tokens.loads(token, max_age=max_age)
        except BadSignature:
            return None
        return data if isinstance(data, dict) else None


# --- throttling ----------------------------------------------------------------------------

LOGIN_FAILURES = 5
LOGIN_WINDOW_SECONDS = 15 * 60
LOGIN_FAILURES_PER_ADDRESS = 50
"""Failed logins per client address (any emails) in the same window."""
SIGNUPS_PER_HOUR = 10
"""Accounts one client address may create per hour (each comes with free credits)."""

_LOGIN = RateLimitItemPerMinute(LOGIN_FAILURES, LOGIN_WINDOW_SECONDS // 60)
# The address-wide limit counts failures, and a failure is known only after the password
# check, so each try is counted when it arrives (tries) and given back when it succeeds
# (successes): tries - successes is the failures so far, in-flight tries included. The
# windows' own caps are only there to bound storage.
_LOGIN_TRIES = RateLimitItemPerMinute(100 * LOGIN_FAILURES_PER_ADDRESS, LOGIN_WINDOW_SECONDS // 60)
_SIGNUP = RateLimitItemPerHour(SIGNUPS_PER_HOUR)


def _email_key(email: str) -> str:
    """Counters are keyed by a hash: no addresses in Redis."""
    return hashlib.sha256(email.strip().casefold().encode("utf-8")).hexdigest()[:32]


class Throttle:
    """Failed-login and sign-up counters (moving windows). Storage failures fail open."""

    def __init__(self, redis_url: str | None, prefix: str) -> None:
        self._storage: Storage
        if redis_url:
            url = redis_url if redis_url.startswith("async+") else f"async+{redis_url}"
            self._storage = RedisStorage(url, implementation="redispy", key_prefix=f"{prefix}:dash")
        else:
            self._storage = MemoryStorage()
        self._window = MovingWindowRateLimiter(self._storage)

    async def close(self) -> None:
        bridge = getattr(self._storage, "bridge", None)
        client = getattr(bridge, "storage", None)
        if client is not None:
            with contextlib.suppress(Exception):
                await client.aclose()

    async def _take(self, item: Any, *key: str, count: bool = True) -> int | None:
        """None when ``key`` is within its limit, else the seconds until it may try again.
        With ``count``, this try is counted in the same step as the check (a burst of
        parallel requests cannot all pass a check made before any of them is counted)."""
        try:
            check = self._window.hit if count else self._window.test
            if await check(item, *key):
                return None
            stats = await self._window.get_window_stats(item, *key)
        except Exception as exc:
            log.warning("throttle storage failed, request allowed: %s", exc)
            return None
        return max(1, math.ceil(stats.reset_time - time.time()))

    async def login_attempt(self, email: str, address: str) -> int | None:
        """Before a password is checked: Retry-After seconds when this email+address, or
        the address, is over its limit.

        The pair's try is counted now, atomically with the check, and every try counts
        until one succeeds (:meth:`login_succeeded` clears the pair): so at most
        :data:`LOGIN_FAILURES` passwords of one account are checked per window however many
        arrive at once. The address-wide limit counts failures only (tries less successes),
        or an office behind one address would be locked out by its own good logins."""
        pair = await self._take(_LOGIN, "login", _email_key(email), address)
        if pair is not None:
            return pair
        # Counted before it is checked, like the pair: a parallel burst from one address
        # once had every password checked, since each passed a check made before any
        # failure of the burst was counted.
        over = await self._take(_LOGIN_TRIES, "login-tries", address)
        if over is not None:
            return over
        try:
            tries = await self._used(_LOGIN_TRIES, "login-tries", address)
            good = await self._used(_LOGIN_TRIES, "login-good", address)
            if tries - good <= LOGIN_FAILURES_PER_ADDRESS:
                return None
            stats = await self._window.get_window_stats(_LOGIN_TRIES, "login-tries", address)
        except Exception as exc:
            log.warning("throttle storage failed, request allowed: %s", exc)
            return None
        return max(1, math.ceil(stats.reset_time - time.time()))

    async def _used(self, item: Any, *key: str) -> int:
        stats = await self._window.get_window_stats(item, *key)
        return item.amount - stats.remaining

    async def login_succeeded(self, email: str, address: str) -> None:
        """The right password clears that pair's failures (the owner is not locked out later)
        and gives the address-wide count its try back (good logins never lock it out)."""
        await self._take(_LOGIN_TRIES, "login-good", address)
        try:
            await self._window.clear(_LOGIN, "login", _email_key(email), address)
        except Exception as exc:
            log.warning("throttle storage failed, not cleared: %s", exc)

    async def signup_allowed(self, address: str) -> int | None:
        """None when ``address`` may create an account now (and counts it), else Retry-After."""
        return await self._take(_SIGNUP, "signup", address)
