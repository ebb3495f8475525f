"""Per-primitive cost of the Meshline public-key crypto: ``cryptography`` against libsodium.

Each primitive a seal or an open makes is timed both ways in one run, in alternating
short slices (``meshline_crypto.interleaved``'s method), so both backends see the same
load on a shared machine; the figure kept is the best slice (µs per call):

- ``x25519_keygen``: a one-time key pair from fresh OS randomness down to the 32
  public-key bytes (``X25519PrivateKey.generate()`` + ``public_bytes_raw()`` against
  ``os.urandom(32)`` + ``crypto_scalarmult_base``).
- ``x25519_exchange``: one shared secret with a parsed, cached peer key (the seal path)
  against ``crypto_scalarmult`` on raw bytes.
- ``x25519_exchange_parse``: the same with the peer key parsed from bytes per call
  (the open path: the ephemeral key is new every message).
- ``ed25519_sign`` / ``ed25519_verify``: a signature over / check of a 700-byte input
  (an envelope's signing input is about that size) with a parsed key against
  ``crypto_sign`` (combined mode, first 64 bytes) / ``crypto_sign_open``.

Before timing, the outputs are cross-checked (same public key, same shared secret,
byte-identical deterministic signatures, both verifiers accept), so a figure never
belongs to a broken call.

    python bench/crypto_primitives.py [--quick] [--seconds S]

Prints one JSON object on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from collections.abc import Callable

import nacl
from cryptography.hazmat.primitives.asymmetric import ed25519, x25519
from nacl import bindings as sodium


def interleaved(fns: dict[str, Callable[[], object]], seconds: float, rounds: int = 12):
    """Best calls/s of each function over alternating slices (wall clock)."""
    best = dict.fromkeys(fns, 0.0)
    slice_s = seconds / rounds / len(fns)
    for _ in range(rounds):
        for name, fn in fns.items():
            n = 0
            start = time.perf_counter()
            while True:
                fn()
                n += 1
                now = time.perf_counter()
                if now - start >= slice_s:
                    break
            best[name] = max(best[name], n / (now - start))
    return best


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--seconds", type=float, default=1.0, help="time per primitive")
    args = parser.parse_args()
    seconds = 0.05 if args.quick else args.seconds

    message = os.urandom(700)
    x_private = x25519.X25519PrivateKey.generate()
    x_raw = x_private.private_bytes_raw()
    peer = x25519.X25519PrivateKey.generate().public_key()
    peer_raw = peer.public_bytes_raw()
    ed_private = ed25519.Ed25519PrivateKey.generate()
    ed_public = ed_private.public_key()
    ed_public_raw = ed_public.public_bytes_raw()
    _, ed_sodium_secret = sodium.crypto_sign_seed_keypair(ed_private.private_bytes_raw())
    signature = ed_private.sign(message)
    signed = signature + message

    # Cross-checks: the two backends must agree on every output before they are timed.
    assert sodium.crypto_scalarmult_base(x_raw) == x_private.public_key().public_bytes_raw()
    assert sodium.crypto_scalarmult(x_raw, peer_raw) == x_private.exchange(peer)
    assert sodium.crypto_sign(message, ed_sodium_secret)[:64] == signature
    assert sodium.crypto_sign_open(signed, ed_public_raw) == message
    ed_public.verify(signature, message)

    def keygen_cryptography() -> bytes:
        return x25519.X25519PrivateKey.generate().public_key().public_bytes_raw()

    def keygen_sodium() -> bytes:
        return sodium.crypto_scalarmult_base(os.urandom(32))

    def parse_exchange_cryptography() -> bytes:
        return x_private.exchange(x25519.X25519PublicKey.from_public_bytes(peer_raw))

    primitives: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
        "x25519_keygen": (keygen_cryptography, keygen_sodium),
        "x25519_exchange": (
            lambda: x_private.exchange(peer),
            lambda: sodium.crypto_scalarmult(x_raw, peer_raw),
        ),
        "x25519_exchange_parse": (
            parse_exchange_cryptography,
            lambda: sodium.crypto_scalarmult(x_raw, peer_raw),
        ),
        "ed25519_sign": (
            lambda: ed_private.sign(message),
            lambda: sodium.crypto_sign(message, ed_sodium_secret)[:64],
        ),
        "ed25519_verify": (
            lambda: ed_public.verify(signature, message),
            lambda: sodium.crypto_sign_open(signed, ed_public_raw),
        ),
    }
    fns: dict[str, Callable[[], object]] = {}
    for name, (with_cryptography, with_sodium) in primitives.items():
        fns[f"{name}/cryptography"] = with_cryptography
        fns[f"{name}/libsodium"] = with_sodium
    print(f"timing {len(primitives)} primitives both ways...", file=sys.stderr)
    rates = interleaved(fns, seconds * len(fns))

    results = {}
    for name in primitives:
        c_us = 1e6 / rates[f"{name}/cryptography"]
        s_us = 1e6 / rates[f"{name}/libsodium"]
        results[name] = {
            "cryptography_us": round(c_us, 2),
            "libsodium_us": round(s_us, 2),
            "faster": "libsodium" if s_us < c_us else "cryptography",
            "speedup": round(c_us / s_us, 2),
        }

    import cryptography

    figures = {
        "benchmark": "crypto_primitives",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "versions": {
            "cryptography": cryptography.__version__,
            "pynacl": nacl.__version__,
        },
        "quick": args.quick,
        "message_bytes": len(message),
        "primitives": results,
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
