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
from collections.abc import Callable

from gapline.meshline import (
    SyncPage,
    canonical_json,
    open_envelope,
    process_page,
    seal_message,
)
from gapline.meshline.testing import local_device, make_account, sync_page, timeline_entry


def interleaved(
    fns: dict[str, Callable[[], object]], seconds: float, rounds: int = 8
) -> dict[str, float]:
    """Best calls/s of each function, measured in alternating short slices.

    The machine is shared: alternating slices exposes every function to the same
    load, so comparisons (e.g. seal against its crypto floor) stay fair.
    """
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

    recipient_targets, sender_targets = [recipient.target], [sender.target]

    def seal():
        return seal_message(
            content,
            device_keys=sender.keys,
            from_=bob.account,
            from_device_id=sender.device_id,
            to=alice.account,
            recipients=recipient_targets,
            senders=sender_targets,
            context=ctx,
            created_at=1_800_000_000,
        )

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

    # The crypto floor: the primitives one seal / one open needs, with nothing else.
    from cryptography.hazmat.primitives.asymmetric import ed25519, x25519

    peer = x25519.X25519PrivateKey.generate().public_key()
    eph = x25519.X25519PrivateKey.generate()
    signer = ed25519.Ed25519PrivateKey.generate()
    verifier, sig = signer.public_key(), signer.sign(b"m" * 600)

    def seal_floor():
        for _ in range(2):  # one recipient box + one sender box
            x25519.X25519PrivateKey.generate().exchange(peer)
        signer.sign(b"m" * 600)

    def open_floor():
        verifier.verify(sig, b"m" * 600)
        eph.exchange(peer)

    print("sealing and opening...", file=sys.stderr)
    rates = interleaved(
        {"seal": seal, "open": open_one, "seal_floor": seal_floor, "open_floor": open_floor},
        seconds * 2,
    )
    seal_rate, open_rate = rates["seal"], rates["open"]

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
        "sync_page_records": page_records,
        "sync_page_bytes": len(raw),
        "sync_page_1000_s": round(min(timings) * (1000 / page_records), 4),
        "sync_page_s": round(min(timings), 4),
        "target_per_s": 5000,
        "crypto_floor_seal_per_s": round(rates["seal_floor"], 1),
        "crypto_floor_open_per_s": round(rates["open_floor"], 1),
        "seal_share_of_floor": round(seal_rate / rates["seal_floor"], 3),
        "open_share_of_floor": round(open_rate / rates["open_floor"], 3),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
