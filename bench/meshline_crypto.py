"""Meshline client crypto throughput.

- ``seal_per_s``: envelopes sealed per second, each with one recipient box and one
  sender box (content key, AES-GCM payload, Ed25519 envelope signature, two
  X25519+HKDF+AES-GCM boxes), via ``seal_message``.
- ``open_per_s``: envelopes opened per second as a recipient device does
  (signature check, box unwrap, payload decrypt), via ``open_envelope``.
- ``sync_page_1000_s``: one 1,000-record ``message.timeline.sync`` page, parsed from
  JSON bytes and run through ``process_page`` (certificates, envelope signatures,
  key boxes, decryption, content parsing, dedup), in seconds.

    python bench/meshline_crypto.py [--quick] [--seconds S]

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

from gapline.meshline import (
    SyncPage,
    canonical_json,
    open_envelope,
    process_page,
    seal_message,
)
from gapline.meshline.testing import local_device, make_account, sync_page, timeline_entry


def rate(fn, seconds: float) -> tuple[float, int]:
    """Calls per second of ``fn`` over at least ``seconds`` (best of three slices)."""
    best = 0.0
    total = 0
    for _ in range(3):
        n = 0
        start = time.perf_counter()
        deadline = start + seconds / 3
        while True:
            fn()
            n += 1
            now = time.perf_counter()
            if now >= deadline:
                break
        total += n
        best = max(best, n / (now - start))
    return best, total


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--seconds", type=float, default=3.0, help="time per throughput figure")
    args = parser.parse_args()
    seconds = 0.3 if args.quick else args.seconds
    page_records = 50 if args.quick else 1000

    alice, bob = make_account(1), make_account(1)
    sender, recipient = bob.device(0), alice.device(0)
    ctx = bob.context
    content = {
        "$type": "meshline.message.direct",
        "body": {"content_type": "text/plain", "text": "x" * 200},
    }

    def seal():
        return seal_message(
            content,
            device_keys=sender.keys,
            from_=bob.account,
            from_device_id=sender.device_id,
            to=alice.account,
            recipients=[recipient.target],
            senders=[sender.target],
            context=ctx,
            created_at=1_800_000_000,
        )

    print("sealing...", file=sys.stderr)
    seal_rate, sealed_n = rate(seal, seconds)

    params = seal()
    signing = sender.keys.signing_public_key

    def open_one():
        return open_envelope(
            params.envelope,
            params.recipient_boxes[0],
            sender_signing_key=signing,
            box_account=alice.account,
            encryption_key=recipient.keys.encryption_key,
            context=ctx,
        )

    print("opening...", file=sys.stderr)
    open_rate, opened_n = rate(open_one, seconds)

    print(f"building a {page_records}-record page...", file=sys.stderr)
    entries = [timeline_entry(seal(), recipient.device_id, i) for i in range(page_records)]
    raw = canonical_json(sync_page(entries, [sender.certificate]).to_wire())
    local = local_device(alice)
    timings = []
    for _ in range(1 if args.quick else 3):
        start = time.perf_counter()
        page = SyncPage.from_json(raw)
        outcome = process_page(
            page, local=local, relay_id="0x" + "00" * 20, after=-1, known=lambda k: None
        )
        timings.append(time.perf_counter() - start)
        assert len(outcome.accepted) == page_records, outcome.rejected[:1]

    # The crypto floor on this machine right now: what the primitives alone allow.
    from cryptography.hazmat.primitives.asymmetric import ed25519, x25519

    peer = x25519.X25519PrivateKey.generate().public_key()
    eph = x25519.X25519PrivateKey.generate()
    signer = ed25519.Ed25519PrivateKey.generate()
    verifier, sig = signer.public_key(), signer.sign(b"m" * 600)
    prim = seconds / 3
    keygen, _ = rate(x25519.X25519PrivateKey.generate, prim)
    exchange, _ = rate(lambda: eph.exchange(peer), prim)
    sign, _ = rate(lambda: signer.sign(b"m" * 600), prim)
    verify, _ = rate(lambda: verifier.verify(sig, b"m" * 600), prim)
    floor_seal = 1 / (2 / keygen + 2 / exchange + 1 / sign)
    floor_open = 1 / (1 / verify + 1 / exchange)

    figures = {
        "benchmark": "meshline_crypto",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "quick": args.quick,
        "seal_per_s": round(seal_rate, 1),
        "open_per_s": round(open_rate, 1),
        "sealed": sealed_n,
        "opened": opened_n,
        "sync_page_records": page_records,
        "sync_page_bytes": len(raw),
        "sync_page_1000_s": round(min(timings) * (1000 / page_records), 4),
        "sync_page_s": round(min(timings), 4),
        "target_per_s": 5000,
        "primitives_per_s": {
            "x25519_keygen": round(keygen),
            "x25519_exchange": round(exchange),
            "ed25519_sign": round(sign),
            "ed25519_verify": round(verify),
        },
        "crypto_floor_seal_per_s": round(floor_seal, 1),
        "crypto_floor_open_per_s": round(floor_open, 1),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
