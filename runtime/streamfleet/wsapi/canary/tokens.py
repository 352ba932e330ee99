"""The canary's own identity: where its token comes from (a static token, a key in the
environment, or a key read from Secrets Manager and read again on a rotation)."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from ... import model
from ...aws import AsyncClient
from ...env import ConfigError
from ...logs import log_event
from .. import jwt
from .config import CLIENT_SETTINGS

# The package's logger: the canary's log lines keep one name whichever module writes them.
logger = logging.getLogger(__package__)

DEFAULT_TOKEN_LIFETIME_SECONDS = 300
DEFAULT_SUBJECT = "canary"


class TokenSource(Protocol):
    """Where the canary's token comes from."""

    async def token(self) -> str | None:
        """A token valid now (``None``: connect without one). Each run starts here."""

    async def refused(self) -> str | None:
        """The Region refused the last token: a token signed with another key not yet refused
        in this run (``None``: there is none)."""

    @property
    def keys(self) -> tuple[jwt.SigningKey, ...]:
        """Every key it may sign with (none known: a static token)."""


# How long a warm canary signs with the key it read before reading the secret again.
KEY_REFRESH_SECONDS = 300.0
# A refused token reads the secret again at once, but not within this long of any read: a
# Region that refuses every handshake (a deleted API mapping answers 403 too) costs one read per
# run at most.
KEY_RELOAD_MIN_SECONDS = 30.0
# One read of the secret, at most: a slow Secrets Manager keeps the key held rather than delay
# the probe that judges the Region.
KEY_READ_TIMEOUT_SECONDS = 2.0


@dataclass(frozen=True)
class StaticToken:
    """A fixed token (or none)."""

    value: str | None

    async def token(self) -> str | None:
        return self.value

    async def refused(self) -> str | None:
        return None

    @property
    def keys(self) -> tuple[jwt.SigningKey, ...]:
        return ()


@dataclass(frozen=True)
class MintedToken:
    """A short-lived token minted for every run with the canary's own signing key."""

    key: jwt.SigningKey
    audience: str
    subject: str = DEFAULT_SUBJECT
    lifetime_seconds: int = DEFAULT_TOKEN_LIFETIME_SECONDS
    issuer: str = model.CANARY_TOKEN_ISSUER

    async def token(self) -> str | None:
        now = int(time.time())
        claims = {
            "sub": self.subject,
            "iss": self.issuer,
            "aud": self.audience,
            "iat": now,
            "exp": now + self.lifetime_seconds,
        }
        return jwt.sign(claims, self.key)

    async def refused(self) -> str | None:
        return None

    @property
    def keys(self) -> tuple[jwt.SigningKey, ...]:
        return (self.key,)


class SecretToken:
    """:class:`MintedToken` whose key is read from Secrets Manager, again once it is
    ``refresh_seconds`` old, and at once (at most every ``reload_min_seconds`` after any read)
    when a token is refused. Each read is bounded by ``read_timeout_seconds``; a read that
    fails or times out keeps the key held. It also keeps the key that signed before the secret
    changed: a token refused with one is tried with the other, and the accepted key signs until
    the secret changes again.

    So a rotation done in either order moves nothing: the authorizer enforcing the new key
    before a warm canary read it (the refusal reads the secret again), or the secret changed
    before the authorizer accepts the new key (the key before it still signs)."""

    def __init__(
        self,
        secrets: AsyncClient,
        secret_arn: str,
        *,
        audience: str,
        subject: str = DEFAULT_SUBJECT,
        clock: Callable[[], float] = time.monotonic,
        refresh_seconds: float = KEY_REFRESH_SECONDS,
        reload_min_seconds: float = KEY_RELOAD_MIN_SECONDS,
        read_timeout_seconds: float = KEY_READ_TIMEOUT_SECONDS,
    ):
        self._secrets = secrets
        self._arn = secret_arn
        self._audience = audience
        self._subject = subject
        self._clock = clock
        self._refresh_seconds = refresh_seconds
        self._reload_min_seconds = reload_min_seconds
        self._read_timeout_seconds = read_timeout_seconds
        self._keys: list[MintedToken] = []  # the secret's key, then the one that signed before
        self._signing: MintedToken | None = None
        self._run_began_with: MintedToken | None = None
        self._refused: list[MintedToken] = []  # refused in this run
        self._secret_text: str | None = None
        self._refreshed_at = -math.inf  # the last scheduled read, done or failed
        self._read_at = -math.inf  # the last read of any kind, done or failed
        self.reads_on_refusal = 0  # reads a refused token asked for (tests and the drill)

    @property
    def keys(self) -> tuple[jwt.SigningKey, ...]:
        return tuple(minted.key for minted in self._keys)

    @property
    def signing_key(self) -> jwt.SigningKey | None:
        """The key the next token is signed with (``None``: none read yet)."""
        return None if self._signing is None else self._signing.key

    @property
    def secret_key(self) -> jwt.SigningKey | None:
        """The key the secret held when it was last read (``None``: never read)."""
        return self._keys[0].key if self._keys else None

    async def token(self) -> str | None:
        self._refused = []
        if self._signing is None or self._clock() - self._refreshed_at >= self._refresh_seconds:
            self._refreshed_at = self._clock()
            try:
                await self._read()
            except Exception as exc:  # TimeoutError included
                if self._signing is None:
                    raise
                self._warn(exc)  # the key read before still signs
        assert self._signing is not None
        self._run_began_with = self._signing
        return await self._signing.token()

    async def refused(self) -> str | None:
        if self._signing is None:
            return None
        self._refused.append(self._signing)
        if self._clock() - self._read_at >= self._reload_min_seconds:
            self.reads_on_refusal += 1
            try:
                await self._read()
            except Exception as exc:
                self._warn(exc)
        for key in self._keys:
            if all(key is not done for done in self._refused):
                self._signing = key
                return await key.token()
        # Nothing else to try: the next run starts from the key this one began with.
        self._signing = self._run_began_with
        return None

    async def _read(self) -> None:
        """Read the secret; a new key goes first and signs, the key that signed is kept."""
        self._read_at = self._clock()
        async with asyncio.timeout(self._read_timeout_seconds):
            secret = await self._secrets.call("get_secret_value", SecretId=self._arn)
        text = secret["SecretString"]
        if text == self._secret_text:
            return
        key = jwt.signing_key_from_text(text)
        self._secret_text = text
        current = self._keys[0] if self._keys else None
        if current is not None and jwt.same_key(key.public(), current.key.public()):
            return  # the same key written again (another encoding): nothing changes
        minted = MintedToken(key, self._audience, self._subject)
        before = self._signing if self._signing is not None else current
        self._keys = [minted, *([before] if before is not None else [])]
        self._signing = minted

    def _warn(self, exc: BaseException) -> None:
        log_event(
            logger,
            logging.WARNING,
            "canary_key",
            decision="error",
            detail="reading the secret failed, signing with the key read before: "
            f"{type(exc).__name__}: {exc}",
        )


def token_source_from_env(
    env: Mapping[str, str], secrets: AsyncClient | None = None
) -> TokenSource:
    """The token source the environment configures (see :mod:`streamfleet.wsapi.canary`)."""
    static = env.get(model.ENV_CANARY_TOKEN, "").strip()
    key_text = env.get(model.ENV_CANARY_SIGNING_KEY, "").strip()
    secret_arn = env.get(model.ENV_CANARY_SIGNING_KEY_SECRET_ARN, "").strip()
    if sum(bool(v) for v in (static, key_text, secret_arn)) > 1:
        raise ConfigError(
            f"{model.ENV_CANARY_TOKEN}, {model.ENV_CANARY_SIGNING_KEY}, "
            f"{model.ENV_CANARY_SIGNING_KEY_SECRET_ARN}",
            "set at most one",
        )
    if static:
        return StaticToken(static)
    if not key_text and not secret_arn:
        return StaticToken(None)
    audience = env.get(model.ENV_JWT_AUDIENCE, "").strip()
    if not audience:
        raise ConfigError(model.ENV_JWT_AUDIENCE, "required to mint the canary's token")
    subject = env.get(model.ENV_CANARY_SUBJECT, "").strip() or DEFAULT_SUBJECT
    if key_text:
        try:
            key = jwt.signing_key_from_text(key_text)
        except jwt.KeyMaterialError as exc:
            raise ConfigError(model.ENV_CANARY_SIGNING_KEY, str(exc)) from None
        return MintedToken(key, audience, subject)
    return SecretToken(
        secrets or AsyncClient("secretsmanager", CLIENT_SETTINGS),
        secret_arn,
        audience=audience,
        subject=subject,
    )
