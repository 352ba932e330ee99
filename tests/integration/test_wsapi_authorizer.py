"""The ``$connect`` authorizer and its JWT verification.

Unit tests pin every rejection reason; the matrix then runs again through real WebSocket
handshakes against the local API Gateway stand-in (401 for a missing token, 403 for a bad one).
"""

from __future__ import annotations

import http.server
import json
import logging
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from streamfleet import model
from streamfleet.env import ConfigError
from streamfleet.wsapi import jwt
from streamfleet.wsapi.authorizer import (
    Authorizer,
    AuthorizerConfig,
    JwksCache,
    KeysUnavailable,
    StaticKeys,
    Unauthorized,
    extract_token,
    fetch_jwks,
)
from streamfleet_dev.emulator.websocket_gateway import GatewaySettings, LocalGateway

ISSUER = "https://issuer.test"
AUDIENCE = "wsapi-test"
NOW = 1_800_000_000.0
METHOD_ARN = "arn:aws:execute-api:us-east-1:123456789012:abc123/prod/$connect"

RSA_KEY = jwt.generate_signing_key(jwt.RS256, kid="rsa-1")
OTHER_RSA_KEY = jwt.generate_signing_key(jwt.RS256, kid="rsa-1")  # same kid, other key
EC_KEY = jwt.generate_signing_key(jwt.ES256, kid="ec-1")
HS_KEY = jwt.generate_signing_key(jwt.HS256, kid="hs-1")


def claims(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = {
        "sub": "user-1",
        "iss": ISSUER,
        "aud": AUDIENCE,
        "iat": NOW - 10,
        "exp": NOW + 300,
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def verify(token: str, keys: list[jwt.VerificationKey] | None = None, **kwargs: object) -> dict:
    return jwt.verify(
        token,
        keys if keys is not None else [RSA_KEY.public(), EC_KEY.public(), HS_KEY.public()],
        issuer=ISSUER,
        audience=AUDIENCE,
        now=kwargs.pop("now", NOW),
        **kwargs,
    )


# --- JWT ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", [RSA_KEY, EC_KEY, HS_KEY], ids=["RS256", "ES256", "HS256"])
def test_each_algorithm_round_trips(key: jwt.SigningKey) -> None:
    token = jwt.sign(claims(), key)
    assert verify(token)["sub"] == "user-1"


def test_keys_survive_a_jwks_round_trip() -> None:
    document = json.loads(json.dumps(jwt.jwks_document([RSA_KEY, EC_KEY])))
    keys = list(jwt.keys_from_jwks(document, allow_symmetric=False))
    assert {k.alg for k in keys} == {jwt.RS256, jwt.ES256}
    for key in (RSA_KEY, EC_KEY):
        assert verify(jwt.sign(claims(), key), keys)["sub"] == "user-1"


def test_a_pem_public_key_is_accepted() -> None:
    from cryptography.hazmat.primitives import serialization

    pem = (
        RSA_KEY.public()
        .key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        .decode()
    )
    keys = list(jwt.parse_key_material(pem))
    assert verify(jwt.sign(claims(), jwt.SigningKey(jwt.RS256, RSA_KEY.key)), keys)


@pytest.mark.parametrize(
    ("token_claims", "error"),
    [
        (claims(exp=NOW - 31), jwt.ExpiredToken),
        (claims(exp=None), jwt.MissingClaim),
        (claims(exp="tomorrow"), jwt.MalformedToken),
        (claims(exp=True), jwt.MalformedToken),
        (claims(nbf=NOW + 31), jwt.NotYetValid),
        (claims(iss="https://evil.test"), jwt.WrongIssuer),
        (claims(iss=None), jwt.MissingClaim),
        (claims(aud="another-api"), jwt.WrongAudience),
        (claims(aud=["a", "b"]), jwt.WrongAudience),
        (claims(aud=None), jwt.MissingClaim),
        (claims(aud=[1, 2]), jwt.MalformedToken),
    ],
    ids=[
        "expired",
        "no-exp",
        "exp-string",
        "exp-bool",
        "not-yet-valid",
        "wrong-issuer",
        "no-issuer",
        "wrong-audience",
        "wrong-audience-list",
        "no-audience",
        "audience-not-strings",
    ],
)
def test_claims_are_checked(token_claims: dict, error: type[jwt.JwtError]) -> None:
    with pytest.raises(error):
        verify(jwt.sign(token_claims, RSA_KEY))


def test_leeway_allows_small_skew_only() -> None:
    assert verify(jwt.sign(claims(exp=NOW - 29), RSA_KEY))
    assert verify(jwt.sign(claims(nbf=NOW + 29), RSA_KEY))
    assert verify(jwt.sign(claims(iat=NOW + 29), RSA_KEY))
    assert verify(jwt.sign(claims(aud=["other", AUDIENCE], azp=AUDIENCE), RSA_KEY))


def test_a_signature_by_another_key_is_refused() -> None:
    token = jwt.sign(claims(), OTHER_RSA_KEY)
    with pytest.raises(jwt.BadSignature):
        verify(token)


def test_a_tampered_payload_is_refused() -> None:
    header, _, signature = jwt.sign(claims(), RSA_KEY).split(".")
    forged = jwt.b64url_encode(json.dumps(claims(sub="admin")).encode())
    with pytest.raises(jwt.BadSignature):
        verify(f"{header}.{forged}.{signature}")


def hand_signed(header: dict, payload: dict, secret: bytes) -> str:
    """An HS256 JWS built by hand (PyJWT refuses to sign with a PEM as an HMAC secret)."""
    import hashlib
    import hmac

    head = jwt.b64url_encode(json.dumps(header).encode())
    body = jwt.b64url_encode(json.dumps(payload).encode())
    mac = hmac.new(secret, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{jwt.b64url_encode(mac)}"


def test_the_algorithm_comes_from_the_key_not_the_token() -> None:
    # The classic confusion: an HS256 token "signed" with the RSA public key's PEM as secret.
    from cryptography.hazmat.primitives import serialization

    pem = RSA_KEY.public().key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    forged = hand_signed({"alg": "HS256", "typ": "JWT", "kid": "rsa-1"}, claims(), pem)
    with pytest.raises(jwt.UnknownKey):
        verify(forged, [RSA_KEY.public()])
    # Even handed the PEM as an HS256 key, verification refuses (PyJWT's own guard).
    with pytest.raises(jwt.KeyMaterialError):
        jwt.VerificationKey(jwt.HS256, pem[:20])


def test_a_key_embedded_in_the_token_is_never_used() -> None:
    attacker = jwt.generate_signing_key(jwt.RS256, kid="rsa-1")  # our kid, the attacker's key
    for header in (
        {"jwk": jwt.public_jwk(attacker)},
        {"jku": "https://evil.test/jwks.json"},
        {"x5u": "https://evil.test/cert.pem"},
    ):
        forged = jwt.sign(claims(sub="admin"), attacker, header=header)
        with pytest.raises(jwt.BadSignature):
            verify(forged, [RSA_KEY.public()])


@pytest.mark.parametrize(
    ("token_claims", "error"),
    [
        (claims(iat=NOW + 31), jwt.IssuedInFuture),
        (claims(iat=None), jwt.MissingClaim),
        (claims(iat="yesterday"), jwt.MalformedToken),
        (claims(iat=NOW - 10, exp=NOW - 10 + 24 * 3600 + 1), jwt.LifetimeTooLong),
        (claims(token_use="id"), jwt.WrongTokenType),
        (claims(token_use=3), jwt.MalformedToken),
        (claims(aud=["other", AUDIENCE]), jwt.MissingClaim),  # azp required
        (claims(aud=["other", AUDIENCE], azp="other"), jwt.WrongAuthorizedParty),
        (claims(sub=None), jwt.MissingClaim),
        (claims(sub=7), jwt.MalformedToken),
    ],
    ids=[
        "issued-in-the-future",
        "no-iat",
        "iat-string",
        "lifetime-too-long",
        "id-token",
        "token-use-number",
        "several-audiences-without-azp",
        "azp-not-authorized",
        "no-sub",
        "sub-number",
    ],
)
def test_the_new_claim_rules(token_claims: dict, error: type[jwt.JwtError]) -> None:
    with pytest.raises(error):
        verify(jwt.sign(token_claims, RSA_KEY))


def test_token_type_rules() -> None:
    access = jwt.sign(claims(), RSA_KEY, header={"typ": "at+jwt"})
    id_typed = jwt.sign(claims(), RSA_KEY, header={"typ": "id+jwt"})
    plain = jwt.sign(claims(), RSA_KEY)  # typ JWT
    assert verify(access) and verify(plain)  # unconfigured: plain JWTs and access tokens
    with pytest.raises(jwt.WrongTokenType):
        verify(id_typed)
    # Configured (RFC 9068 issuers): only at+jwt, so an ID token (typ JWT) is refused.
    assert verify(access, typ="application/at+jwt")
    with pytest.raises(jwt.WrongTokenType):
        verify(plain, typ="at+jwt")
    # Configured token_use (Cognito): the claim must be there and say it.
    assert verify(jwt.sign(claims(token_use="access"), RSA_KEY), token_use="access")
    with pytest.raises(jwt.WrongTokenType):
        verify(plain, token_use="access")


def test_authorized_party_rules() -> None:
    several = claims(aud=["other", AUDIENCE], azp=AUDIENCE)
    assert verify(jwt.sign(several, RSA_KEY))  # azp defaults to our audience
    client = claims(aud=["other", AUDIENCE], azp="web-client")
    assert verify(jwt.sign(client, RSA_KEY), authorized_parties=("web-client",))
    # One audience: azp is checked only when authorized parties are configured.
    single = jwt.sign(claims(azp="someone"), RSA_KEY)
    assert verify(single)
    with pytest.raises(jwt.WrongAuthorizedParty):
        verify(single, authorized_parties=("web-client",))


def test_the_algorithm_allow_list_applies() -> None:
    with pytest.raises(jwt.UnknownKey):
        verify(jwt.sign(claims(), EC_KEY), algorithms=(jwt.RS256,))
    with pytest.raises(ValueError, match="algorithms"):
        verify(jwt.sign(claims(), RSA_KEY), algorithms=("none",))


@pytest.mark.parametrize(
    "token",
    [
        "",
        "abc",
        "a.b",
        "a.b.c.d",
        "!!!.e30.",
        "e30=.e30.",  # padding is not allowed
        jwt.b64url_encode(b"[1]") + ".e30.",  # header not an object
        jwt.b64url_encode(b'{"alg":"RS256","alg":"HS256"}') + ".e30.",  # duplicate member
        jwt.b64url_encode(b'{"typ":"JWT"}') + ".e30.",  # no alg
        "x" * (jwt.MAX_TOKEN_BYTES + 1),
    ],
)
def test_malformed_tokens_are_refused(token: str) -> None:
    with pytest.raises(jwt.MalformedToken):
        verify(token)


@pytest.mark.parametrize(
    "header", [{"alg": "none"}, {"alg": "RS512"}, {"alg": "RS256", "crit": ["exp"]}]
)
def test_unsupported_algorithms_and_extensions_are_refused(header: dict) -> None:
    head = jwt.b64url_encode(json.dumps(header).encode())
    body = jwt.b64url_encode(json.dumps(claims()).encode())
    with pytest.raises(jwt.UnsupportedAlgorithm):
        verify(f"{head}.{body}.")


def test_an_unknown_kid_is_refused() -> None:
    token = jwt.sign(claims(), jwt.SigningKey(jwt.RS256, RSA_KEY.key, kid="rotated-away"))
    with pytest.raises(jwt.UnknownKey):
        verify(token)


def test_a_token_without_kid_tries_every_key_of_its_algorithm() -> None:
    token = jwt.sign(claims(), jwt.SigningKey(jwt.RS256, RSA_KEY.key))
    assert verify(token, [OTHER_RSA_KEY.public(), RSA_KEY.public()])


def test_es256_signatures_of_the_wrong_length_are_refused() -> None:
    head, body, signature = jwt.sign(claims(), EC_KEY).split(".")
    short = jwt.b64url_encode(jwt.b64url_decode(signature)[:63])
    with pytest.raises(jwt.BadSignature):
        verify(f"{head}.{body}.{short}")


def test_weak_or_misplaced_key_material_is_refused() -> None:
    from cryptography.hazmat.primitives.asymmetric import rsa

    weak = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    with pytest.raises(jwt.KeyMaterialError, match="2048"):
        jwt.VerificationKey(jwt.RS256, weak.public_key())
    with pytest.raises(jwt.KeyMaterialError, match="32 bytes"):
        jwt.VerificationKey(jwt.HS256, b"short")
    oct_jwks = jwt.jwks_document([HS_KEY])
    with pytest.raises(jwt.KeyMaterialError, match="local config"):
        jwt.keys_from_jwks(oct_jwks, allow_symmetric=False)
    with pytest.raises(jwt.KeyMaterialError):
        jwt.parse_key_material("not a key")


def test_one_bad_entry_does_not_disable_a_key_set() -> None:
    from cryptography.hazmat.primitives.asymmetric import rsa

    weak = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    numbers = weak.public_key().public_numbers()
    document = {
        "keys": [
            {
                "kty": "RSA",
                "kid": "weak",
                "n": jwt.b64url_encode(numbers.n.to_bytes(128, "big")),
                "e": "AQAB",
            },
            {"kty": "OKP", "crv": "Ed25519", "x": "abc"},  # not supported: ignored
            jwt.public_jwk(RSA_KEY),
        ]
    }
    keys = jwt.keys_from_jwks(document, allow_symmetric=False)
    assert [k.kid for k in keys] == ["rsa-1"]
    with pytest.raises(jwt.KeyMaterialError, match="2048"):
        jwt.keys_from_jwks({"keys": document["keys"][:1]}, allow_symmetric=False)


def test_signing_keys_load_from_configuration_text() -> None:
    from cryptography.hazmat.primitives import serialization

    pem = EC_KEY.key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    loaded = jwt.signing_key_from_text(pem, kid="ec-1")
    assert verify(jwt.sign(claims(), loaded))
    secret = jwt.signing_key_from_text(json.dumps(jwt.public_jwk(HS_KEY)))
    assert verify(jwt.sign(claims(), secret))


# --- Authorizer ---------------------------------------------------------------------------------


def authorizer(clock: float = NOW) -> Authorizer:
    config = AuthorizerConfig(
        issuer=ISSUER, audience=AUDIENCE, keys=json.dumps(jwt.jwks_document([RSA_KEY]))
    )
    return Authorizer(config, clock=lambda: clock)


def connect_event(*, query: str | None = None, protocols: str | None = None) -> dict:
    headers = {"Host": "abc123.execute-api.us-east-1.amazonaws.com"}
    if protocols is not None:
        headers["Sec-WebSocket-Protocol"] = protocols
    return {
        "type": "REQUEST",
        "methodArn": METHOD_ARN,
        "headers": headers,
        "queryStringParameters": {"token": query} if query is not None else None,
        "requestContext": {"connectionId": "c1", "apiId": "abc123", "routeKey": "$connect"},
    }


GOOD = jwt.sign(claims(), RSA_KEY)
MATRIX = {
    "malformed": "not.a.jwt",
    "expired": jwt.sign(claims(exp=NOW - 3600), RSA_KEY),
    "bad-signature": jwt.sign(claims(), OTHER_RSA_KEY),
    "wrong-audience": jwt.sign(claims(aud="someone-else"), RSA_KEY),
    "wrong-issuer": jwt.sign(claims(iss="https://evil.test"), RSA_KEY),
    "no-sub": jwt.sign(claims(sub=None), RSA_KEY),
}


def test_a_missing_token_raises_unauthorized() -> None:
    with pytest.raises(Unauthorized, match=r"^Unauthorized$"):
        authorizer()(connect_event())
    with pytest.raises(Unauthorized):
        authorizer()(connect_event(protocols=model.WS_APP_SUBPROTOCOL))


def test_only_a_connect_without_a_token_is_counted_for_the_errors_alarm() -> None:
    """The 401 is raised, so Lambda counts it as an error: the authorizer counts it too, under
    its function's name, and nothing else (a deny or an allow is an answer, not an error)."""
    lines: list[str] = []
    config = authorizer().config
    counted = Authorizer(config, clock=lambda: NOW, metrics_out=lines.append)
    context = SimpleNamespace(function_name="ws-authorizer")
    with pytest.raises(Unauthorized):
        counted(connect_event(), context)
    counted(connect_event(query=MATRIX["expired"]), context)
    counted(connect_event(query=GOOD), context)
    (line,) = lines
    document = json.loads(line)
    (directive,) = document["_aws"]["CloudWatchMetrics"]
    assert directive == {
        "Namespace": model.METRIC_NAMESPACE,
        "Dimensions": [[model.METRIC_DIMENSION_FUNCTION]],
        "Metrics": [{"Name": model.METRIC_AUTHORIZER_MISSING_TOKEN, "Unit": "Count"}],
    }
    assert document[model.METRIC_DIMENSION_FUNCTION] == "ws-authorizer"
    assert document[model.METRIC_AUTHORIZER_MISSING_TOKEN] == 1
    assert document["_aws"]["Timestamp"] == int(NOW * 1000)


@pytest.mark.parametrize("case", list(MATRIX))
@pytest.mark.parametrize("transport", ["query", "subprotocol"])
def test_bad_tokens_get_a_deny_policy(case: str, transport: str) -> None:
    token = MATRIX[case]
    event = (
        connect_event(query=token)
        if transport == "query"
        else connect_event(protocols=f"{model.WS_APP_SUBPROTOCOL}, bearer.{token}")
    )
    decision = authorizer()(event)
    statement = decision["policyDocument"]["Statement"][0]
    assert statement == {"Action": "execute-api:Invoke", "Effect": "Deny", "Resource": METHOD_ARN}
    assert "context" not in decision


@pytest.mark.parametrize("transport", ["query", "subprotocol"])
def test_a_valid_token_gets_an_allow_policy_with_the_sub(transport: str) -> None:
    event = (
        connect_event(query=GOOD)
        if transport == "query"
        else connect_event(protocols=f"{model.WS_APP_SUBPROTOCOL}, bearer.{GOOD}")
    )
    decision = authorizer()(event)
    assert decision["principalId"] == "user-1"
    assert decision["policyDocument"]["Statement"][0]["Effect"] == "Allow"
    assert decision["context"] == {
        "sub": "user-1",
        "tokenTransport": transport,
        "principalKind": "user",
        # Where the connection's authorization ends: handlers and fan-out serve nothing after.
        "tokenExpiresAt": NOW + 300,
    }


def test_two_different_tokens_are_ambiguous_and_denied() -> None:
    other = jwt.sign(claims(sub="user-2"), RSA_KEY)
    event = connect_event(query=GOOD, protocols=f"bearer.{other}")
    assert authorizer()(event)["policyDocument"]["Statement"][0]["Effect"] == "Deny"
    same = connect_event(query=GOOD, protocols=f"bearer.{GOOD}")
    assert authorizer()(same)["principalId"] == "user-1"


def test_multi_value_headers_are_read() -> None:
    event = connect_event()
    event["multiValueHeaders"] = {
        "sec-websocket-protocol": [model.WS_APP_SUBPROTOCOL, f"bearer.{GOOD}"]
    }
    assert extract_token(event) == ("subprotocol", GOOD)


def test_configuration_errors_name_the_variable() -> None:
    with pytest.raises(ConfigError, match="JWT_ISSUER"):
        AuthorizerConfig.from_env({"JWT_AUDIENCE": "a", "JWT_KEYS": "{}"})
    with pytest.raises(ConfigError, match="exactly one"):
        AuthorizerConfig.from_env({"JWT_ISSUER": "i", "JWT_AUDIENCE": "a"})
    with pytest.raises(ConfigError, match="JWT_JWKS_URL"):
        AuthorizerConfig.from_env(
            {"JWT_ISSUER": "i", "JWT_AUDIENCE": "a", "JWT_JWKS_URL": "http://example.com/k"}
        )
    with pytest.raises(ConfigError, match="JWT_LEEWAY_SECONDS"):
        AuthorizerConfig.from_env(
            {"JWT_ISSUER": "i", "JWT_AUDIENCE": "a", "JWT_KEYS": "{}", "JWT_LEEWAY_SECONDS": "x"}
        )
    with pytest.raises(ConfigError, match="JWT_KEYS"):
        StaticKeys.parse("garbage")
    base = {"JWT_ISSUER": "i", "JWT_AUDIENCE": "a", "JWT_KEYS": "{}"}
    for name, value in (
        ("JWT_ALGORITHMS", "RS256,none"),
        ("JWT_MAX_LIFETIME_SECONDS", "0"),
        ("JWT_MAX_LIFETIME_SECONDS", "soon"),
    ):
        with pytest.raises(ConfigError, match=name):
            AuthorizerConfig.from_env({**base, name: value})
    with pytest.raises(ConfigError, match=r"JWT_ISSUER.*reserved"):
        AuthorizerConfig.from_env({**base, "JWT_ISSUER": model.CANARY_TOKEN_ISSUER})
    configured = AuthorizerConfig.from_env(
        {
            **base,
            "JWT_ALGORITHMS": "ES256",
            "JWT_TOKEN_USE": "access",
            "JWT_TYP": "at+jwt",
            "JWT_AUTHORIZED_PARTIES": "web, ios",
            "JWT_MAX_LIFETIME_SECONDS": "3600",
        }
    )
    assert configured.policy() == jwt.TokenPolicy(
        issuer="i",
        audience="a",
        max_lifetime_seconds=3600,
        token_use="access",
        typ="at+jwt",
        authorized_parties=("web", "ios"),
        algorithms=("ES256",),
    )
    with pytest.raises(ConfigError, match="JWT_CANARY_KEYS"):
        StaticKeys.parse("garbage", "JWT_CANARY_KEYS")


# --- The canary's identity ----------------------------------------------------------------------

CANARY_KEY = jwt.generate_signing_key(jwt.ES256, kid="canary-1")


def canary_claims(**overrides: object) -> dict[str, object]:
    return claims(
        **{"sub": "probe", "iss": model.CANARY_TOKEN_ISSUER, "exp": NOW + 290, **overrides}
    )


def with_canary(clock: float = NOW) -> Authorizer:
    config = AuthorizerConfig(
        issuer=ISSUER,
        audience=AUDIENCE,
        keys=json.dumps(jwt.jwks_document([RSA_KEY])),
        canary_keys=json.dumps(jwt.jwks_document([CANARY_KEY])),
    )
    return Authorizer(config, clock=lambda: clock)


def effect(decision: dict) -> str:
    return decision["policyDocument"]["Statement"][0]["Effect"]


def test_the_canary_gets_its_own_confined_principal() -> None:
    decision = with_canary()(connect_event(query=jwt.sign(canary_claims(), CANARY_KEY)))
    assert effect(decision) == "Allow"
    assert decision["principalId"] == "canary:probe"
    assert decision["context"]["principalKind"] == "canary"
    assert decision["context"]["sub"] == "canary:probe"


@pytest.mark.parametrize(
    "case",
    [
        "canary-issuer-signed-by-a-user-key",
        "user-issuer-signed-by-the-canary-key",
        "canary-token-living-too-long",
        "user-sub-with-the-reserved-prefix",
        "canary-without-canary-keys",
    ],
)
def test_no_token_crosses_between_the_two_identities(case: str) -> None:
    auth = with_canary()
    token = {
        "canary-issuer-signed-by-a-user-key": lambda: jwt.sign(canary_claims(), RSA_KEY),
        "user-issuer-signed-by-the-canary-key": lambda: jwt.sign(claims(), CANARY_KEY),
        "canary-token-living-too-long": lambda: jwt.sign(canary_claims(exp=NOW + 3600), CANARY_KEY),
        "user-sub-with-the-reserved-prefix": lambda: jwt.sign(claims(sub="canary:x"), RSA_KEY),
        "canary-without-canary-keys": lambda: jwt.sign(canary_claims(), CANARY_KEY),
    }[case]()
    if case == "canary-without-canary-keys":
        auth = authorizer()
    assert effect(auth(connect_event(query=token))) == "Deny"


def test_the_canary_key_must_not_be_a_user_key() -> None:
    shared = json.dumps(jwt.jwks_document([RSA_KEY]))
    with pytest.raises(ConfigError, match="JWT_CANARY_KEYS"):
        Authorizer(AuthorizerConfig(ISSUER, AUDIENCE, keys=shared, canary_keys=shared))


# --- Logs ---------------------------------------------------------------------------------------


def test_decisions_are_logged_as_records_without_the_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    auth = authorizer()
    bad = jwt.sign(claims(), OTHER_RSA_KEY)
    caplog.set_level(logging.DEBUG, logger="streamfleet.wsapi")
    auth(connect_event(protocols=f"{model.WS_APP_SUBPROTOCOL}, bearer.{GOOD}"))
    auth(connect_event(query=bad))
    with pytest.raises(Unauthorized):
        auth(connect_event())
    records = [r for r in caplog.records if getattr(r, "event", None) == "authorize"]
    assert [(r.levelno, r.decision) for r in records] == [
        (logging.INFO, "allow"),
        (logging.WARNING, "deny"),
        (logging.WARNING, "unauthorized"),
    ]
    allow, deny, missing = records
    assert allow.sub == "user-1" and allow.principalKind == "user"
    assert allow.transport == "subprotocol" and allow.connectionId == "c1"
    assert deny.reason == "bad_signature" and missing.reason == "missing_token"
    # No token, and no part of one, in any message or field of any record.
    everything = " ".join(
        f"{r.getMessage()} {json.dumps(r.__dict__, default=str)}" for r in caplog.records
    )
    for token in (GOOD, bad):
        for part in (token, *token.split(".")[1:]):
            assert part not in everything


# --- JWKS URL -----------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def parsed(key: jwt.SigningKey) -> jwt.UnverifiedToken:
    return jwt.split_token(jwt.sign(claims(), key))


def test_jwks_cache_fetches_once_per_lifetime() -> None:
    clock, fetched = FakeClock(), []

    def fetch(url: str, timeout: float) -> dict:
        fetched.append(url)
        return jwt.jwks_document([RSA_KEY])

    cache = JwksCache("https://idp.test/jwks", lifetime=300, fetch=fetch, clock=clock)
    for _ in range(5):
        assert cache.keys_for(parsed(RSA_KEY))
    assert len(fetched) == 1
    clock.now = 301
    assert cache.keys_for(parsed(RSA_KEY))
    assert len(fetched) == 2


def test_jwks_cache_refreshes_early_for_a_new_kid_but_rate_limited() -> None:
    clock, documents = FakeClock(), [jwt.jwks_document([RSA_KEY])]
    rotated = jwt.generate_signing_key(jwt.RS256, kid="rsa-2")
    fetches = []

    def fetch(url: str, timeout: float) -> dict:
        fetches.append(clock.now)
        return documents[-1]

    cache = JwksCache(
        "https://idp.test/jwks", lifetime=300, min_refresh=30, fetch=fetch, clock=clock
    )
    cache.keys_for(parsed(RSA_KEY))
    assert cache.keys_for(parsed(rotated)) == []  # unknown kid, refresh too soon after the first
    clock.now = 31
    documents.append(jwt.jwks_document([RSA_KEY, rotated]))
    assert cache.keys_for(parsed(rotated))  # the issuer rotated: found after one refresh
    assert cache.keys_for(parsed(jwt.generate_signing_key(jwt.RS256, kid="junk"))) == []
    assert fetches == [0, 31]  # garbage kids cannot hammer the URL


def test_jwks_cache_serves_stale_keys_for_a_bounded_time_only() -> None:
    clock, failing = FakeClock(), [False]

    def fetch(url: str, timeout: float) -> dict:
        if failing[0]:
            raise OSError("idp down")
        return jwt.jwks_document([RSA_KEY])

    cache = JwksCache("https://idp.test/jwks", lifetime=300, stale=600, fetch=fetch, clock=clock)
    cache.keys_for(parsed(RSA_KEY))
    failing[0] = True
    clock.now = 850  # past the lifetime, within the grace: cached keys still serve
    assert cache.keys_for(parsed(RSA_KEY))
    clock.now = 901  # past lifetime + grace: no keys, a 500 rather than a wrong answer
    with pytest.raises(KeysUnavailable):
        cache.keys_for(parsed(RSA_KEY))


@pytest.fixture
def jwks_server() -> Iterator[str]:
    """A JWKS document on a real loopback HTTP server; ``/redirect`` answers 302 to it (as a
    hijacked or downgraded endpoint would), ``/huge`` sends more than 1 MiB."""
    body = json.dumps(jwt.jwks_document([RSA_KEY, EC_KEY])).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/redirect":
                self.send_response(302)
                self.send_header("Location", "/.well-known/jwks.json")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            payload = body
            if self.path == "/huge":
                payload = json.dumps({"keys": [], "pad": "x" * (1024 * 1024)}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/.well-known/jwks.json"
    server.shutdown()
    server.server_close()


def test_the_jwks_fetch_follows_no_redirect_and_reads_at_most_1_mib(jwks_server: str) -> None:
    import urllib.error

    base = jwks_server.removesuffix("/.well-known/jwks.json")
    with pytest.raises(urllib.error.HTTPError, match="redirects are not followed"):
        fetch_jwks(f"{base}/redirect", 2.0)
    with pytest.raises(ValueError, match="1 MiB"):
        fetch_jwks(f"{base}/huge", 2.0)
    # Behind the authorizer: a redirected JWKS URL gives no keys at all (HTTP 500, retry).
    config = AuthorizerConfig.from_env(
        {"JWT_ISSUER": ISSUER, "JWT_AUDIENCE": AUDIENCE, "JWT_JWKS_URL": f"{base}/redirect"}
    )
    with pytest.raises(KeysUnavailable):
        Authorizer(config, clock=lambda: NOW)(connect_event(query=GOOD))


def test_an_authorizer_with_a_jwks_url_fetches_real_keys(jwks_server: str) -> None:
    assert len(fetch_jwks(jwks_server, 2.0)["keys"]) == 2
    config = AuthorizerConfig.from_env(
        {"JWT_ISSUER": ISSUER, "JWT_AUDIENCE": AUDIENCE, "JWT_JWKS_URL": jwks_server}
    )
    auth = Authorizer(config, clock=lambda: NOW)
    token = jwt.sign(claims(), EC_KEY)
    assert auth(connect_event(query=token))["principalId"] == "user-1"


# --- Through real handshakes --------------------------------------------------------------------


def accept_connect(event: dict, context: object) -> dict:
    """A ``$connect`` handler that accepts and selects the application subprotocol."""
    assert event["requestContext"]["authorizer"]["sub"] == "user-1"
    return {"statusCode": 200, "headers": {"Sec-WebSocket-Protocol": model.WS_APP_SUBPROTOCOL}}


async def test_the_matrix_through_real_handshakes() -> None:
    auth = Authorizer(
        AuthorizerConfig(
            issuer=ISSUER, audience=AUDIENCE, keys=json.dumps(jwt.jwks_document([RSA_KEY]))
        )
    )
    now = time.time()
    live = {**claims(), "iat": now, "exp": now + 300}
    good = jwt.sign(live, RSA_KEY)
    bad = {
        "malformed": "not.a.jwt",
        "expired": jwt.sign({**live, "exp": now - 3600}, RSA_KEY),
        "bad-signature": jwt.sign(live, OTHER_RSA_KEY),
        "wrong-audience": jwt.sign({**live, "aud": "someone-else"}, RSA_KEY),
    }
    async with LocalGateway(
        GatewaySettings(region="us-east-1"), authorizer=auth, handler=accept_connect
    ) as gateway:
        with pytest.raises(InvalidStatus) as missing:
            await connect(gateway.url, open_timeout=5)
        assert missing.value.response.status_code == 401
        for case, token in bad.items():
            for url, protocols in (
                (f"{gateway.url}/?token={token}", None),
                (gateway.url, [model.WS_APP_SUBPROTOCOL, f"bearer.{token}"]),
            ):
                with pytest.raises(InvalidStatus) as refused:
                    await connect(url, subprotocols=protocols, open_timeout=5)
                assert refused.value.response.status_code == 403, case
        async with connect(f"{gateway.url}/?token={good}", open_timeout=5) as ws:
            assert ws.subprotocol is None  # nothing offered, nothing selected
        protocols = [model.WS_APP_SUBPROTOCOL, f"bearer.{good}"]
        async with connect(gateway.url, subprotocols=protocols, open_timeout=5) as ws:
            # The application protocol is selected, never the bearer entry.
            assert ws.subprotocol == model.WS_APP_SUBPROTOCOL
        assert gateway.stats.rejected == {401: 1, 403: 2 * len(bad)}
