#!/usr/bin/env python3
"""Data packets sealed by an implementation independent of Roam's (Python's `cryptography`,
over OpenSSL), for TunnelTests' AEAD checks: `python3 Tests/Fixtures/data-packets.py >
Tests/Fixtures/data-packets.json`.

A data packet is the 16-byte header (version, type 3, two zero bytes, the receiver index and
the counter, little-endian), the inner bytes sealed with the header as associated data, and the
16-byte tag. The nonce is 32 zero bits then the counter: little-endian for ChaCha20-Poly1305,
big-endian for AES-256-GCM, as Noise forms them."""
import json
import struct
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

KEY = bytes((7 * i + 3) % 256 for i in range(32))
INNER = bytes.fromhex("4500003c1c4640004006b1e6c0a80001c0a800c7") + bytes(range(40))
vectors = []
for suite, cipher, order in [("chacha20-poly1305", ChaCha20Poly1305(KEY), "<"), ("aes-256-gcm", AESGCM(KEY), ">")]:
    for version, counter, inner in [(2, 0, b""), (2, 1, INNER), (3, 2**32 + 5, INNER), (3, 2**60, INNER[:1])]:
        header = struct.pack("<BBHIQ", version, 3, 0, 0x11223344, counter)
        nonce = b"\0\0\0\0" + struct.pack(order + "Q", counter)
        sealed = cipher.encrypt(nonce, inner, header)
        vectors.append({"suite": suite, "key": KEY.hex(), "counter": counter, "header": header.hex(),
                        "inner": inner.hex(), "datagram": (header + sealed).hex()})
print(json.dumps(vectors, indent=1))
