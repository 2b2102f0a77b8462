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

    tokens = {
        "alice": sign(claims("alice"), rsa1, "RS256", "rsa-1"),
        "alice_again": sign(claims("alice", jti="2"), rsa1, "RS256", "rsa-1"),
        "bob": sign(claims("bob"), ec1, "ES256", "ec-1"),
        "carol_pro": sign(claims("carol", plan="pro"), ed1, "EdDSA", "ed-1"),
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
        # Signed by the key of the rotated set:
        "dave_rotated": sign(claims("dave"), rsa2, "RS256", "rsa-2"),
    }
    json.dump(tokens, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
