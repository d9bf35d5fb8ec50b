#!/usr/bin/env python3
"""A version 3 handshake and data packets computed by an implementation independent of Roam's,
written from docs/PROTOCOL.md (version 3) with Python's `cryptography` (X25519, ChaCha20-Poly1305,
AES-256-GCM, SHA-256, HMAC) and kyber-py (ML-KEM-768 from FIPS 203), every random input fixed:
    python3 -m venv /tmp/kv && /tmp/kv/bin/pip install kyber-py==1.2.0 cryptography
    /tmp/kv/bin/python Tests/Fixtures/handshake-v3.py > Tests/Fixtures/handshake-v3.json"""
import hashlib
import hmac
import json
import struct
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from cryptography.hazmat.primitives import serialization
from kyber_py.ml_kem import ML_KEM_768

PROTOCOL_NAME = b"Roam3_XKhybrid_25519+MLKEM768_ChaChaPoly_SHA256"
PROLOGUE = b"roam protocol version 3"


def sha256(*parts):
    return hashlib.sha256(b"".join(parts)).digest()


def hkdf(ck, ikm):
    temp = hmac.new(ck, ikm, hashlib.sha256).digest()
    out1 = hmac.new(temp, b"\x01", hashlib.sha256).digest()
    out2 = hmac.new(temp, out1 + b"\x02", hashlib.sha256).digest()
    return out1, out2


def public(private):
    return X25519PrivateKey.from_private_bytes(private).public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def dh(private, peer):
    return X25519PrivateKey.from_private_bytes(private).exchange(X25519PublicKey.from_public_bytes(peer))


class Symmetric:
    def __init__(self):
        self.h = sha256(PROTOCOL_NAME) if len(PROTOCOL_NAME) > 32 else PROTOCOL_NAME.ljust(32, b"\0")
        self.ck = self.h
        self.k = None
        self.n = 0

    def mix_hash(self, data):
        self.h = sha256(self.h, data)

    def mix_key(self, ikm):
        self.ck, self.k = hkdf(self.ck, ikm)
        self.n = 0

    def encrypt_and_hash(self, plaintext):
        nonce = b"\0\0\0\0" + struct.pack("<Q", self.n)
        c = ChaCha20Poly1305(self.k).encrypt(nonce, plaintext, self.h)
        self.n += 1
        self.mix_hash(c)
        return c

    def split(self):
        return hkdf(self.ck, b"")


def mac(key, data):
    return hmac.new(key, data, hashlib.sha256).digest()[:16]


def stamp(message, server_public):
    """mac1 over everything before it; mac2 zeros (no cookie)."""
    mac1 = mac(sha256(b"mac1----", server_public), message)
    return message + mac1 + bytes(16)


def fixed(label, n=32):
    return hashlib.sha256(b"roam v3 fixture " + label).digest()[:n]


server_static = fixed(b"server static")
client_static = fixed(b"client static")
client_ephemeral = fixed(b"client ephemeral")
server_ephemeral = fixed(b"server ephemeral")
kem_seed = fixed(b"kem d") + fixed(b"kem z")
kem_entropy = fixed(b"kem m")
client_index, server_index = 0x11111111, 0x22222222
S = public(server_static)

# The offer: suites (bit 0 ChaCha20-Poly1305, bit 1 AES-256-GCM), the preferred one, flags
# (bit 0: AES in hardware), 13 reserved zeros.
offer = bytes([0b11, 2, 1]) + bytes(13)
# The choice: the suite (0: none in common), 15 reserved zeros.
choice = bytes([2]) + bytes(15)
# Credentials: U, P, username, password, zero padding to a multiple of 64, at least 256.
username, password = b"alice", b"correct horse battery staple"
credentials = bytes([len(username), len(password)]) + username + password
credentials += bytes(max(256, -(-len(credentials) // 64) * 64) - len(credentials))
# The verdict, version 2's response payload: accepted, IPv4 present, 10.77.0.2, no IPv6; the
# features option (echoes sizes, takes path MTU notices) and a resolver option (10.77.0.1).
verdict = bytes([0, 1]) + bytes([10, 77, 0, 2]) + bytes(16) + bytes([3, 1, 0b11]) + bytes([1, 4, 10, 77, 0, 1])

ek, dk = ML_KEM_768.key_derive(kem_seed)
sym = Symmetric()
sym.mix_hash(PROLOGUE)
sym.mix_hash(S)                                   # <- s
# -- initiation: part A carries the KEM key, part B the rest
sym.mix_hash(ek)                                  # ekem
E_c = public(client_ephemeral)
sym.mix_hash(E_c)                                 # e
sym.mix_key(dh(client_ephemeral, S))              # es
sealed_offer = sym.encrypt_and_hash(offer)
part_a = stamp(struct.pack("<BBHI", 3, 1, 0, client_index) + ek, S)
part_b = stamp(struct.pack("<BBHI", 3, 6, 0, client_index) + E_c + sealed_offer, S)
# -- response
E_s = public(server_ephemeral)
sym.mix_hash(E_s)                                 # e
sym.mix_key(dh(server_ephemeral, E_c))            # ee
shared, ct = ML_KEM_768._encaps_internal(ek, kem_entropy)
assert ML_KEM_768.decaps(dk, ct) == shared
sym.mix_hash(ct)                                  # kem
sym.mix_key(shared)
response = struct.pack("<BBHII", 3, 2, 0, server_index, client_index) + E_s + ct + sym.encrypt_and_hash(choice)
# -- identity
sealed_static = sym.encrypt_and_hash(public(client_static))   # s
sym.mix_key(dh(client_static, E_s))               # se
identity = struct.pack("<BBHI", 3, 7, 0, server_index) + sealed_static + sym.encrypt_and_hash(credentials)
# -- verdict
verdict_message = struct.pack("<BBHII", 3, 8, 0, server_index, client_index) + sym.encrypt_and_hash(verdict)
to_server, to_client = sym.split()

# Data packets on the chosen suite (AES-256-GCM: nonce 32 zero bits then the counter big-endian).
packets = []
for sender, key, receiver in [("client", to_server, server_index), ("server", to_client, client_index)]:
    for counter, inner in [(0, b""), (1, bytes.fromhex("4500001c000100004011f9d70a4d0002") + bytes(12))]:
        header = struct.pack("<BBHIQ", 3, 3, 0, receiver, counter)
        sealed = AESGCM(key).encrypt(b"\0\0\0\0" + struct.pack(">Q", counter), inner, header)
        packets.append({"from": sender, "counter": counter, "inner": inner.hex(), "datagram": (header + sealed).hex()})

print(json.dumps({
    "server_static": server_static.hex(), "client_static": client_static.hex(),
    "client_ephemeral": client_ephemeral.hex(), "server_ephemeral": server_ephemeral.hex(),
    "kem_seed": kem_seed.hex(), "kem_entropy": kem_entropy.hex(),
    "client_index": client_index, "server_index": server_index,
    "offer": offer.hex(), "choice": choice.hex(), "credentials": credentials.hex(), "verdict": verdict.hex(),
    "part_a": part_a.hex(), "part_b": part_b.hex(), "response": response.hex(), "identity": identity.hex(),
    "verdict_message": verdict_message.hex(), "handshake_hash": sym.h.hex(),
    "to_server": to_server.hex(), "to_client": to_client.hex(), "packets": packets,
}, indent=1))
