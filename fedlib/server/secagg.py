"""Secure aggregation of FedPrLLM votes: the server learns only sum_i M_i, never a client's mask.

The protocol is Bonawitz et al.'s SecAgg (CCS 2017) on the vote counts, simulated in one
process with real cryptography (the ``cryptography`` package):

* Keys. Every client has an X25519 key pair and a 32-byte self-mask seed b_i. Clients i and j
  agree on a pair key s_ij = HKDF-SHA256(X25519(sk_i, pk_j), info = "fedlib-secagg pair" + i + j)
  (the same for both; the server, which relays only public keys, cannot compute it).
* Masking, per layer, modulo 2^k with 2^k > n_clients (so a count 0..n fits, :func:`modulus_bits`):
  y_i = M_i + G(b_i) + sum_{j > i} G(s_ij) - sum_{j < i} G(s_ij), where G(key) is the ChaCha20
  keystream of ``key`` with a nonce derived from the layer name, read as k-bit words
  (:func:`keystream_words`). Pair terms cancel in the sum over all clients; each upload alone
  is uniform on (Z_2^k)^N because G(b_i) is (a one-time pad on every word).
* Dropout (SecAgg's recovery, threshold t): before masking, each client Shamir-shares sk_i and
  b_i t-of-n (over the prime field 2^521 - 1). When clients drop out after the masking keys
  were fixed, every survivor reveals, per other client, the share of b (if that client
  survived) or of sk (if it dropped), never both: the server rebuilds the survivors' self masks
  and the dropped clients' pair masks with the survivors and removes them. With fewer than t
  survivors the round fails (an error, no result).

Shares travel encrypted: every client has a second X25519 key pair for that alone (the masking
key is revealed when a client drops out, so it must not also protect the shares), and sends each
other client its two shares under ChaCha20-Poly1305 keyed by HKDF of their share keys, relayed by
the server (:meth:`SecAggClient.share_secrets`, :meth:`SecAggClient.receive_shares`). Every round
uses fresh secrets. :func:`setup_round` runs the steps in one process; ``flower/`` runs them over
the network, one message per step. What is not handled: the relayed public keys are not signed
(SecAgg's active-server variant signs them against a PKI), so an active server that substitutes
keys is out of scope; the graph is complete (SecAgg+'s sparse k-regular graph, Bell et al. 2020,
which cuts each client's cost from O(n) to O(log n) pair streams, is not implemented); clients
that drop out after uploading (before revealing) are covered while t of them reveal. All secret
material (private keys, self-mask seeds, Shamir coefficients) comes from a ChaCha20 generator
keyed by the round seed, so a simulated round is reproducible; ``seed=None`` draws it from the
OS (os.urandom) as a deployment does.

The server's result equals plain vote counting bit for bit (tests/test_secagg.py); the global
mask is then FedPrLLM's selection on those counts (:func:`fedlib.server.fedprllm.global_mask_from_votes`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

#: the Shamir field: the Mersenne prime 2^521 - 1 holds any 32-byte secret
SHAMIR_PRIME = 2**521 - 1


class SecAggError(ValueError):
    """A round that cannot give a correct sum (too few survivors, bad uploads)."""


def modulus_bits(n_clients: int) -> int:
    """k with 2^k > n_clients: the sum of n 0/1 votes (0..n) is exact modulo 2^k."""
    if n_clients < 1:
        raise SecAggError(f"need at least one client, got {n_clients}")
    return int(n_clients).bit_length()


def _word_dtype(bits: int) -> np.dtype:
    """The smallest unsigned word that holds ``bits`` bits: vote counts (up to 16 bits) or
    fixed-point statistics (:mod:`fedlib.dp.distributed`, 64 bits)."""
    for dtype in (np.uint8, np.uint16, np.uint32, np.uint64):
        if bits <= 8 * np.dtype(dtype).itemsize:
            return np.dtype(dtype)
    raise SecAggError(f"{bits}-bit words: at most 64 bits are supported")


def keystream_words(key: bytes, label: str, numel: int, bits: int) -> np.ndarray:
    """``numel`` k-bit words of the ChaCha20 keystream of ``key`` (32 bytes), its 16-byte nonce
    (counter + nonce) the SHA-256 of ``label``: one independent stream per key and layer."""
    dtype = _word_dtype(bits)
    nonce = hashlib.sha256(label.encode()).digest()[:16]
    encryptor = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor()
    words = np.frombuffer(encryptor.update(bytes(numel * dtype.itemsize)), dtype=dtype).copy()
    if bits < 8 * dtype.itemsize:
        words &= dtype.type((1 << bits) - 1)
    return words


class _Randomness:
    """Secret bytes: a ChaCha20 stream keyed by SHA-256 of the seed (reproducible simulation),
    or os.urandom when the seed is None."""

    def __init__(self, seed: int | None):
        self._stream = None
        if seed is not None:
            key = hashlib.sha256(f"fedlib-secagg round {int(seed)}".encode()).digest()
            self._stream = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()

    def bytes(self, n: int) -> bytes:
        return os.urandom(n) if self._stream is None else self._stream.update(bytes(n))

    def field_element(self) -> int:
        # 80 bytes (640 bits) reduced mod p: statistically uniform (bias < 2^-119)
        return int.from_bytes(self.bytes(80), "little") % SHAMIR_PRIME


def shamir_split(secret: bytes, n: int, threshold: int, rng: _Randomness) -> list[tuple[int, int]]:
    """t-of-n Shamir shares (x, f(x)), x = 1..n, of a secret of at most 64 bytes."""
    if not 1 <= threshold <= n:
        raise SecAggError(f"threshold must be in 1..{n}, got {threshold}")
    coeffs = [int.from_bytes(secret, "little")] + [rng.field_element() for _ in range(threshold - 1)]
    shares = []
    for x in range(1, n + 1):
        y = 0
        for c in reversed(coeffs):  # Horner
            y = (y * x + c) % SHAMIR_PRIME
        shares.append((x, y))
    return shares


def shamir_combine(shares: Sequence[tuple[int, int]], length: int = 32) -> bytes:
    """The secret (``length`` bytes) from at least t shares: Lagrange interpolation at 0."""
    xs = [x for x, _ in shares]
    if len(set(xs)) != len(xs):
        raise SecAggError("Shamir shares with repeated x")
    secret = 0
    for i, (xi, yi) in enumerate(shares):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if j != i:
                num = num * -xj % SHAMIR_PRIME
                den = den * (xi - xj) % SHAMIR_PRIME
        secret = (secret + yi * num * pow(den, -1, SHAMIR_PRIME)) % SHAMIR_PRIME
    if secret >= 1 << (8 * length):
        raise SecAggError("Shamir shares do not reconstruct a secret of the expected size (too few or wrong shares)")
    return secret.to_bytes(length, "little")


def _raw(public_key: X25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def pair_key(private_key: X25519PrivateKey, public_key: bytes, i: int, j: int) -> bytes:
    """s_ij: HKDF-SHA256 of the X25519 shared secret, bound to the unordered pair (i, j)."""
    lo, hi = sorted((i, j))
    shared = private_key.exchange(X25519PublicKey.from_public_bytes(public_key))
    info = b"fedlib-secagg pair" + lo.to_bytes(4, "little") + hi.to_bytes(4, "little")
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared)


def _pair_sign(i: int, j: int) -> int:
    """Client i adds G(s_ij) when i < j and subtracts it when i > j: the two cancel."""
    return 1 if i < j else -1


#: bytes of one Shamir share's value (an element of the field 2^521 - 1)
SHARE_BYTES = 66


def _share_cipher(own: X25519PrivateKey, other: bytes, i: int, j: int) -> ChaCha20Poly1305:
    """The AEAD that carries Shamir shares between clients i and j through the server: a key from
    X25519 of their *share* keys (never the masking keys, which a dropout reveals)."""
    lo, hi = sorted((i, j))
    shared = own.exchange(X25519PublicKey.from_public_bytes(other))
    info = b"fedlib-secagg share" + lo.to_bytes(4, "little") + hi.to_bytes(4, "little")
    return ChaCha20Poly1305(HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared))


def _share_nonce(sender: int, recipient: int) -> bytes:
    # one key per pair and round, two directions: the direction makes each nonce unique
    return sender.to_bytes(4, "little") + recipient.to_bytes(4, "little") + bytes(4)


@dataclass
class SecAggClient:
    """One client's side of a round: its secrets, the shares it holds of the others' secrets,
    its uploads. The steps, in order: :meth:`advertise` (public keys), :meth:`share_secrets`
    (encrypted shares for every client, relayed by the server), :meth:`receive_shares`,
    :meth:`masked_upload` per layer, :meth:`reveal` (once)."""

    index: int
    #: the masking key: pair keys with the others; Shamir-shared, revealed if this client drops out
    private_key: X25519PrivateKey
    self_seed: bytes
    bits: int
    #: encrypts the shares this client sends and receives; never shared
    share_key: X25519PrivateKey | None = None
    public_keys: dict[int, bytes] = field(default_factory=dict)
    #: the others' share public keys (to decrypt what they sent)
    share_public_keys: dict[int, bytes] = field(default_factory=dict)
    threshold: int = 0
    #: sender index -> (share of the sender's private key, share of its self-mask seed)
    held_shares: dict[int, tuple[tuple[int, int], tuple[int, int]]] = field(default_factory=dict)
    revealed: bool = False
    _pair_keys: dict[int, bytes] = field(default_factory=dict, repr=False)

    @classmethod
    def create(cls, index: int, n_clients: int, rng: "_Randomness | None" = None,
               bits: int | None = None) -> "SecAggClient":
        """Fresh secrets for one round (a new client for every round: nothing is reused), from
        ``rng`` (a seeded simulation) or the OS; ``bits``: the word size (default: vote counts')."""
        rng = rng or _Randomness(None)
        return cls(index, X25519PrivateKey.from_private_bytes(rng.bytes(32)), rng.bytes(32),
                   modulus_bits(n_clients) if bits is None else int(bits),
                   X25519PrivateKey.from_private_bytes(rng.bytes(32)))

    @property
    def public_key(self) -> bytes:
        return _raw(self.private_key.public_key())

    def advertise(self) -> tuple[bytes, bytes]:
        """(share public key, masking public key): what the server relays to every client."""
        return _raw(self.share_key.public_key()), self.public_key

    def share_secrets(self, advertised: Mapping[int, tuple[bytes, bytes]], threshold: int,
                      rng: "_Randomness | None" = None) -> dict[int, bytes]:
        """Keep the round's public keys; Shamir-split the masking key and the self-mask seed
        t-of-n; one ciphertext per client (itself included), each readable by its recipient only."""
        if advertised.get(self.index) != self.advertise():
            raise SecAggError(f"client {self.index}: the server relayed other public keys than this client's")
        if not 1 <= threshold <= len(advertised):
            raise SecAggError(f"threshold must be in 1..{len(advertised)}, got {threshold}")
        rng = rng or _Randomness(None)
        self.threshold = int(threshold)
        self.share_public_keys = {j: c for j, (c, _) in advertised.items()}
        self.public_keys = {j: s for j, (_, s) in advertised.items()}
        raw = self.private_key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                             serialization.NoEncryption())
        holders = max(advertised) + 1  # share x = holder index + 1
        sk_shares = shamir_split(raw, holders, threshold, rng)
        b_shares = shamir_split(self.self_seed, holders, threshold, rng)
        out = {}
        for j in sorted(advertised):
            plain = sk_shares[j][1].to_bytes(SHARE_BYTES, "little") + b_shares[j][1].to_bytes(SHARE_BYTES, "little")
            cipher = _share_cipher(self.share_key, self.share_public_keys[j], self.index, j)
            out[j] = cipher.encrypt(_share_nonce(self.index, j), plain, None)
        return out

    def receive_shares(self, inbox: Mapping[int, bytes]) -> None:
        """Decrypt the shares the others sent this client (sender index -> ciphertext)."""
        x = self.index + 1
        for sender, data in sorted(inbox.items()):
            if sender not in self.share_public_keys:
                raise SecAggError(f"client {self.index}: a share from {sender}, who advertised no key this round")
            cipher = _share_cipher(self.share_key, self.share_public_keys[sender], self.index, sender)
            try:
                plain = cipher.decrypt(_share_nonce(sender, self.index), bytes(data), None)
            except InvalidTag:
                raise SecAggError(f"client {self.index}: the share from client {sender} does not decrypt "
                                  "(altered in transit, or not meant for this client)") from None
            self.held_shares[sender] = ((x, int.from_bytes(plain[:SHARE_BYTES], "little")),
                                        (x, int.from_bytes(plain[SHARE_BYTES:], "little")))

    def restrict(self, clients: Sequence[int]) -> None:
        """Keep the clients whose shares the server delivered (SecAgg's U2): pair masks with
        them only; a client that advertised keys but shared nothing is not in the round."""
        keep = set(clients)
        if self.index not in keep or not keep <= set(self.public_keys) or not keep <= set(self.held_shares):
            raise SecAggError(f"client {self.index}: the round's clients {sorted(keep)} are not clients whose "
                              f"shares it holds ({sorted(self.held_shares)})")
        if len(keep) < self.threshold:
            raise SecAggError(f"client {self.index}: {len(keep)} clients in the round, the threshold is {self.threshold}")
        self.public_keys = {j: k for j, k in self.public_keys.items() if j in keep}
        self.held_shares = {j: v for j, v in self.held_shares.items() if j in keep}

    def _pair(self, j: int) -> bytes:
        if j not in self._pair_keys:
            self._pair_keys[j] = pair_key(self.private_key, self.public_keys[j], self.index, j)
        return self._pair_keys[j]

    def masked_upload(self, name: str, mask: torch.Tensor) -> np.ndarray:
        """y_i for layer ``name``: the 0/1 mask plus the self mask and the signed pair masks,
        as k-bit words (unsigned, wrapping arithmetic = arithmetic modulo 2^k)."""
        flat = mask.detach().cpu().reshape(-1).numpy()
        if flat.dtype != np.bool_:
            raise SecAggError(f"layer {name}: a mask must be boolean, got {flat.dtype}")
        return self.masked_words(name, flat.astype(_word_dtype(self.bits)))

    def masked_words(self, name: str, words: np.ndarray) -> np.ndarray:
        """y_i for vector ``name``: any k-bit words (a mask's 0/1, fixed-point statistics) plus
        the self mask and the signed pair masks, modulo 2^k."""
        dtype = _word_dtype(self.bits)
        if words.dtype != dtype or words.ndim != 1:
            raise SecAggError(f"{name}: expected a flat vector of {dtype} words, got {words.dtype} {words.shape}")
        y = words.copy()
        y += keystream_words(self.self_seed, f"self:{name}", y.size, self.bits)
        for j in sorted(self.public_keys):
            if j == self.index:
                continue
            g = keystream_words(self._pair(j), f"pair:{name}", y.size, self.bits)
            if _pair_sign(self.index, j) > 0:
                y += g
            else:
                y -= g
        return _reduce(y, self.bits)

    def reveal(self, survivors: Sequence[int]) -> dict[int, tuple[str, tuple[int, int]]]:
        """The unmasking step, once per round: per client (itself included), the share of its
        self-mask seed if it survived, of its private key if it dropped out (never both for one
        client: a second request, which could ask for the other share, is refused)."""
        alive = set(survivors)
        if self.revealed:
            raise SecAggError(f"client {self.index}: already revealed its shares in this round")
        if not alive <= set(self.public_keys) or len(alive) < self.threshold:
            raise SecAggError(f"client {self.index}: survivors {sorted(alive)} are not {self.threshold} or more "
                              f"of this round's clients {sorted(self.public_keys)}")
        self.revealed = True
        return {s: ("self", b) if s in alive else ("key", sk) for s, (sk, b) in self.held_shares.items()}

    def to_record(self) -> dict:
        """This client's state between the steps of a round, as plain values (a Flower ClientApp
        keeps it in the site's own ``context.state``, never sent)."""
        raw = serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        owners = sorted(self.held_shares)
        return {
            "index": self.index, "bits": self.bits, "threshold": self.threshold, "revealed": self.revealed,
            "private_key": self.private_key.private_bytes(*raw), "share_key": self.share_key.private_bytes(*raw),
            "self_seed": self.self_seed, "clients": sorted(self.public_keys),
            "public_keys": [self.public_keys[j] for j in sorted(self.public_keys)],
            "share_public_keys": [self.share_public_keys[j] for j in sorted(self.public_keys)],
            "owners": owners,
            "key_shares": [self.held_shares[o][0][1].to_bytes(SHARE_BYTES, "little") for o in owners],
            "seed_shares": [self.held_shares[o][1][1].to_bytes(SHARE_BYTES, "little") for o in owners],
        }

    @classmethod
    def from_record(cls, record: Mapping) -> "SecAggClient":
        x = int(record["index"]) + 1
        clients = [int(j) for j in record["clients"]]
        return cls(
            int(record["index"]), X25519PrivateKey.from_private_bytes(bytes(record["private_key"])),
            bytes(record["self_seed"]), int(record["bits"]),
            X25519PrivateKey.from_private_bytes(bytes(record["share_key"])),
            dict(zip(clients, map(bytes, record["public_keys"]))),
            dict(zip(clients, map(bytes, record["share_public_keys"]))), int(record["threshold"]),
            {int(o): ((x, int.from_bytes(k, "little")), (x, int.from_bytes(b, "little")))
             for o, k, b in zip(record["owners"], record["key_shares"], record["seed_shares"])},
            bool(record["revealed"]))


def _reduce(words: np.ndarray, bits: int) -> np.ndarray:
    if bits < 8 * words.dtype.itemsize:
        words &= words.dtype.type((1 << bits) - 1)
    return words


@dataclass
class SecAggServer:
    """The server's side: public keys, the threshold and the uploads; it never holds a secret
    of a client that could reveal that client's mask."""

    n_clients: int
    threshold: int
    bits: int
    public_keys: dict[int, bytes]

    def unmask(self, name: str, uploads: Mapping[int, np.ndarray],
               reveals: Mapping[int, Mapping[int, tuple[str, tuple[int, int]]]]) -> torch.Tensor:
        """sum_i M_i over the clients in ``uploads`` (the survivors), as int16 counts."""
        counts = self.unmask_words(name, uploads, reveals)
        if int(counts.max(initial=0)) > len(uploads):
            raise SecAggError(f"layer {name}: unmasked counts exceed the {len(uploads)} survivors "
                              "(an upload or a share is corrupt)")
        return torch.from_numpy(counts.astype(np.int16))

    def unmask_words(self, name: str, uploads: Mapping[int, np.ndarray],
                     reveals: Mapping[int, Mapping[int, tuple[str, tuple[int, int]]]]) -> np.ndarray:
        """The sum modulo 2^k of the survivors' words (``uploads``: their masked uploads).

        ``reveals[j]`` is survivor j's :meth:`SecAggClient.reveal` (at least t survivors). The survivors' self masks
        and the pair masks between survivors and dropped clients are rebuilt from t shares each
        and removed; pair masks between two survivors cancel in the sum."""
        survivors = sorted(uploads)
        if len(survivors) < self.threshold:
            raise SecAggError(f"layer {name}: {len(survivors)} surviving clients, the threshold is "
                              f"{self.threshold}: the sum cannot be unmasked")
        # clients may still drop out after uploading: t reveals from uploaders suffice
        if not set(reveals) <= set(survivors) or len(reveals) < self.threshold:
            raise SecAggError(f"layer {name}: reveals from {sorted(reveals)}, uploads from {survivors}, "
                              f"threshold {self.threshold}")
        sizes = {u.size for u in uploads.values()}
        if len(sizes) != 1:
            raise SecAggError(f"layer {name}: uploads of different lengths {sorted(sizes)}")
        numel = sizes.pop()
        dtype = _word_dtype(self.bits)
        total = np.zeros(numel, dtype=dtype)
        for u in uploads.values():
            if u.dtype != dtype:
                raise SecAggError(f"layer {name}: an upload of dtype {u.dtype}, expected {dtype}")
            total += u
        dropped = [c for c in self.public_keys if c not in uploads]
        for i in survivors:
            seed = self._combine(name, reveals, i, "self")
            total -= keystream_words(seed, f"self:{name}", numel, self.bits)
        for d in dropped:
            key = X25519PrivateKey.from_private_bytes(self._combine(name, reveals, d, "key"))
            for j in survivors:
                # j's upload holds sign(j, d) * G(s_jd): remove it
                g = keystream_words(pair_key(key, self.public_keys[j], d, j), f"pair:{name}", numel, self.bits)
                if _pair_sign(j, d) > 0:
                    total -= g
                else:
                    total += g
        return _reduce(total, self.bits)

    def _combine(self, name: str, reveals, owner: int, kind: str) -> bytes:
        shares = [share for r in reveals.values() if owner in r for k, share in [r[owner]] if k == kind]
        if len(shares) < self.threshold:
            raise SecAggError(f"layer {name}: {len(shares)} shares of client {owner}'s {kind} secret, "
                              f"the threshold is {self.threshold}")
        return shamir_combine(shares[: self.threshold])


def setup_round(n_clients: int, threshold: int | None = None, seed: int | None = 0, bits: int | None = None
                ) -> tuple[list[SecAggClient], SecAggServer]:
    """Key advertisement and share distribution of one round: n clients with X25519 keys and
    self-mask seeds, every secret Shamir-shared t-of-n (default t = floor(n/2) + 1, the honest
    majority SecAgg assumes) and encrypted to its holder, and the server holding only the public
    keys and relaying ciphertexts (here in one process; over the network: flower/). ``bits``: the
    word size (default: the smallest that counts n votes, :func:`modulus_bits`)."""
    bits = modulus_bits(n_clients) if bits is None else int(bits)
    threshold = default_threshold(n_clients) if threshold is None else int(threshold)
    rng = _Randomness(seed)
    clients = [SecAggClient.create(i, n_clients, rng, bits) for i in range(n_clients)]
    advertised = {c.index: c.advertise() for c in clients}
    outboxes = {c.index: c.share_secrets(advertised, threshold, rng) for c in clients}
    for c in clients:
        c.receive_shares({sender: box[c.index] for sender, box in outboxes.items()})
    return clients, SecAggServer(n_clients, threshold, bits,
                                 {j: masking for j, (_, masking) in advertised.items()})


def default_threshold(n_clients: int) -> int:
    """t = floor(n/2) + 1: the honest majority SecAgg assumes."""
    return n_clients // 2 + 1


def secure_vote_counts(masks: Sequence[Mapping[str, torch.Tensor]], names: Sequence[str],
                       threshold: int | None = None, seed: int | None = 0,
                       dropped: Sequence[int] = ()) -> dict[str, torch.Tensor]:
    """One simulated round over whole masks: every client in ``masks`` masks each layer, the
    clients in ``dropped`` never send their uploads, the server unmasks the survivors' sum per
    layer ({name: int16 counts in the layer's shape})."""
    clients, server = setup_round(len(masks), threshold, seed)
    survivors = [c.index for c in clients if c.index not in set(dropped)]
    reveals = {j: clients[j].reveal(survivors) for j in survivors}
    out = {}
    for name in names:
        shape = masks[0][name].shape
        uploads = {j: clients[j].masked_upload(name, masks[j][name]) for j in survivors}
        out[name] = server.unmask(name, uploads, reveals).reshape(shape)
    return out


def pack_words(words: np.ndarray, bits: int) -> bytes:
    """The wire form of an upload: its k bit planes, each packed 8 entries per byte
    (k · ceil(N / 8) bytes, against ceil(N / 8) for a plain 0/1 mask)."""
    w = words.astype(np.uint16)
    return b"".join(np.packbits(((w >> b) & 1).astype(np.uint8), bitorder="little").tobytes() for b in range(bits))


def unpack_words(data: bytes, numel: int, bits: int) -> np.ndarray:
    """Inverse of :func:`pack_words`."""
    plane = (numel + 7) // 8
    if len(data) != bits * plane:
        raise SecAggError(f"upload of {len(data)} bytes, expected {bits} planes of {plane} bytes")
    dtype = _word_dtype(bits)
    words = np.zeros(numel, dtype=dtype)
    for b in range(bits):
        bits_b = np.unpackbits(np.frombuffer(data[b * plane:(b + 1) * plane], np.uint8), count=numel,
                               bitorder="little")
        words |= bits_b.astype(dtype) << dtype.type(b)
    return words
