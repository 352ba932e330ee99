"""JSON Web Tokens for the authorizer: PyJWT verifies, this module holds the project's policy.

PyJWT (``jwt`` on PyPI as ``PyJWT``) does the cryptography: JWK parsing (:class:`jwt.PyJWK`),
signature verification for exactly the algorithm the *key* names, and the registered-claim
checks it implements well (required claims present, ``iss`` equal, ``aud`` containing ours).
What stays here is the policy around it, every rule on the path that lets a client in:

* **Algorithms** come from the key, never from the token: a key verifies one algorithm
  (RS256, ES256 or HS256, and only those of ``algorithms`` in the :class:`TokenPolicy`), PyJWT is
  called with ``algorithms=[key.alg]``, so ``none`` is never accepted and an RSA public key is
  never used as an HMAC secret (PyJWT also refuses PEM text as a secret).
* **Keys**: symmetric (HS256) keys only from local configuration, never from a JWKS URL, and at
  least 32 bytes (RFC 7518 section 3.2); RSA keys at least 2048 bits; ES256 only on P-256; a
  JWK with ``use`` other than ``sig`` is ignored; keys embedded in a token (``jwk``, ``jku``,
  ``x5u``, ``x5c`` headers) are never looked at.
* **Strict parsing before any key is chosen**: at most ``MAX_TOKEN_BYTES``, three unpadded
  base64url segments, JSON objects without duplicate members (a parser differential between
  this check and another consumer cannot smuggle a second ``alg`` or ``sub``), no ``crit``
  header (no extension is understood, which also rules out RFC 7797 unencoded payloads).
* **Claims** (checked after the signature, on the verified claims): ``exp``, ``iat``, ``sub``,
  ``iss``, ``aud`` required; ``exp``/``nbf``/``iat`` numbers; expired, not-yet-valid (``nbf``)
  and **issued in the future** (``iat`` beyond the leeway) refused; a **maximum lifetime**
  (``exp - iat``); a **token type** check (``typ`` header and ``token_use`` claim, so an ID
  token is not accepted where an access token is expected); an **authorized party** check
  (``azp`` required and allowed when ``aud`` names several audiences, per OIDC Core 3.1.3.7).

Why the time checks are ours and not PyJWT's: PyJWT reads the wall clock itself and has no way
to be given "now", and the authorizer's clock must be injectable to test every boundary
deterministically. They are four comparisons.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jwt as pyjwt
from jwt import exceptions as pyjwt_errors

from .. import strict_json

RS256 = "RS256"
ES256 = "ES256"
HS256 = "HS256"
ALGORITHMS = (RS256, ES256, HS256)

MAX_TOKEN_BYTES = 8192
MIN_RSA_BITS = 2048
MIN_HMAC_KEY_BYTES = 32
DEFAULT_LEEWAY_SECONDS = 30.0
DEFAULT_MAX_LIFETIME_SECONDS = 24 * 60 * 60.0
DEFAULT_TOKEN_USE = "access"
REQUIRED_CLAIMS = ("exp", "iat", "sub", "iss", "aud")
# ``typ`` values that are plain JWTs or access tokens (RFC 7519 5.1, RFC 9068 2.1), compared
# case-insensitively without an ``application/`` prefix (RFC 7515 4.1.9).
ACCESS_TOKEN_TYPES = ("jwt", "at+jwt")

_B64URL = re.compile(r"[A-Za-z0-9_-]*")


# --- Errors -----------------------------------------------------------------------------------


class JwtError(ValueError):
    """A token that must not be accepted. ``reason`` is a short stable code for logs and tests."""

    reason = "invalid"


class MalformedToken(JwtError):
    reason = "malformed"


class UnsupportedAlgorithm(JwtError):
    reason = "unsupported_algorithm"


class UnknownKey(JwtError):
    reason = "unknown_key"


class BadSignature(JwtError):
    reason = "bad_signature"


class ExpiredToken(JwtError):
    reason = "expired"


class NotYetValid(JwtError):
    reason = "not_yet_valid"


class IssuedInFuture(JwtError):
    reason = "issued_in_future"


class LifetimeTooLong(JwtError):
    reason = "lifetime_too_long"


class WrongTokenType(JwtError):
    reason = "wrong_token_type"


class WrongAuthorizedParty(JwtError):
    reason = "wrong_authorized_party"


class WrongIssuer(JwtError):
    reason = "wrong_issuer"


class WrongAudience(JwtError):
    reason = "wrong_audience"


class MissingClaim(JwtError):
    reason = "missing_claim"


class KeyMaterialError(ValueError):
    """Configured key material that cannot be used (a configuration error, not a bad token)."""


# --- base64url and JSON -------------------------------------------------------------------------


def b64url_encode(data: bytes) -> str:
    """Unpadded base64url, as JWS uses it."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    """Strict unpadded base64url; ``ValueError`` on padding, other characters or a bad length."""
    if not _B64URL.fullmatch(text) or len(text) % 4 == 1:
        raise ValueError("not unpadded base64url")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise ValueError("not unpadded base64url") from None


def _json_object(segment: str, what: str) -> dict[str, Any]:
    try:
        raw = b64url_decode(segment)
        value = strict_json.loads(raw.decode("utf-8"))
    except strict_json.DuplicateMember as dup:
        raise MalformedToken(f"{what}: member {dup.member!r} appears more than once") from None
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise MalformedToken(f"{what}: not base64url-encoded JSON") from None
    if not isinstance(value, dict):
        raise MalformedToken(f"{what}: not a JSON object")
    return value


# --- Keys ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VerificationKey:
    """A key that may verify signatures of exactly one algorithm.

    ``key`` is a ``cryptography`` public key for RS256/ES256 and the secret ``bytes`` for HS256.
    """

    alg: str
    key: Any
    kid: str | None = None

    def __post_init__(self) -> None:
        if self.alg not in ALGORITHMS:
            raise KeyMaterialError(f"alg: {self.alg!r} is not one of {', '.join(ALGORITHMS)}")
        _check_key_strength(self.alg, self.key)


@dataclass(frozen=True)
class SigningKey:
    """A private key (or HMAC secret) that signs tokens: tests, the local regions, the canary."""

    alg: str
    key: Any
    kid: str | None = None

    def public(self) -> VerificationKey:
        """The matching verification key (the same secret for HS256)."""
        if self.alg == HS256:
            return VerificationKey(HS256, self.key, self.kid)
        return VerificationKey(self.alg, self.key.public_key(), self.kid)


def _check_key_strength(alg: str, key: Any) -> None:
    if alg == HS256:
        if not isinstance(key, bytes) or len(key) < MIN_HMAC_KEY_BYTES:
            raise KeyMaterialError(f"HS256 secret: at least {MIN_HMAC_KEY_BYTES} bytes required")
        return
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    if alg == RS256:
        if not isinstance(key, rsa.RSAPublicKey):
            raise KeyMaterialError("RS256 key: not an RSA public key")
        if key.key_size < MIN_RSA_BITS:
            raise KeyMaterialError(f"RS256 key: at least {MIN_RSA_BITS} bits required")
    elif alg == ES256:
        if not isinstance(key, ec.EllipticCurvePublicKey):
            raise KeyMaterialError("ES256 key: not an elliptic-curve public key")
        if not isinstance(key.curve, ec.SECP256R1):
            raise KeyMaterialError("ES256 key: curve must be P-256")


# kty (and crv) -> the only algorithm we accept for it.
_KTY_ALGORITHMS = {"RSA": RS256, "EC": ES256, "oct": HS256}


def key_from_jwk(jwk: dict[str, Any], *, allow_symmetric: bool) -> VerificationKey | None:
    """One JWK as a verification key (built by :class:`jwt.PyJWK`); ``None`` for keys not meant
    for us (``use`` other than ``sig``, a key type or algorithm we do not accept).
    :class:`KeyMaterialError` for broken or weak keys."""
    if not isinstance(jwk, dict):
        raise KeyMaterialError("jwk: not a JSON object")
    if jwk.get("use", "sig") != "sig":
        return None
    kty, alg, kid = jwk.get("kty"), jwk.get("alg"), jwk.get("kid")
    if kid is not None and not isinstance(kid, str):
        raise KeyMaterialError("jwk.kid: not a string")
    expected = _KTY_ALGORITHMS.get(kty) if isinstance(kty, str) else None
    if expected is None or alg not in (None, expected):
        return None
    if kty == "EC" and jwk.get("crv") != "P-256":
        return None
    if kty == "oct" and not allow_symmetric:
        # A symmetric key published at a URL would be a shared secret shared with everyone.
        raise KeyMaterialError("jwk: symmetric (oct) keys are accepted only from local config")
    try:
        parsed = pyjwt.PyJWK(jwk, algorithm=expected)
    except (pyjwt_errors.PyJWTError, ValueError, TypeError) as exc:
        raise KeyMaterialError(f"jwk: invalid {kty} key ({exc})") from None
    return VerificationKey(expected, parsed.key, kid)


def keys_from_jwks(
    document: dict[str, Any], *, allow_symmetric: bool
) -> tuple[VerificationKey, ...]:
    """Every usable key of a JWKS document (``{"keys": [...]}``) or of a single JWK.

    Keys that cannot be used (broken, too weak, a symmetric key where none is allowed) are
    skipped, so one bad entry in an identity provider's set does not disable the others; only a
    set with no usable key at all is an error, which then lists why each entry was refused.
    """
    if not isinstance(document, dict):
        raise KeyMaterialError("jwks: not a JSON object")
    entries = document.get("keys", [document])
    if not isinstance(entries, list):
        raise KeyMaterialError("jwks.keys: not a list")
    keys: list[VerificationKey] = []
    refused: list[str] = []
    for entry in entries:
        try:
            key = key_from_jwk(entry, allow_symmetric=allow_symmetric)
        except KeyMaterialError as exc:
            refused.append(str(exc))
            continue
        if key is not None:
            keys.append(key)
    if not keys:
        why = f" ({'; '.join(refused)})" if refused else ""
        raise KeyMaterialError(f"jwks: no usable RS256, ES256 or HS256 signing key{why}")
    return tuple(keys)


def keys_from_pem(pem: str, kid: str | None = None) -> tuple[VerificationKey, ...]:
    """A PEM public key (``BEGIN PUBLIC KEY``): RSA means RS256, P-256 means ES256."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    try:
        public = serialization.load_pem_public_key(pem.encode())
    except ValueError as exc:
        raise KeyMaterialError(f"pem: not a public key ({exc})") from None
    if isinstance(public, rsa.RSAPublicKey):
        return (VerificationKey(RS256, public, kid),)
    if isinstance(public, ec.EllipticCurvePublicKey):
        return (VerificationKey(ES256, public, kid),)
    raise KeyMaterialError("pem: only RSA and P-256 public keys are supported")


def parse_key_material(text: str, *, allow_symmetric: bool = True) -> tuple[VerificationKey, ...]:
    """Keys from configuration text: a JWKS document, a single JWK, or a PEM public key."""
    stripped = text.strip()
    if stripped.startswith("-----BEGIN"):
        return keys_from_pem(stripped)
    try:
        document = json.loads(stripped)
    except ValueError:
        raise KeyMaterialError("keys: neither JSON (JWKS or JWK) nor a PEM public key") from None
    return keys_from_jwks(document, allow_symmetric=allow_symmetric)


def signing_key_from_text(text: str, *, kid: str | None = None) -> SigningKey:
    """A signing key from configuration: a PEM private key (RSA: RS256, P-256: ES256) or an
    ``oct`` JWK (HS256)."""
    stripped = text.strip()
    if stripped.startswith("-----BEGIN"):
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec, rsa

        try:
            private = serialization.load_pem_private_key(stripped.encode(), password=None)
        except (ValueError, TypeError) as exc:
            raise KeyMaterialError(f"pem: not an unencrypted private key ({exc})") from None
        if isinstance(private, rsa.RSAPrivateKey):
            key = SigningKey(RS256, private, kid)
        elif isinstance(private, ec.EllipticCurvePrivateKey):
            key = SigningKey(ES256, private, kid)
        else:
            raise KeyMaterialError("pem: only RSA and P-256 private keys are supported")
        key.public()  # applies the strength checks
        return key
    try:
        jwk = json.loads(stripped)
    except ValueError:
        raise KeyMaterialError("signing key: neither a PEM private key nor a JWK") from None
    public = key_from_jwk(jwk, allow_symmetric=True)
    if public is None or public.alg != HS256:
        raise KeyMaterialError("signing key: a JWK signing key must be an oct (HS256) key")
    return SigningKey(HS256, public.key, kid or public.kid)


def generate_signing_key(alg: str = RS256, kid: str | None = None) -> SigningKey:
    """A fresh key pair (or a random 32-byte secret for HS256): tests and the local regions."""
    if alg == HS256:
        import secrets

        return SigningKey(HS256, secrets.token_bytes(MIN_HMAC_KEY_BYTES), kid)
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    if alg == RS256:
        return SigningKey(
            RS256, rsa.generate_private_key(public_exponent=65537, key_size=2048), kid
        )
    if alg == ES256:
        return SigningKey(ES256, ec.generate_private_key(ec.SECP256R1()), kid)
    raise KeyMaterialError(f"alg: {alg!r} is not one of {', '.join(ALGORITHMS)}")


def public_jwk(key: SigningKey | VerificationKey) -> dict[str, Any]:
    """The public JWK of a key (the secret itself for HS256: only for local configuration)."""
    public = key.public() if isinstance(key, SigningKey) else key
    jwk: dict[str, Any] = {"alg": public.alg, "use": "sig"}
    if public.kid is not None:
        jwk["kid"] = public.kid
    if public.alg == HS256:
        return {**jwk, "kty": "oct", "k": b64url_encode(public.key)}
    numbers = public.key.public_numbers()
    if public.alg == RS256:
        return {**jwk, "kty": "RSA", "n": _int_b64(numbers.n), "e": _int_b64(numbers.e)}
    size = 32
    return {
        **jwk,
        "kty": "EC",
        "crv": "P-256",
        "x": b64url_encode(numbers.x.to_bytes(size, "big")),
        "y": b64url_encode(numbers.y.to_bytes(size, "big")),
    }


def jwks_document(keys: Iterable[SigningKey | VerificationKey]) -> dict[str, Any]:
    """``{"keys": [...]}`` of the public halves of ``keys``."""
    return {"keys": [public_jwk(key) for key in keys]}


def _int_b64(value: int) -> str:
    return b64url_encode(value.to_bytes((value.bit_length() + 7) // 8 or 1, "big"))


def same_key(a: VerificationKey, b: VerificationKey) -> bool:
    """Whether two verification keys are the same key material (``kid`` aside)."""
    return a.alg == b.alg and public_jwk(VerificationKey(a.alg, a.key)) == public_jwk(
        VerificationKey(b.alg, b.key)
    )


# --- Signing ------------------------------------------------------------------------------------


def sign(claims: dict[str, Any], key: SigningKey, *, header: dict[str, Any] | None = None) -> str:
    """A compact JWS of ``claims`` signed with ``key`` by PyJWT (``header`` adds or overrides
    members). The claims are serialised as given, so tests can sign deliberately bad ones."""
    head: dict[str, Any] = {}
    if key.kid is not None:
        head["kid"] = key.kid
    head.update(header or {})
    payload = json.dumps(claims, separators=(",", ":")).encode()
    return pyjwt.PyJWS().encode(payload, key.key, algorithm=key.alg, headers=head or None)


# --- Verification -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenPolicy:
    """What a token must be to be accepted (besides being signed by one of the given keys).

    ``token_use``/``typ``: ``None`` means "if the token says what it is, it must be an access
    token" (``token_use`` absent or ``access``; ``typ`` absent, ``JWT`` or ``at+jwt``); a value
    means the token must carry exactly that ``token_use`` claim / ``typ`` header.
    ``authorized_parties``: the ``azp`` values accepted; empty means only ``audience`` itself.
    A token whose ``aud`` names several audiences must carry an accepted ``azp``; a token with
    one audience and an ``azp`` is checked only when ``authorized_parties`` is configured.
    """

    issuer: str
    audience: str
    leeway_seconds: float = DEFAULT_LEEWAY_SECONDS
    max_lifetime_seconds: float = DEFAULT_MAX_LIFETIME_SECONDS
    token_use: str | None = None
    typ: str | None = None
    authorized_parties: tuple[str, ...] = ()
    algorithms: tuple[str, ...] = field(default=ALGORITHMS)

    def __post_init__(self) -> None:
        unknown = [alg for alg in self.algorithms if alg not in ALGORITHMS]
        if unknown or not self.algorithms:
            given = ", ".join(unknown) or "none given"
            raise ValueError(f"algorithms: {given}; allowed: {', '.join(ALGORITHMS)}")


@dataclass(frozen=True)
class UnverifiedToken:
    """A token split and decoded strictly, *not yet trusted*."""

    token: str
    header: dict[str, Any]
    claims: dict[str, Any]

    @property
    def alg(self) -> str:
        return self.header["alg"]

    @property
    def kid(self) -> str | None:
        return self.header.get("kid")


def split_token(token: object, *, max_bytes: int = MAX_TOKEN_BYTES) -> UnverifiedToken:
    """Parse a compact JWS strictly; :class:`MalformedToken` or :class:`UnsupportedAlgorithm`."""
    if not isinstance(token, str) or not token:
        raise MalformedToken("token: expected a non-empty string")
    if len(token) > max_bytes:
        raise MalformedToken(f"token: longer than {max_bytes} bytes")
    parts = token.split(".")
    if len(parts) != 3:
        raise MalformedToken("token: expected three dot-separated segments (compact JWS)")
    header = _json_object(parts[0], "header")
    claims = _json_object(parts[1], "payload")
    try:
        b64url_decode(parts[2])
    except ValueError:
        raise MalformedToken("signature: not unpadded base64url") from None
    alg = header.get("alg")
    if not isinstance(alg, str):
        raise MalformedToken("header.alg: required string")
    if alg not in ALGORITHMS:
        raise UnsupportedAlgorithm(f"header.alg: {alg[:20]!r} is not accepted")
    if "crit" in header or "b64" in header:
        raise UnsupportedAlgorithm("header.crit: no critical extension is understood")
    kid = header.get("kid")
    if kid is not None and not isinstance(kid, str):
        raise MalformedToken("header.kid: not a string")
    return UnverifiedToken(token, header, claims)


def candidate_keys(
    token: UnverifiedToken, keys: Sequence[VerificationKey]
) -> list[VerificationKey]:
    """The keys that may have signed ``token``: same algorithm, and same ``kid`` if it has one."""
    same_alg = [key for key in keys if key.alg == token.alg]
    if token.kid is None:
        return same_alg
    return [key for key in same_alg if key.kid == token.kid]


def verify(
    token: object,
    keys: Sequence[VerificationKey],
    *,
    issuer: str,
    audience: str,
    leeway: float = DEFAULT_LEEWAY_SECONDS,
    now: float | None = None,
    **rules: Any,
) -> dict[str, Any]:
    """The claims of ``token`` if it is valid; a :class:`JwtError` subclass saying why not.

    ``rules`` are the other :class:`TokenPolicy` fields (``max_lifetime_seconds``,
    ``token_use``, ``typ``, ``authorized_parties``, ``algorithms``).
    """
    policy = TokenPolicy(issuer, audience, leeway_seconds=leeway, **rules)
    parsed = split_token(token)
    return verify_parsed(parsed, candidate_keys(parsed, keys), policy, now=now)


def verify_parsed(
    parsed: UnverifiedToken,
    candidates: Sequence[VerificationKey],
    policy: TokenPolicy,
    *,
    now: float | None = None,
) -> dict[str, Any]:
    """:func:`verify` for a token already split, given the keys that may have signed it."""
    usable = [key for key in candidates if key.alg == parsed.alg and key.alg in policy.algorithms]
    if not usable:
        raise UnknownKey("kid: no configured key matches the token's kid and alg")
    claims: dict[str, Any] | None = None
    for key in usable:
        try:
            claims = pyjwt.decode(
                parsed.token,
                key.key,
                algorithms=[key.alg],  # the key's algorithm, never the token's
                audience=policy.audience,
                issuer=policy.issuer,
                options={
                    "require": list(REQUIRED_CLAIMS),
                    # Ours, against the injectable clock (see the module docstring).
                    "verify_exp": False,
                    "verify_nbf": False,
                    "verify_iat": False,
                },
            )
            break
        except pyjwt_errors.InvalidSignatureError:
            continue
        except pyjwt_errors.PyJWTError as exc:
            raise _translate(exc, parsed) from None
    if claims is None:
        raise BadSignature("signature: does not verify with any configured key")
    check_claims(claims, parsed.header, policy, now=time.time() if now is None else now)
    return claims


def _translate(exc: Exception, parsed: UnverifiedToken) -> JwtError:
    """A PyJWT error raised *after* the signature verified, as one of ours."""
    if isinstance(exc, pyjwt_errors.MissingRequiredClaimError):
        return MissingClaim(f"{exc.claim}: required")
    if isinstance(exc, pyjwt_errors.InvalidIssuerError):
        return WrongIssuer("iss: not the expected issuer")
    if isinstance(exc, pyjwt_errors.InvalidAudienceError):
        aud = parsed.claims.get("aud")
        if not (
            isinstance(aud, str) or (isinstance(aud, list) and all(isinstance(a, str) for a in aud))
        ):
            return MalformedToken("aud: expected a string or a list of strings")
        return WrongAudience("aud: the token is not meant for this API")
    if isinstance(exc, pyjwt_errors.InvalidAlgorithmError | pyjwt_errors.InvalidKeyError):
        return UnknownKey(f"key: {exc}")
    return MalformedToken(f"token: {exc}")


def _numeric_date(claims: dict[str, Any], name: str, *, required: bool) -> float | None:
    if name not in claims:
        if required:
            raise MissingClaim(f"{name}: required")
        return None
    value = claims[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise MalformedToken(f"{name}: not a NumericDate")
    return float(value)


def _normalised_typ(value: str) -> str:
    lowered = value.lower()
    return lowered.removeprefix("application/")


def check_claims(
    claims: dict[str, Any], header: dict[str, Any], policy: TokenPolicy, *, now: float
) -> None:
    """The project's rules on verified claims (PyJWT already checked presence, iss and aud)."""
    expires = _numeric_date(claims, "exp", required=True)
    issued = _numeric_date(claims, "iat", required=True)
    not_before = _numeric_date(claims, "nbf", required=False)
    assert expires is not None and issued is not None
    leeway = policy.leeway_seconds
    if now >= expires + leeway:
        raise ExpiredToken("exp: the token has expired")
    if not_before is not None and now + leeway < not_before:
        raise NotYetValid("nbf: the token is not valid yet")
    if issued > now + leeway:
        raise IssuedInFuture("iat: the token claims to be issued in the future")
    if expires - issued > policy.max_lifetime_seconds:
        raise LifetimeTooLong(
            f"exp - iat: lifetime longer than {policy.max_lifetime_seconds:g} s is not accepted"
        )
    _check_token_type(claims, header, policy)
    _check_authorized_party(claims, policy)


def _check_token_type(claims: dict[str, Any], header: dict[str, Any], policy: TokenPolicy) -> None:
    typ = header.get("typ")
    if typ is not None and not isinstance(typ, str):
        raise MalformedToken("header.typ: not a string")
    if policy.typ is not None:
        if typ is None or _normalised_typ(typ) != _normalised_typ(policy.typ):
            raise WrongTokenType(f"header.typ: expected {policy.typ!r}")
    elif typ is not None and _normalised_typ(typ) not in ACCESS_TOKEN_TYPES:
        raise WrongTokenType("header.typ: not an access token")
    use = claims.get("token_use")
    if use is not None and not isinstance(use, str):
        raise MalformedToken("token_use: not a string")
    if policy.token_use is not None:
        if use != policy.token_use:
            raise WrongTokenType(f"token_use: expected {policy.token_use!r}")
    elif use is not None and use != DEFAULT_TOKEN_USE:
        raise WrongTokenType(f"token_use: {use[:20]!r} is not an access token")


def _check_authorized_party(claims: dict[str, Any], policy: TokenPolicy) -> None:
    aud = claims.get("aud")
    audiences = {aud} if isinstance(aud, str) else set(aud or [])
    azp = claims.get("azp")
    if azp is not None and not isinstance(azp, str):
        raise MalformedToken("azp: not a string")
    allowed = policy.authorized_parties or (policy.audience,)
    if len(audiences) > 1:
        if azp is None:
            raise MissingClaim("azp: required when aud names several audiences")
        if azp not in allowed:
            raise WrongAuthorizedParty("azp: not an authorized party of this API")
    elif azp is not None and policy.authorized_parties and azp not in allowed:
        raise WrongAuthorizedParty("azp: not an authorized party of this API")
