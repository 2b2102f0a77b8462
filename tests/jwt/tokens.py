"""Keys, JWKS files and tokens for tests/jwt.rs, made with PyJWT and cryptography (software
nobody here wrote), so floodgate's verification is checked against real signers.

    tokens.py DIR   writes DIR/jwks.json (an RSA key rsa-1, a P-256 key ec-1, an Ed25519 key
                    ed-1), DIR/jwks-rotated.json (one RSA key rsa-2), and prints a JSON object of
                    named tokens on stdout.
"""

import json
import os
import sys
import time

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

ISSUER = "https://issuer.test/"
AUDIENCE = "rides-api"


def public_jwk(algorithm, key, kid):
    jwk = json.loads(algorithm.to_jwk(key.public_key()))
    jwk["kid"] = kid
    jwk["use"] = "sig"
    return jwk


def b64_false(payload, key):
    """A token whose header says `b64: false` under `crit` (RFC 7797) but whose payload is
    base64url-encoded and signed as usual: what a verifier ignoring `crit` would accept."""
    header = {"alg": "RS256", "kid": "rsa-1", "b64": False, "crit": ["b64"]}
    segments = [
        jwt.utils.base64url_encode(json.dumps(header).encode()),
        jwt.utils.base64url_encode(json.dumps(payload).encode()),
    ]
    signing_input = b".".join(segments)
    signature = RSAAlgorithm(RSAAlgorithm.SHA256).sign(signing_input, key)
    return (signing_input + b"." + jwt.utils.base64url_encode(signature)).decode()


def main(out):
    rsa1 = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    rsa2 = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec1 = ec.generate_private_key(ec.SECP256R1())
    ed1 = ed25519.Ed25519PrivateKey.generate()

    with open(f"{out}/jwks.json", "w") as f:
        json.dump({"keys": [
            public_jwk(RSAAlgorithm, rsa1, "rsa-1"),
            public_jwk(ECAlgorithm, ec1, "ec-1"),
            public_jwk(OKPAlgorithm, ed1, "ed-1"),
        ]}, f)
    with open(f"{out}/jwks-rotated.json", "w") as f:
        json.dump({"keys": [public_jwk(RSAAlgorithm, rsa2, "rsa-2")]}, f)

    # A shared secret for HS256 (identity.jwt.hmac_secret_file), and another that is not it.
    secret = os.urandom(32).hex()
    with open(f"{out}/hmac.secret", "w") as f:
        f.write(secret + "\n")
    with open(f"{out}/short.secret", "w") as f:
        f.write("too-short\n")

    now = int(time.time())

    def claims(sub, **more):
        base = {"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 3600}
        base.update(more)
        return base

    def sign(payload, key, alg, kid):
        return jwt.encode(payload, key, algorithm=alg, headers={"kid": kid})

    def sign_raw(payload):
        # PyJWS signs any payload; PyJWT's encode refuses claims of the wrong type.
        return jwt.api_jws.encode(json.dumps(payload).encode(), rsa1, algorithm="RS256",
                                  headers={"kid": "rsa-1"})

    tokens = {
        "alice": sign(claims("alice"), rsa1, "RS256", "rsa-1"),
        "alice_again": sign(claims("alice", jti="2"), rsa1, "RS256", "rsa-1"),
        "bob": sign(claims("bob"), ec1, "ES256", "ec-1"),
        "carol_pro": sign(claims("carol", plan="pro"), ed1, "EdDSA", "ed-1"),
        # A tier nobody configured:
        "fay_free": sign(claims("fay", plan="free"), rsa1, "RS256", "rsa-1"),
        # Two members of one organisation and one of another (`per: "claim:org"`):
        "erin_acme": sign(claims("erin", org="acme"), rsa1, "RS256", "rsa-1"),
        "frank_acme": sign(claims("frank", org="acme"), ec1, "ES256", "ec-1"),
        "gina_beta": sign(claims("gina", org="beta"), ed1, "EdDSA", "ed-1"),
        # HS256 with the shared secret, and with another:
        "hank_hmac": jwt.encode(claims("hank"), secret, algorithm="HS256"),
        "hank_other_secret": jwt.encode(claims("hank"), os.urandom(32).hex(), algorithm="HS256"),
        # Refused, each for one reason:
        "forged": sign(claims("alice"), stranger, "RS256", "rsa-1"),
        "expired": sign(claims("alice", exp=now - 3600), rsa1, "RS256", "rsa-1"),
        "not_yet": sign(claims("alice", nbf=now + 3600), rsa1, "RS256", "rsa-1"),
        "wrong_audience": sign(claims("alice", aud="billing-api"), rsa1, "RS256", "rsa-1"),
        "wrong_issuer": sign(claims("alice", iss="https://evil.test/"), rsa1, "RS256", "rsa-1"),
        "alg_none": jwt.encode(claims("alice"), None, algorithm="none"),
        "garbage": "not.a.token",
        # Refused by a strict verifier (RFC 7515 §4.1.11, RFC 7797, RFC 7519 §4.1):
        "crit_unknown": jwt.encode(claims("alice"), rsa1, algorithm="RS256",
                                   headers={"kid": "rsa-1", "crit": ["exp-ext"], "exp-ext": 1}),
        "crit_b64": b64_false(claims("alice"), rsa1),
        "iat_future": sign(claims("alice", iat=now + 10 * 365 * 86400), rsa1, "RS256", "rsa-1"),
        "iss_list": sign_raw(claims("alice", iss=[ISSUER])),
        "aud_object": sign_raw(claims("alice", aud={"aud": AUDIENCE})),
        "exp_string": sign_raw(claims("alice", exp=str(now + 3600))),
        # Signed by the key of the rotated set:
        "dave_rotated": sign(claims("dave"), rsa2, "RS256", "rsa-2"),
    }
    json.dump(tokens, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
