#!/usr/bin/env python3
"""ML-KEM-768 vectors from an implementation independent of Roam's (kyber-py, pure Python, from
FIPS 203), for TunnelTests' KEM checks:
    python3 -m venv /tmp/kv && /tmp/kv/bin/pip install kyber-py==1.2.0
    /tmp/kv/bin/python Tests/Fixtures/mlkem.py > Tests/Fixtures/mlkem.json
Each vector: the 64-byte seed (d || z) and the public key it determines; the 32-byte
encapsulation entropy (m), the ciphertext and shared secret it determines; and the shared
secret a tampered ciphertext decapsulates to (FIPS 203's implicit rejection)."""
import hashlib
import json
from kyber_py.ml_kem import ML_KEM_768

vectors = []
for n in range(3):
    seed = hashlib.sha256(b"roam ml-kem seed %d" % n).digest() + hashlib.sha256(b"roam ml-kem z %d" % n).digest()
    m = hashlib.sha256(b"roam ml-kem m %d" % n).digest()
    ek, dk = ML_KEM_768.key_derive(seed)
    shared, ct = ML_KEM_768._encaps_internal(ek, m)
    assert ML_KEM_768.decaps(dk, ct) == shared
    tampered = bytearray(ct)
    tampered[n * 100] ^= 1
    vectors.append({"seed": seed.hex(), "public": ek.hex(), "entropy": m.hex(), "ciphertext": ct.hex(),
                    "shared": shared.hex(), "tampered": bytes(tampered).hex(),
                    "rejected": ML_KEM_768.decaps(dk, bytes(tampered)).hex()})
print(json.dumps(vectors, indent=1))
