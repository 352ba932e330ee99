"""JSON Web Tokens, compact serialisation only: verify RS256, ES256 and HS256; sign for tests.

Small on purpose: the authorizer needs exactly "is this token signed by one of our keys, for our
audience, by our issuer, and valid now?", and every line here is on the path that lets a client
in. Rules that close the classic holes:

* the algorithm is taken from the *key*, never trusted from the token: a token's ``alg`` must
  equal its key's, so an RSA public key can never be used as an HMAC secret, and ``none`` is
  never accepted;
* symmetric (HS256) keys come only from local configuration, never from a JWKS URL, and must be
  at least 32 bytes (RFC 7518 section 3.2);
* RSA keys must be at least 2048 bits; ES256 keys must be on P-256;
* the signature is checked before any claim is looked at; ``exp`` is required, ``nbf`` is
  honoured, ``iss`` and ``aud`` must match; numeric dates must be numbers;
* parsing is strict: three unpadded base64url segments, JSON objects without duplicate keys,
  no ``crit`` header (we understand no extension), a bounded length.

Asymmetric algorithms use ``cryptography``; HS256 uses only :mod:`hmac` (so a local set-up with a
shared secret works without it).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import strict_json

RS256 = "RS256"
ES256 = "ES256"
HS256 = "HS256"
ALGORITHMS = (RS256, ES256, HS256)

MAX_TOKEN_BYTES = 8192
MIN_RSA_BITS = 2048
MIN_HMAC_KEY_BYTES = 32
ES256_SIGNATURE_BYTES = 64
DEFAULT_LEEWAY_SECONDS = 30.0

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
    """A private key (or HMAC secret) that signs tokens: tests, the local drill, the canary."""

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


def _b64url_int(jwk: dict[str, Any], name: str) -> int:
    value = jwk.get(name)
    if not isinstance(value, str) or not value:
        raise KeyMaterialError(f"jwk.{name}: required base64url string")
    try:
        return int.from_bytes(b64url_decode(value), "big")
    except ValueError:
        raise KeyMaterialError(f"jwk.{name}: not base64url") from None


def key_from_jwk(jwk: dict[str, Any], *, allow_symmetric: bool) -> VerificationKey | None:
    """One JWK as a verification key; ``None`` for keys not meant for us (``use`` other than
    ``sig``, an algorithm we do not support). :class:`KeyMaterialError` for broken keys."""
    if not isinstance(jwk, dict):
        raise KeyMaterialError("jwk: not a JSON object")
    if jwk.get("use", "sig") != "sig":
        return None
    kty, alg, kid = jwk.get("kty"), jwk.get("alg"), jwk.get("kid")
    if kid is not None and not isinstance(kid, str):
        raise KeyMaterialError("jwk.kid: not a string")
    if kty == "RSA":
        if alg not in (None, RS256):
            return None
        from cryptography.hazmat.primitives.asymmetric import rsa

        numbers = rsa.RSAPublicNumbers(_b64url_int(jwk, "e"), _b64url_int(jwk, "n"))
        try:
            public = numbers.public_key()
        except ValueError as exc:
            raise KeyMaterialError(f"jwk: invalid RSA key ({exc})") from None
        return VerificationKey(RS256, public, kid)
    if kty == "EC":
        if alg not in (None, ES256):
            return None
        if jwk.get("crv") != "P-256":
            return None
        from cryptography.hazmat.primitives.asymmetric import ec

        numbers = ec.EllipticCurvePublicNumbers(
            _b64url_int(jwk, "x"), _b64url_int(jwk, "y"), ec.SECP256R1()
        )
        try:
            public = numbers.public_key()
        except ValueError as exc:
            raise KeyMaterialError(f"jwk: invalid P-256 point ({exc})") from None
        return VerificationKey(ES256, public, kid)
    if kty == "oct":
        if not allow_symmetric:
            # A symmetric key published at a URL would be a shared secret shared with everyone.
            raise KeyMaterialError("jwk: symmetric (oct) keys are accepted only from local config")
        if alg not in (None, HS256):
            return None
        secret = jwk.get("k")
        if not isinstance(secret, str):
            raise KeyMaterialError("jwk.k: required base64url string")
        try:
            raw = b64url_decode(secret)
        except ValueError:
            raise KeyMaterialError("jwk.k: not base64url") from None
        return VerificationKey(HS256, raw, kid)
    return None


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
    """A fresh key pair (or a random 32-byte secret for HS256): tests and the local drill."""
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


# --- Signing ------------------------------------------------------------------------------------


def sign(claims: dict[str, Any], key: SigningKey, *, header: dict[str, Any] | None = None) -> str:
    """A compact JWS of ``claims`` signed with ``key`` (``header`` adds or overrides members)."""
    head: dict[str, Any] = {"alg": key.alg, "typ": "JWT"}
    if key.kid is not None:
        head["kid"] = key.kid
    head.update(header or {})
    signing_input = (
        f"{b64url_encode(_compact_json(head))}.{b64url_encode(_compact_json(claims))}".encode()
    )
    return f"{signing_input.decode()}.{b64url_encode(_signature(key, signing_input))}"


def _compact_json(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _signature(key: SigningKey, signing_input: bytes) -> bytes:
    if key.alg == HS256:
        return hmac.new(key.key, signing_input, hashlib.sha256).digest()
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, padding
    from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

    if key.alg == RS256:
        return key.key.sign(signing_input, padding.PKCS1v15(), hashes.SHA256())
    r, s = decode_dss_signature(key.key.sign(signing_input, ec.ECDSA(hashes.SHA256())))
    return r.to_bytes(32, "big") + s.to_bytes(32, "big")


# --- Verification -------------------------------------------------------------------------------


@dataclass(frozen=True)
class UnverifiedToken:
    """A token split and decoded, *not yet trusted*."""

    header: dict[str, Any]
    claims: dict[str, Any]
    signing_input: bytes
    signature: bytes

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
        signature = b64url_decode(parts[2])
    except ValueError:
        raise MalformedToken("signature: not unpadded base64url") from None
    alg = header.get("alg")
    if not isinstance(alg, str):
        raise MalformedToken("header.alg: required string")
    if alg not in ALGORITHMS:
        raise UnsupportedAlgorithm(f"header.alg: {alg[:20]!r} is not accepted")
    if "crit" in header:
        raise UnsupportedAlgorithm("header.crit: no critical extension is understood")
    kid = header.get("kid")
    if kid is not None and not isinstance(kid, str):
        raise MalformedToken("header.kid: not a string")
    return UnverifiedToken(header, claims, f"{parts[0]}.{parts[1]}".encode("ascii"), signature)


def signature_matches(token: UnverifiedToken, key: VerificationKey) -> bool:
    """Whether ``key`` (whose algorithm must be the token's) produced the token's signature."""
    if key.alg != token.alg:
        return False
    if key.alg == HS256:
        expected = hmac.new(key.key, token.signing_input, hashlib.sha256).digest()
        return hmac.compare_digest(expected, token.signature)
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, padding
    from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

    try:
        if key.alg == RS256:
            key.key.verify(
                token.signature, token.signing_input, padding.PKCS1v15(), hashes.SHA256()
            )
            return True
        if len(token.signature) != ES256_SIGNATURE_BYTES:
            return False
        r = int.from_bytes(token.signature[:32], "big")
        s = int.from_bytes(token.signature[32:], "big")
        key.key.verify(encode_dss_signature(r, s), token.signing_input, ec.ECDSA(hashes.SHA256()))
        return True
    except InvalidSignature:
        return False


def candidate_keys(
    token: UnverifiedToken, keys: Sequence[VerificationKey]
) -> list[VerificationKey]:
    """The keys that may have signed ``token``: same algorithm, and same ``kid`` if it has one."""
    same_alg = [key for key in keys if key.alg == token.alg]
    if token.kid is None:
        return same_alg
    return [key for key in same_alg if key.kid == token.kid]


def _numeric_date(claims: dict[str, Any], name: str, *, required: bool) -> float | None:
    if name not in claims:
        if required:
            raise MissingClaim(f"{name}: required")
        return None
    value = claims[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise MalformedToken(f"{name}: not a NumericDate")
    return float(value)


def check_claims(
    claims: dict[str, Any],
    *,
    issuer: str,
    audience: str,
    now: float,
    leeway: float = DEFAULT_LEEWAY_SECONDS,
) -> None:
    """The registered-claim checks of RFC 7519 section 4.1, for already verified claims."""
    expires = _numeric_date(claims, "exp", required=True)
    not_before = _numeric_date(claims, "nbf", required=False)
    _numeric_date(claims, "iat", required=False)
    if expires is not None and now >= expires + leeway:
        raise ExpiredToken("exp: the token has expired")
    if not_before is not None and now + leeway < not_before:
        raise NotYetValid("nbf: the token is not valid yet")
    if "iss" not in claims:
        raise MissingClaim("iss: required")
    if claims["iss"] != issuer:
        raise WrongIssuer("iss: not the expected issuer")
    if "aud" not in claims:
        raise MissingClaim("aud: required")
    aud = claims["aud"]
    audiences = [aud] if isinstance(aud, str) else aud
    if not isinstance(audiences, list) or not all(isinstance(a, str) for a in audiences):
        raise MalformedToken("aud: expected a string or a list of strings")
    if audience not in audiences:
        raise WrongAudience("aud: the token is not meant for this API")


def verify(
    token: object,
    keys: Sequence[VerificationKey],
    *,
    issuer: str,
    audience: str,
    leeway: float = DEFAULT_LEEWAY_SECONDS,
    now: float | None = None,
) -> dict[str, Any]:
    """The claims of ``token`` if it is valid; a :class:`JwtError` subclass saying why not.

    ``keys`` are the candidates (already resolved, e.g. from a JWKS cache); use
    :func:`split_token` and :func:`candidate_keys` first when the key set depends on the ``kid``.
    """
    parsed = split_token(token)
    return verify_parsed(
        parsed,
        candidate_keys(parsed, keys),
        issuer=issuer,
        audience=audience,
        leeway=leeway,
        now=now,
    )


def verify_parsed(
    parsed: UnverifiedToken,
    candidates: Sequence[VerificationKey],
    *,
    issuer: str,
    audience: str,
    leeway: float = DEFAULT_LEEWAY_SECONDS,
    now: float | None = None,
) -> dict[str, Any]:
    """:func:`verify` for a token already split, given the keys that may have signed it."""
    usable = [key for key in candidates if key.alg == parsed.alg]
    if not usable:
        raise UnknownKey("kid: no configured key matches the token's kid and alg")
    if not any(signature_matches(parsed, key) for key in usable):
        raise BadSignature("signature: does not verify with any configured key")
    check_claims(
        parsed.claims,
        issuer=issuer,
        audience=audience,
        now=time.time() if now is None else now,
        leeway=leeway,
    )
    return parsed.claims
