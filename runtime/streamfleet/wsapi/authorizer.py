"""The Lambda REQUEST authorizer of the WebSocket API's ``$connect`` route.

WebSocket APIs accept only REQUEST authorizers, and browsers cannot set an ``Authorization``
header on a WebSocket, so the signed JWT travels in one of two places (the client chooses):

* the query string: ``wss://host/stage?token=<jwt>``;
* the ``Sec-WebSocket-Protocol`` header, as one offered subprotocol ``bearer.<jwt>`` next to the
  application protocol: ``Sec-WebSocket-Protocol: streamfleet.v1, bearer.<jwt>``. The ``$connect``
  handler then selects ``streamfleet.v1`` (never the token), which browsers require. A JWT is
  three base64url segments joined by dots, all valid subprotocol characters.

Prefer the subprotocol: query strings end up in access logs and browser history.

Outcomes follow API Gateway's conventions: no token at all raises ``Unauthorized`` (HTTP 401);
a token that is present but malformed, expired, not yet valid, issued in the future, too
long-lived, of the wrong type, wrongly signed, for another audience, party or issuer, or
ambiguous (two different tokens) gets a Deny policy (HTTP 403); a valid token gets an Allow
policy with ``principalId = sub`` and ``context = {"sub", "tokenTransport", "principalKind"}``,
which API Gateway hands to ``$connect`` and to every later route of the connection. Key material
that cannot be loaded raises an ordinary exception (HTTP 500): the client should retry.

**Two identities, two key sets.** Users' tokens are verified with the identity provider's keys
(``JWT_KEYS`` or ``JWT_JWKS_URL``) against ``JWT_ISSUER``; ``principalKind`` is ``user``. The
canary's tokens carry ``iss`` = :data:`~streamfleet.model.CANARY_TOKEN_ISSUER` and are verified
with ``JWT_CANARY_KEYS`` only (the canary's own public key, never published in the identity
provider's JWKS), live at most 15 minutes; their principal is ``canary:<sub>`` and
``principalKind`` is ``canary``, which the handlers allow on the ``heartbeat`` route only. So
the canary's key cannot mint a token for any user, and a user token can never be the canary.
A user token whose ``sub`` starts with ``canary:`` is refused (the prefix is reserved).

Configuration (environment; names in :data:`streamfleet.model.AUTHORIZER_ENV`):

* ``JWT_ISSUER``, ``JWT_AUDIENCE`` (required): the exact ``iss`` and one ``aud`` to accept;
* exactly one of ``JWT_KEYS`` (a JWKS document, a single JWK or a PEM public key; an ``oct``
  JWK, i.e. an HS256 shared secret, is accepted here for local use only) or ``JWT_JWKS_URL``
  (https, or http on loopback; fetched without following any redirect; at most 1 MiB; cached
  ``JWT_JWKS_CACHE_SECONDS``, default 300, refreshed early at most every
  ``JWT_JWKS_MIN_REFRESH_SECONDS``, default 30, when a token names an unknown ``kid``; a failed
  refresh keeps serving the old keys for ``JWT_JWKS_STALE_SECONDS``, default 600, no longer);
* ``JWT_LEEWAY_SECONDS`` (default 30, at most 300): clock skew allowed on ``exp``, ``nbf`` and
  ``iat``;
* ``JWT_ALGORITHMS`` (default ``RS256,ES256,HS256``): the algorithms accepted at all;
* ``JWT_MAX_LIFETIME_SECONDS`` (default 86400): the longest ``exp - iat`` accepted;
* ``JWT_TOKEN_USE`` / ``JWT_TYP`` (default unset): when set, the ``token_use`` claim (Cognito:
  ``access``) / the ``typ`` header (RFC 9068: ``at+jwt``) must be exactly this; unset, a token
  that says what it is must say it is an access token (so ID tokens are refused);
* ``JWT_AUTHORIZED_PARTIES`` (comma-separated client ids): the ``azp`` values accepted; a token
  whose ``aud`` lists several audiences must carry one (default: ``JWT_AUDIENCE`` itself);
* ``JWT_CANARY_KEYS`` (optional): the canary's public key(s), as ``JWT_KEYS``;
* ``JWT_READER_CLAIMS`` (optional, comma-separated claim names, e.g. ``groups,tenant``): each
  value of these claims becomes a *reader tag* ``<claim>:<value>`` passed on in the context as
  ``readerTags`` (a JSON array in a string; values that are not valid tags are left out), which
  a START's readers may name (:mod:`streamfleet.readers`).

Every decision is logged as a structured record (:mod:`streamfleet.logs`): allow at INFO, deny and
missing token at WARNING, with the reason; never the token.

The authorizer never calls the other region: each region verifies tokens on its own.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from .. import emf, model, readers
from ..env import ConfigError, EnvironmentCache
from ..logs import configured, log_event
from . import jwt

logger = logging.getLogger(__name__)

DEFAULT_LEEWAY_SECONDS = 30.0
MAX_LEEWAY_SECONDS = 300.0
DEFAULT_JWKS_CACHE_SECONDS = 300.0
DEFAULT_JWKS_MIN_REFRESH_SECONDS = 30.0
DEFAULT_JWKS_STALE_SECONDS = 600.0
DEFAULT_JWKS_TIMEOUT_SECONDS = 2.0
MAX_JWKS_BYTES = 1024 * 1024
MAX_SUB_CHARS = 256

TRANSPORT_QUERY = "query"
TRANSPORT_SUBPROTOCOL = "subprotocol"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class Unauthorized(Exception):
    """Raised for a missing token. API Gateway maps exactly this message to HTTP 401."""

    def __init__(self) -> None:
        super().__init__("Unauthorized")


class KeysUnavailable(RuntimeError):
    """The JWKS URL did not answer and no cached keys are young enough: HTTP 500, retry."""


class Denied(Exception):
    """A token that is present but not acceptable; ``reason`` is a short code for logs."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


# --- Configuration ------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuthorizerConfig:
    """What the authorizer accepts, immutable once read."""

    issuer: str
    audience: str
    keys: str | None = None
    jwks_url: str | None = None
    leeway_seconds: float = DEFAULT_LEEWAY_SECONDS
    jwks_cache_seconds: float = DEFAULT_JWKS_CACHE_SECONDS
    jwks_min_refresh_seconds: float = DEFAULT_JWKS_MIN_REFRESH_SECONDS
    jwks_stale_seconds: float = DEFAULT_JWKS_STALE_SECONDS
    jwks_timeout_seconds: float = DEFAULT_JWKS_TIMEOUT_SECONDS
    algorithms: tuple[str, ...] = jwt.ALGORITHMS
    max_lifetime_seconds: float = jwt.DEFAULT_MAX_LIFETIME_SECONDS
    token_use: str | None = None
    typ: str | None = None
    authorized_parties: tuple[str, ...] = ()
    canary_keys: str | None = None
    reader_claims: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.issuer:
            raise ConfigError(model.ENV_JWT_ISSUER, "required")
        if self.issuer == model.CANARY_TOKEN_ISSUER:
            raise ConfigError(
                model.ENV_JWT_ISSUER, f"{model.CANARY_TOKEN_ISSUER!r} is reserved for the canary"
            )
        if not self.audience:
            raise ConfigError(model.ENV_JWT_AUDIENCE, "required")
        if (self.keys is None) == (self.jwks_url is None):
            raise ConfigError(
                f"{model.ENV_JWT_KEYS}, {model.ENV_JWT_JWKS_URL}", "set exactly one of them"
            )
        if self.jwks_url is not None:
            check_jwks_url(self.jwks_url)
        if not 0 <= self.leeway_seconds <= MAX_LEEWAY_SECONDS:
            raise ConfigError(
                model.ENV_JWT_LEEWAY_SECONDS, f"must be between 0 and {MAX_LEEWAY_SECONDS:g}"
            )
        bad = [alg for alg in self.algorithms if alg not in jwt.ALGORITHMS]
        if bad or not self.algorithms:
            raise ConfigError(
                model.ENV_JWT_ALGORITHMS,
                f"{', '.join(bad) or 'empty'}; only {', '.join(jwt.ALGORITHMS)} are accepted "
                "(never none)",
            )
        if not self.max_lifetime_seconds > 0:
            raise ConfigError(model.ENV_JWT_MAX_LIFETIME_SECONDS, "must be above zero")
        for claim in self.reader_claims:
            try:
                readers.check_claim_name(model.ENV_JWT_READER_CLAIMS, claim)
            except ValueError as exc:
                # check_claim_name's message starts with the variable it was given
                raise ConfigError(
                    model.ENV_JWT_READER_CLAIMS, str(exc).partition(": ")[2]
                ) from None

    def policy(self) -> jwt.TokenPolicy:
        """What a user's token must be."""
        return jwt.TokenPolicy(
            issuer=self.issuer,
            audience=self.audience,
            leeway_seconds=self.leeway_seconds,
            max_lifetime_seconds=self.max_lifetime_seconds,
            token_use=self.token_use,
            typ=self.typ,
            authorized_parties=self.authorized_parties,
            algorithms=self.algorithms,
        )

    def canary_policy(self) -> jwt.TokenPolicy:
        """What the canary's token must be: our own issuer and a short life."""
        return jwt.TokenPolicy(
            issuer=model.CANARY_TOKEN_ISSUER,
            audience=self.audience,
            leeway_seconds=self.leeway_seconds,
            max_lifetime_seconds=min(
                self.max_lifetime_seconds, model.CANARY_MAX_TOKEN_LIFETIME_SECONDS
            ),
            algorithms=self.algorithms,
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AuthorizerConfig:
        """Read and validate the environment (see the module docstring)."""
        env = os.environ if env is None else env

        def seconds(name: str, default: float) -> float:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                value = float(raw)
            except ValueError:
                raise ConfigError(name, f"{raw!r} is not a number") from None
            if not value >= 0 or value == float("inf"):
                raise ConfigError(name, "must be a finite number, zero or more")
            return value

        def listed(name: str) -> tuple[str, ...]:
            return tuple(v.strip() for v in env.get(name, "").split(",") if v.strip())

        max_lifetime = seconds(model.ENV_JWT_MAX_LIFETIME_SECONDS, jwt.DEFAULT_MAX_LIFETIME_SECONDS)
        return cls(
            issuer=env.get(model.ENV_JWT_ISSUER, "").strip(),
            audience=env.get(model.ENV_JWT_AUDIENCE, "").strip(),
            keys=env.get(model.ENV_JWT_KEYS, "").strip() or None,
            jwks_url=env.get(model.ENV_JWT_JWKS_URL, "").strip() or None,
            leeway_seconds=seconds(model.ENV_JWT_LEEWAY_SECONDS, DEFAULT_LEEWAY_SECONDS),
            jwks_cache_seconds=seconds(
                model.ENV_JWT_JWKS_CACHE_SECONDS, DEFAULT_JWKS_CACHE_SECONDS
            ),
            jwks_min_refresh_seconds=seconds(
                model.ENV_JWT_JWKS_MIN_REFRESH_SECONDS, DEFAULT_JWKS_MIN_REFRESH_SECONDS
            ),
            jwks_stale_seconds=seconds(
                model.ENV_JWT_JWKS_STALE_SECONDS, DEFAULT_JWKS_STALE_SECONDS
            ),
            jwks_timeout_seconds=seconds(
                model.ENV_JWT_JWKS_TIMEOUT_SECONDS, DEFAULT_JWKS_TIMEOUT_SECONDS
            ),
            algorithms=listed(model.ENV_JWT_ALGORITHMS) or jwt.ALGORITHMS,
            max_lifetime_seconds=max_lifetime,
            token_use=env.get(model.ENV_JWT_TOKEN_USE, "").strip() or None,
            typ=env.get(model.ENV_JWT_TYP, "").strip() or None,
            authorized_parties=listed(model.ENV_JWT_AUTHORIZED_PARTIES),
            canary_keys=env.get(model.ENV_JWT_CANARY_KEYS, "").strip() or None,
            reader_claims=listed(model.ENV_JWT_READER_CLAIMS),
        )


def check_jwks_url(url: str) -> str:
    """An https URL, or http on a loopback host (local servers only)."""
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return url
    if parts.scheme == "http" and parts.hostname in LOOPBACK_HOSTS:
        return url
    raise ConfigError(model.ENV_JWT_JWKS_URL, "must be an https URL (http only on loopback)")


# --- Key sources --------------------------------------------------------------------------------


class KeySource(Protocol):
    """Where verification keys come from."""

    def keys_for(self, token: jwt.UnverifiedToken) -> Sequence[jwt.VerificationKey]:
        """The keys that may have signed ``token`` (same ``alg``, same ``kid`` if it has one)."""


@dataclass(frozen=True)
class StaticKeys:
    """Keys given in configuration (``JWT_KEYS``)."""

    keys: tuple[jwt.VerificationKey, ...]

    @classmethod
    def parse(cls, text: str, variable: str = model.ENV_JWT_KEYS) -> StaticKeys:
        try:
            return cls(jwt.parse_key_material(text, allow_symmetric=True))
        except jwt.KeyMaterialError as exc:
            raise ConfigError(variable, str(exc)) from None

    def keys_for(self, token: jwt.UnverifiedToken) -> Sequence[jwt.VerificationKey]:
        return jwt.candidate_keys(token, self.keys)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Refuses every redirect: a JWKS URL is configured exactly, and following a redirect would
    let whoever controls the response (or a downgrade to http) choose our trusted keys."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[override]
        raise urllib.error.HTTPError(
            req.full_url, code, f"JWT_JWKS_URL: redirects are not followed ({code})", headers, fp
        )


# No redirects, and no proxy from the environment either: the keys come from the URL itself.
_JWKS_OPENER = urllib.request.build_opener(_NoRedirects(), urllib.request.ProxyHandler({}))


def fetch_jwks(url: str, timeout: float) -> dict[str, Any]:
    """GET a JWKS document: at most 1 MiB of JSON, status 200, no redirect followed."""
    check_jwks_url(url)
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    with _JWKS_OPENER.open(request, timeout=timeout) as response:
        if response.status != 200:
            raise ValueError(f"JWT_JWKS_URL: HTTP {response.status}, expected 200")
        body = response.read(MAX_JWKS_BYTES + 1)
    if len(body) > MAX_JWKS_BYTES:
        raise ValueError("JWKS document larger than 1 MiB")
    return json.loads(body)


class JwksCache:
    """Keys from a JWKS URL, cached for a bounded time; thread-safe (the local gateway calls the
    authorizer from several threads, Lambda from one).

    * Fresh for ``lifetime`` seconds after a successful fetch.
    * A token naming a ``kid`` we do not know triggers an early refresh (the issuer rotated its
      keys), at most once per ``min_refresh`` seconds so garbage tokens cannot hammer the URL.
    * When a refresh fails, keys younger than ``lifetime + stale`` are still used; older keys are
      never used: :class:`KeysUnavailable`.
    """

    def __init__(
        self,
        url: str,
        *,
        lifetime: float = DEFAULT_JWKS_CACHE_SECONDS,
        min_refresh: float = DEFAULT_JWKS_MIN_REFRESH_SECONDS,
        stale: float = DEFAULT_JWKS_STALE_SECONDS,
        timeout: float = DEFAULT_JWKS_TIMEOUT_SECONDS,
        fetch: Callable[[str, float], dict[str, Any]] = fetch_jwks,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.url = url
        self.lifetime = lifetime
        self.min_refresh = min_refresh
        self.stale = stale
        self.timeout = timeout
        self._fetch = fetch
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: tuple[jwt.VerificationKey, ...] = ()
        self._fetched_at: float | None = None  # last successful fetch
        self._attempted_at: float | None = None  # last attempt, successful or not
        self.fetches = 0

    def keys_for(self, token: jwt.UnverifiedToken) -> Sequence[jwt.VerificationKey]:
        with self._lock:
            now = self._clock()
            if self._fetched_at is None or now >= self._fetched_at + self.lifetime:
                self._refresh(now)
            candidates = jwt.candidate_keys(token, self._keys)
            if (
                not candidates
                and token.kid is not None
                and (self._attempted_at is None or now >= self._attempted_at + self.min_refresh)
            ):
                self._refresh(now)
                candidates = jwt.candidate_keys(token, self._keys)
            return candidates

    def _refresh(self, now: float) -> None:
        self._attempted_at = now
        self.fetches += 1
        try:
            keys = jwt.keys_from_jwks(self._fetch(self.url, self.timeout), allow_symmetric=False)
        except Exception as exc:
            young_enough = (
                self._fetched_at is not None and now < self._fetched_at + self.lifetime + self.stale
            )
            log_event(
                logger,
                logging.WARNING,
                "jwks_refresh",
                decision="failed",
                detail=f"{type(exc).__name__}: {exc}",
                fallback="cached keys" if young_enough else "no usable keys",
            )
            if not young_enough:
                raise KeysUnavailable(f"JWT_JWKS_URL: no usable keys ({exc})") from None
            return
        self._keys = keys
        self._fetched_at = now


# --- Token extraction ---------------------------------------------------------------------------


def _header_values(event: Mapping[str, Any], name: str) -> list[str]:
    """Every value of a header, case-insensitively, from ``multiValueHeaders`` or ``headers``."""
    wanted = name.lower()
    multi = event.get("multiValueHeaders") or {}
    values = [v for key, vs in multi.items() if key.lower() == wanted for v in (vs or [])]
    if values:
        return values
    single = event.get("headers") or {}
    return [value for key, value in single.items() if key.lower() == wanted and value is not None]


def offered_subprotocols(event: Mapping[str, Any]) -> list[str]:
    """The subprotocols the client offered, in order (``Sec-WebSocket-Protocol``)."""
    return [
        entry.strip()
        for value in _header_values(event, "Sec-WebSocket-Protocol")
        for entry in str(value).split(",")
        if entry.strip()
    ]


def extract_token(event: Mapping[str, Any]) -> tuple[str, str]:
    """``(transport, token)`` from the query string or the subprotocol list.

    :class:`Unauthorized` when there is none; :class:`Denied` when the request carries several
    different tokens (which one would we be authorising?).
    """
    name = model.WS_TOKEN_QUERY_PARAMETER
    multi_query = (event.get("multiValueQueryStringParameters") or {}).get(name) or []
    query_value = (event.get("queryStringParameters") or {}).get(name)
    query_tokens = {str(v) for v in multi_query} | ({str(query_value)} if query_value else set())
    prefix = model.WS_BEARER_SUBPROTOCOL_PREFIX
    protocol_tokens = {
        entry[len(prefix) :] for entry in offered_subprotocols(event) if entry.startswith(prefix)
    }
    tokens = {token for token in query_tokens | protocol_tokens if token}
    if not tokens:
        raise Unauthorized()
    if len(tokens) > 1:
        raise Denied("ambiguous", "more than one different token in the request")
    token = tokens.pop()
    return (TRANSPORT_SUBPROTOCOL if token in protocol_tokens else TRANSPORT_QUERY), token


# --- Policies -----------------------------------------------------------------------------------


def policy(principal_id: str, effect: str, resource: str, context: dict | None = None) -> dict:
    """An authorizer response: ``execute-api:Invoke`` with ``effect`` on ``resource``."""
    document: dict[str, Any] = {
        "principalId": principal_id,
        "policyDocument": {
            "Version": "2012-10-17",
            "Statement": [{"Action": "execute-api:Invoke", "Effect": effect, "Resource": resource}],
        },
    }
    if context:
        document["context"] = context
    return document


def check_subject(claims: Mapping[str, Any]) -> str:
    """The ``sub`` claim: required, a non-empty string of at most 256 printable characters (it
    becomes part of a DynamoDB key and of log lines)."""
    sub = claims.get("sub")
    if not isinstance(sub, str) or not sub:
        raise Denied(jwt.MissingClaim.reason, "sub: required non-empty string")
    if len(sub) > MAX_SUB_CHARS or not sub.isprintable():
        raise Denied(jwt.MalformedToken.reason, "sub: too long or not printable")
    return sub


@dataclass(frozen=True)
class Principal:
    """Who a valid token speaks for."""

    id: str  # the principalId and the context's sub
    kind: str  # model.WS_PRINCIPAL_USER or model.WS_PRINCIPAL_CANARY
    transport: str
    reader_tags: tuple[str, ...] = ()  # from JWT_READER_CLAIMS (users only)
    expires_at: int | None = None  # the token's exp (epoch seconds)


# --- The authorizer -----------------------------------------------------------------------------


class Authorizer:
    """Verifies the token of a ``$connect`` request and answers with an IAM policy.

    ``clock`` is the wall clock (epoch seconds); ``metrics_out`` receives each EMF line (one per
    connect without a token, see :func:`missing_token_metric`).
    """

    def __init__(
        self,
        config: AuthorizerConfig,
        keys: KeySource | None = None,
        *,
        canary_keys: KeySource | None = None,
        clock: Callable[[], float] = time.time,
        metrics_out: Callable[[str], None] = emf.write,
    ):
        self.config = config
        self._metrics_out = metrics_out
        if canary_keys is None and config.canary_keys is not None:
            canary_keys = StaticKeys.parse(config.canary_keys, model.ENV_JWT_CANARY_KEYS)
        self.canary_keys = canary_keys
        if keys is None:
            if config.keys is not None:
                keys = StaticKeys.parse(config.keys)
            else:
                assert config.jwks_url is not None
                keys = JwksCache(
                    config.jwks_url,
                    lifetime=config.jwks_cache_seconds,
                    min_refresh=config.jwks_min_refresh_seconds,
                    stale=config.jwks_stale_seconds,
                    timeout=config.jwks_timeout_seconds,
                )
        self.keys = keys
        if isinstance(self.keys, StaticKeys) and isinstance(self.canary_keys, StaticKeys):
            shared = [
                key
                for key in self.canary_keys.keys
                if any(jwt.same_key(key, user_key) for user_key in self.keys.keys)
            ]
            if shared:
                raise ConfigError(
                    model.ENV_JWT_CANARY_KEYS,
                    f"shares a key with {model.ENV_JWT_KEYS}; the canary needs a key of its own",
                )
        self._policy = config.policy()
        self._canary_policy = config.canary_policy()
        self._clock = clock

    def _count_missing_token(self, context: Any, received_at: float) -> None:
        # Raising is the only way to answer 401, and Lambda counts it as an error: the errors
        # alarm subtracts this count, so connects without a token do not hold it in ALARM.
        # Stamped with the invocation's start, as Lambda's own Errors point is.
        name = getattr(context, "function_name", "")  # Lambda's context always has it
        if name:
            self._metrics_out(missing_token_metric(name, timestamp_ms=int(received_at * 1000)))

    def __call__(self, event: Mapping[str, Any], context: Any = None) -> dict[str, Any]:
        """The Lambda entry point's logic: a policy, or :class:`Unauthorized` raised."""
        received_at = self._clock()
        resource = str(event.get("methodArn") or "*")
        secrets = _token_fragments(event)
        try:
            principal = self.authenticate(event)
        except Denied as denied:
            _log_decision(
                logging.WARNING,
                "deny",
                event,
                secrets,
                reason=denied.reason,
                detail=denied.detail,
            )
            return policy("anonymous", "Deny", resource)
        except Unauthorized:
            _log_decision(logging.WARNING, "unauthorized", event, secrets, reason="missing_token")
            self._count_missing_token(context, received_at)
            raise
        except Exception as exc:  # keys unavailable, broken configuration: HTTP 500, retry
            _log_decision(
                logging.WARNING,
                "error",
                event,
                secrets,
                reason=type(exc).__name__,
                detail=str(exc),
            )
            raise
        _log_decision(
            logging.INFO,
            "allow",
            event,
            secrets,
            sub=principal.id,
            principalKind=principal.kind,
            transport=principal.transport,
        )
        context = {
            model.WS_CONTEXT_SUB: principal.id,
            model.WS_CONTEXT_TOKEN_TRANSPORT: principal.transport,
            model.WS_CONTEXT_PRINCIPAL_KIND: principal.kind,
        }
        if self.config.reader_claims and principal.kind == model.WS_PRINCIPAL_USER:
            context[model.WS_CONTEXT_READER_TAGS] = readers.encode_tags(principal.reader_tags)
        if principal.expires_at is not None:
            context[model.WS_CONTEXT_TOKEN_EXPIRES_AT] = principal.expires_at
        return policy(principal.id, "Allow", resource, context)

    def authenticate(self, event: Mapping[str, Any]) -> Principal:
        """The principal of a valid token; :class:`Unauthorized` or :class:`Denied`."""
        transport, token = extract_token(event)
        try:
            parsed = jwt.split_token(token)
            canary = (
                self.canary_keys is not None
                and parsed.claims.get("iss") == model.CANARY_TOKEN_ISSUER
            )
            # The issuer picks the key set; the signature then has to match that set, so a
            # token cannot choose to be verified by keys other than its issuer's.
            if canary:
                assert self.canary_keys is not None
                claims = jwt.verify_parsed(
                    parsed,
                    self.canary_keys.keys_for(parsed),
                    self._canary_policy,
                    now=self._clock(),
                )
            else:
                claims = jwt.verify_parsed(
                    parsed, self.keys.keys_for(parsed), self._policy, now=self._clock()
                )
        except jwt.JwtError as exc:
            raise Denied(exc.reason, str(exc)) from None
        sub = check_subject(claims)
        if canary:
            return Principal(
                model.CANARY_PRINCIPAL_PREFIX + sub, model.WS_PRINCIPAL_CANARY, transport
            )
        if sub.startswith(model.CANARY_PRINCIPAL_PREFIX):
            raise Denied(
                "reserved_subject", f"sub: the prefix {model.CANARY_PRINCIPAL_PREFIX!r} is reserved"
            )
        tags = readers.claim_tags(claims, self.config.reader_claims)
        return Principal(
            sub, model.WS_PRINCIPAL_USER, transport, tuple(tags), expires_at=int(claims["exp"])
        )


def _token_fragments(event: Mapping[str, Any]) -> list[str]:
    """Everything in the request that is (part of) a bearer token, to keep out of the logs."""
    name = model.WS_TOKEN_QUERY_PARAMETER
    values = [str(v) for v in (event.get("multiValueQueryStringParameters") or {}).get(name) or []]
    single = (event.get("queryStringParameters") or {}).get(name)
    if single:
        values.append(str(single))
    prefix = model.WS_BEARER_SUBPROTOCOL_PREFIX
    values += [e[len(prefix) :] for e in offered_subprotocols(event) if e.startswith(prefix)]
    return [*values, *(part for value in values for part in value.split("."))]


def missing_token_metric(function_name: str, *, timestamp_ms: int | None = None) -> str:
    """The EMF line counting one connect without a token, under the function's own
    ``FunctionName`` dimension (where Lambda's ``Errors`` metric counts it too)."""
    return emf.line(
        emf.document(
            model.METRIC_NAMESPACE,
            {model.METRIC_DIMENSION_FUNCTION: function_name},
            {model.METRIC_AUTHORIZER_MISSING_TOKEN: (1, emf.COUNT)},
            timestamp_ms=timestamp_ms,
        )
    )


def _log_decision(
    level: int, decision: str, event: Mapping[str, Any], secrets: list[str], **fields: Any
) -> None:
    context = event.get("requestContext") or {}
    # Never the token itself (a bearer credential): log_event redacts any value containing it.
    log_event(
        logger,
        level,
        "authorize",
        secrets=secrets,
        decision=decision,
        connectionId=context.get("connectionId"),
        apiId=context.get("apiId"),
        sourceIp=(context.get("identity") or {}).get("sourceIp"),
        **fields,
    )


# --- Lambda entry point -------------------------------------------------------------------------

_AUTHORIZER = EnvironmentCache(
    model.AUTHORIZER_ENV, lambda: Authorizer(AuthorizerConfig.from_env())
)


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Lambda entry point (``streamfleet.wsapi.authorizer.handler``).

    The authorizer (and its JWKS cache) lives as long as the container; it is rebuilt only if the
    environment changes (tests).
    """
    return configured(_AUTHORIZER, logger, context)(event, context)
