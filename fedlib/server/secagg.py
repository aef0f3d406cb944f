"""Secure aggregation of FedPrLLM votes: the server learns only sum_i M_i, never a client's mask.

The protocol is Bonawitz et al.'s SecAgg (CCS 2017) in its variant against an active server
(section 4, "active adversary"), on the vote counts, with real cryptography (``cryptography``):

* Keys. Every site has an X25519 masking key pair, an X25519 share key pair and a 32-byte
  self-mask seed b_i, fresh each round. Sites i and j agree on a pair key s_ij = HKDF-SHA256(
  X25519(sk_i, pk_j), info = the round's context + i + j); the context (:class:`RoundContext`)
  is the run id, the round index, the roster's digest, the plan's digest, the threshold and the
  word size, so keys and nonces never repeat across rounds or runs.
* Masking, per layer, modulo 2^k with 2^k > the roster size (a count 0..n fits,
  :func:`modulus_bits`): y_i = M_i + G(b_i) + sum_{j > i} G(s_ij) - sum_{j < i} G(s_ij), G(key)
  the ChaCha20 keystream of ``key`` with a nonce from the layer name, read as k-bit words
  (:func:`keystream_words`). Pair terms cancel in the sum; each upload alone is uniform.
* Dropout (threshold t): each site Shamir-shares sk_i and b_i t-of-n over GF(2^521 - 1) and
  sends each share encrypted (ChaCha20-Poly1305 under a key of the pair's *share* keys). After
  the uploads every survivor reveals, per other site, the share of b (it survived) or of sk (it
  dropped), never both; the server removes the survivors' self masks and the dropped sites'
  pair masks. Fewer than t survivors: no result.

Sites protect themselves (:class:`SecAggClient`); each holds a :class:`Roster` (client id ->
Ed25519 public key, exchanged out of band) and its own Ed25519 signing key:

* it signs its advertised keys over the context, its index and id; every peer verifies every
  advertised key against its roster (a coordinator that substitutes a key is caught) and the
  signature covers the context, so peers with another roster, plan, threshold, run or round
  are refused too;
* it refuses a threshold that is not a majority of the roster (t > n/2: with t = 1 one reveal
  would give away every site's secrets), participants outside its roster, a second share step,
  a second upload (and any layer masked twice), a plan other than the one signed at the key
  step: the state (:meth:`SecAggClient.to_record`) persists, so a restarted process refuses too;
* it reveals only after t signed confirmations (:meth:`SecAggClient.confirm_survivors`) of
  the identical survivor list it confirmed itself (a coordinator that tells some sites that X
  dropped and others that X survived, to get both shares of X, cannot collect t signatures on
  both lists while t > n/2);
* with ``min_cohort``, it refuses rounds of fewer sites than its own configuration allows.

The server (:class:`SecAggServer`) names dishonest sites instead of failing unidentified:
advertisements and confirmations whose signatures fail are dropped; a site whose share
ciphertexts a recipient cannot decrypt is dropped from the sum (its key is rebuilt as for a
dropout, its self seed never revealed) and both are named, since only the two of them know who
lied; reveals are decoded from all shares (Berlekamp-Welch: up to floor((r - t) / 2) wrong
shares out of r are corrected and their holders named); a rebuilt key is checked against the
site's advertised public key and a rebuilt seed against its signed commitment (a site that
dealt shares of something else is named); and the unmasked votes are checked against what the
cohort's masks must sum to: under a uniform allocation every comparison group holds m * k votes
(m sites each pruning k), a per-layer ratio gives every row (column) the same total.

What remains possible: a site can still move its votes inside those totals (prune other weights
than its data says, shift a vote from one weight of a group to another: -1 here and +1 there);
only a zero-knowledge proof that each upload is a well-formed mask (every word 0 or 1, k per
group; Bell et al.'s, or a per-group range proof) would close that. A site that claims falsely
that another's shares did not decrypt removes that site's votes from the round (both are named).
The coordinator can still drop any site it likes (that site's votes are lost, its mask stays
hidden), and a coordinator colluding with t - 1 sites can drop all but one other site and read
that site's mask off the sum: the threshold and a site's ``min_cohort`` bound how small a sum a
site takes part in, not who else is in it.

Differencing across rounds (two sums whose cohorts differ by one site) is the site's to refuse:
:class:`ContributionLedger` records the plans it contributed, per run, and refuses a plan a
second time unless that upload is differentially private.

How the steps map to messages (``flower/`` wires them; the site persists ``to_record()`` before
every reply, and ``from_record(record, signing_key)`` at the next step):

1. keys (the message carries run, round, threshold and the plan): ``context =
   RoundContext(run_id, round_index, roster, plan_digest(plan), threshold)``; ``client =
   SecAggClient.create(context, client_id, signing_key, min_cohort=N)``; reply
   ``client.index`` and ``client.advertise()`` (an :class:`Advertisement`: four byte strings).
   Coordinator: ``server = SecAggServer(context)``; ``advertised = server.admit(replies)``.
2. shares: ``client.share_secrets(advertised)`` -> recipient index -> ciphertext.
3. upload: ``complaints = client.receive_shares(inbox, participants)`` (the senders whose
   ciphertexts did not decrypt), ``ledger.admit(digest of what determines the mask, run_id,
   dp)``, ``client.begin_upload(plan_digest(plan))``, persist, then ``client.masked_upload(name,
   mask)`` per layer; reply the words and the complaints. (A key step for a round whose state
   the site already holds starts fresh secrets: the ledger is what refuses that second upload.)
   Coordinator: ``survivors = server.drop_accused(uploaded, complaints)``.
4. confirm: ``client.confirm_survivors(survivors)`` -> signature. Coordinator:
   ``confirmations = server.admit_confirmations(survivors, signatures)``, relayed to all.
5. reveal: ``client.reveal(survivors, confirmations)``. Coordinator: ``server.recover(reveals,
   survivors, participants)``, then ``server.unmask(name, uploads, shape, cohort)`` per layer;
   ``server.suspects`` (client id -> what it did) goes into the round's record.

Secret material comes from a ChaCha20 generator keyed by a seed in the one-process simulation
(:func:`setup_round`, reproducible), from os.urandom in a deployment (``seed=None``). The
server's result equals plain vote counting bit for bit (tests/test_secagg.py). Not implemented:
SecAgg+'s sparse graph (Bell et al. 2020; each site here masks with every other).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedlib.groups import GROUPS, parse_nm, pruned_count
from fedlib.protocol import CLIENT_ID


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


def _secret_bytes(value: int, length: int) -> bytes:
    if value >= 1 << (8 * length):
        raise SecAggError("Shamir shares do not reconstruct a secret of the expected size (too few or wrong shares)")
    return value.to_bytes(length, "little")


def _interpolate(points: Sequence[tuple[int, int]]) -> list[int]:
    """The coefficients (lowest first) of the polynomial of degree < len(points) through them:
    Newton's divided differences, then expanded (O(t^2) field operations)."""
    xs = [x for x, _ in points]
    c = [y % SHAMIR_PRIME for _, y in points]
    for j in range(1, len(points)):
        for i in range(len(points) - 1, j - 1, -1):
            c[i] = (c[i] - c[i - 1]) * pow(xs[i] - xs[i - j], -1, SHAMIR_PRIME) % SHAMIR_PRIME
    poly = [c[-1]]
    for k in range(len(points) - 2, -1, -1):  # poly * (X - x_k) + c_k
        poly = [(a - xs[k] * b) % SHAMIR_PRIME for a, b in zip([0] + poly, poly + [0])]
        poly[0] = (poly[0] + c[k]) % SHAMIR_PRIME
    return poly


def _evaluate(poly: Sequence[int], x: int) -> int:
    y = 0
    for c in reversed(poly):
        y = (y * x + c) % SHAMIR_PRIME
    return y


def _solve(rows: list[list[int]]) -> list[int] | None:
    """One solution of the linear system [A | b] over GF(p) (free unknowns 0), None if none."""
    rows = [list(r) for r in rows]
    unknowns, pivots, r = len(rows[0]) - 1, [], 0
    for c in range(unknowns):
        pivot = next((i for i in range(r, len(rows)) if rows[i][c]), None)
        if pivot is None:
            continue
        rows[r], rows[pivot] = rows[pivot], rows[r]
        inverse = pow(rows[r][c], -1, SHAMIR_PRIME)
        rows[r] = [v * inverse % SHAMIR_PRIME for v in rows[r]]
        for i in range(len(rows)):
            if i != r and rows[i][c]:
                f = rows[i][c]
                rows[i] = [(a - f * b) % SHAMIR_PRIME for a, b in zip(rows[i], rows[r])]
        pivots.append(c)
        r += 1
    if any(row[-1] for row in rows[r:]):
        return None
    solution = [0] * unknowns
    for i, c in enumerate(pivots):
        solution[c] = rows[i][-1]
    return solution


def _berlekamp_welch(points: Sequence[tuple[int, int]], t: int, errors: int) -> list[int] | None:
    """The polynomial of degree < t through all but at most ``errors`` of the points, if there
    is one (r >= t + 2 * errors makes it unique): Q = P * E with E monic of degree ``errors``
    vanishing at the wrong points, Q(x) = y E(x) at every point, a linear system."""
    rows = [[pow(x, k, SHAMIR_PRIME) for k in range(t + errors)]
            + [-y * pow(x, k, SHAMIR_PRIME) % SHAMIR_PRIME for k in range(errors)]
            + [y * pow(x, errors, SHAMIR_PRIME) % SHAMIR_PRIME] for x, y in points]
    solution = _solve(rows)
    if solution is None:
        return None
    q, e = solution[:t + errors], solution[t + errors:] + [1]
    quotient = [0] * t  # Q / E, long division by the monic E
    for k in range(t - 1, -1, -1):
        coef = q[k + errors]
        quotient[k] = coef
        for i, d in enumerate(e):
            q[k + i] = (q[k + i] - coef * d) % SHAMIR_PRIME
    return quotient if not any(q[:errors]) else None


def shamir_decode(shares: Sequence[tuple[int, int]], threshold: int, length: int = 32) -> tuple[bytes, list[int]]:
    """The secret from *all* the shares given, and the x of the shares that are wrong: the
    polynomial of degree < t that all but at most floor((r - t) / 2) of the r shares lie on
    (Reed-Solomon decoding, Berlekamp-Welch). Fewer than t shares, or too many wrong ones to
    tell which: an error. Exactly t shares are not checked (nothing to check them against): the
    server checks what they rebuild against the site's commitment or public key."""
    xs = [x for x, _ in shares]
    if len(set(xs)) != len(xs):
        raise SecAggError("Shamir shares with repeated x")
    if len(shares) < threshold:
        raise SecAggError(f"{len(shares)} shares, the threshold is {threshold}")
    poly = _interpolate(shares[:threshold])
    off = [x for x, y in shares if _evaluate(poly, x) != y % SHAMIR_PRIME]
    if off:  # some share is wrong: decode from all of them
        correctable = (len(shares) - threshold) // 2
        decoded = _berlekamp_welch(shares, threshold, correctable) if correctable else None
        off = None if decoded is None else [x for x, y in shares if _evaluate(decoded, x) != y % SHAMIR_PRIME]
        if off is None or len(off) > correctable:
            raise SecAggError(f"the {len(shares)} shares do not lie on one polynomial of degree < {threshold} up to "
                              f"{correctable} wrong ones: cannot tell which are wrong")
        poly = decoded
    return _secret_bytes(poly[0], length), off


def _raw(public_key: X25519PublicKey | Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _private_raw(key: X25519PrivateKey | Ed25519PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())


def _frame(*parts: bytes) -> bytes:
    """Length-prefixed concatenation: distinct tuples of fields give distinct byte strings."""
    return b"".join(len(p).to_bytes(4, "little") + p for p in parts)


def _u32(value: int) -> bytes:
    return int(value).to_bytes(4, "little")


class Roster:
    """The federation's sites, exchanged out of band: client id -> Ed25519 public key (32 raw
    bytes; files: ``fedlib_flower.roster``). A site's index in a round is its id's position in the
    sorted ids."""

    def __init__(self, keys: Mapping[str, bytes], source: str = "roster"):
        if not keys:
            raise SecAggError(f"{source}: no sites")
        self.ids = sorted(keys)
        self._keys: dict[str, Ed25519PublicKey] = {}
        for cid in self.ids:
            if not isinstance(cid, str) or not CLIENT_ID.fullmatch(cid):
                raise SecAggError(f"{source}: site id {cid!r}: expected 1 to 128 letters, digits, '.', '_', '-' "
                                  "(not starting with '.', '_' or '-')")
            key = keys[cid]
            if not isinstance(key, (bytes, bytearray)) or len(key) != 32:
                raise SecAggError(f"{source}: site {cid!r}: expected a 32-byte Ed25519 public key")
            self._keys[cid] = Ed25519PublicKey.from_public_bytes(bytes(key))
            twin = next((c for c in self._keys if c != cid and self._keys[c] == self._keys[cid]), None)
            if twin is not None:  # one signer for two sites: it could confirm for both
                raise SecAggError(f"{source}: sites {twin!r} and {cid!r} have one key")
        self.digest = hashlib.sha256(_frame(b"fedlib-secagg roster", *(
            part for cid in self.ids for part in (cid.encode(), self.key(cid))))).digest()

    def __len__(self) -> int:
        return len(self.ids)

    def key(self, client_id: str) -> bytes:
        return _raw(self._keys[client_id])

    def index(self, client_id: str) -> int:
        if client_id not in self._keys:
            raise SecAggError(f"site {client_id!r} is not in the roster ({len(self)} sites)")
        return self.ids.index(client_id)

    def verifies(self, index: int, signature: bytes, message: bytes) -> bool:
        """Whether the site at ``index`` signed ``message``."""
        try:
            self._keys[self.ids[index]].verify(bytes(signature), message)
        except (InvalidSignature, TypeError, ValueError):
            return False
        return True


def default_threshold(n_clients: int) -> int:
    """t = floor(n/2) + 1: the smallest majority, what SecAgg against an active server needs."""
    return n_clients // 2 + 1


def plan_digest(plan: Mapping) -> bytes:
    """SHA-256 of a plan (a mapping of JSON values), key order aside: what the sites sign at the
    key step and the ledger records."""
    try:
        text = json.dumps(dict(plan), sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as err:
        raise SecAggError(f"a plan of JSON values, got {err}") from None
    return hashlib.sha256(b"fedlib-secagg plan\0" + text.encode()).digest()


@dataclass(frozen=True)
class RoundContext:
    """What a round is, identical at every site and the server: bound into every signature and
    key derivation. ``threshold``: a majority of the roster; ``bits``: the word size (default
    the roster's vote counts', :func:`modulus_bits`)."""

    run_id: str
    round_index: int
    roster: Roster
    plan_digest: bytes
    threshold: int
    bits: int | None = None

    def __post_init__(self):
        n = len(self.roster)
        object.__setattr__(self, "run_id", str(self.run_id))
        object.__setattr__(self, "round_index", int(self.round_index))
        object.__setattr__(self, "threshold", int(self.threshold))
        object.__setattr__(self, "bits", modulus_bits(n) if self.bits is None else int(self.bits))
        if not default_threshold(n) <= self.threshold <= n:
            raise SecAggError(f"threshold {self.threshold}: a site accepts only a majority of its {n}-site roster, "
                              f"{default_threshold(n)}..{n} (fewer shares would let the server rebuild a site's "
                              "secrets while it is in the round)")
        if len(self.plan_digest) != 32:
            raise SecAggError(f"the plan digest is {len(self.plan_digest)} bytes, expected 32 (plan_digest)")
        _word_dtype(self.bits)
        object.__setattr__(self, "_framed", _frame(self.run_id.encode(), self.round_index.to_bytes(8, "little"),
                                                   self.roster.digest, self.plan_digest, _u32(self.threshold),
                                                   _u32(self.bits)))

    def bind(self, purpose: bytes, *parts: bytes) -> bytes:
        """The bytes a signature or key derivation for ``purpose`` covers: the context, then ``parts``."""
        return _frame(b"fedlib-secagg " + purpose) + self._framed + _frame(*parts)

    def to_record(self) -> dict:
        return {"run_id": self.run_id, "round_index": int(self.round_index), "roster_ids": list(self.roster.ids),
                "roster_keys": [self.roster.key(c) for c in self.roster.ids], "plan_digest": self.plan_digest,
                "threshold": self.threshold, "bits": self.bits}

    @classmethod
    def from_record(cls, record: Mapping) -> "RoundContext":
        roster = Roster(dict(zip(record["roster_ids"], map(bytes, record["roster_keys"]))))
        return cls(str(record["run_id"]), int(record["round_index"]), roster, bytes(record["plan_digest"]),
                   int(record["threshold"]), int(record["bits"]))


@dataclass(frozen=True)
class Advertisement:
    """A site's public keys of a round and the commitment to its self-mask seed, signed with
    its roster key over the context, its index and its id."""

    share_key: bytes
    masking_key: bytes
    seed_commitment: bytes
    signature: bytes

    @staticmethod
    def message(context: RoundContext, index: int, share_key: bytes, masking_key: bytes,
                seed_commitment: bytes) -> bytes:
        return context.bind(b"keys", _u32(index), context.roster.ids[index].encode(), bytes(share_key),
                            bytes(masking_key), bytes(seed_commitment))


def check_advertisement(context: RoundContext, index: int, advert: Advertisement) -> None:
    """An error naming the site unless ``advert`` is the site at ``index``'s, signed for this context."""
    if not 0 <= index < len(context.roster):
        raise SecAggError(f"index {index}: not a site of the {len(context.roster)}-site roster")
    fields = (advert.share_key, advert.masking_key, advert.seed_commitment)
    if not all(isinstance(f, (bytes, bytearray)) and len(f) == 32 for f in fields):
        raise SecAggError(f"site {context.roster.ids[index]!r}: advertised keys and seed commitment: 32 bytes each")
    if not context.roster.verifies(index, advert.signature, Advertisement.message(context, index, *fields)):
        raise SecAggError(f"site {context.roster.ids[index]!r}: the signature on its advertised keys does not verify "
                          "against the roster: keys substituted on the way, or the site was given another run, round, "
                          "plan, threshold or roster")


def _survivors_message(context: RoundContext, survivors: Sequence[int]) -> bytes:
    return context.bind(b"survivors", *(_u32(j) for j in sorted(survivors)))


def _seed_commitment(context: RoundContext, index: int, seed: bytes) -> bytes:
    # a 256-bit random seed: its hash hides it and binds the site to it
    return hashlib.sha256(context.bind(b"seed commitment", _u32(index), seed)).digest()


def _hkdf(context: RoundContext, purpose: bytes, shared: bytes, i: int, j: int) -> bytes:
    lo, hi = sorted((i, j))
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                info=context.bind(purpose, _u32(lo), _u32(hi))).derive(shared)


def pair_key(context: RoundContext, private_key: X25519PrivateKey, public_key: bytes, i: int, j: int) -> bytes:
    """s_ij: HKDF-SHA256 of the X25519 shared secret, bound to the round and the pair (i, j)."""
    return _hkdf(context, b"pair", private_key.exchange(X25519PublicKey.from_public_bytes(bytes(public_key))), i, j)


def _pair_sign(i: int, j: int) -> int:
    """Client i adds G(s_ij) when i < j and subtracts it when i > j: the two cancel."""
    return 1 if i < j else -1


#: bytes of one Shamir share's value (an element of the field 2^521 - 1)
SHARE_BYTES = 66


def _share_cipher(context: RoundContext, own: X25519PrivateKey, other: bytes, i: int, j: int) -> ChaCha20Poly1305:
    """The AEAD that carries Shamir shares between sites i and j through the server: a key from
    X25519 of their *share* keys (never the masking keys, which a dropout reveals), bound to the round."""
    return ChaCha20Poly1305(_hkdf(context, b"share", own.exchange(X25519PublicKey.from_public_bytes(bytes(other))),
                                  i, j))


def _share_nonce(sender: int, recipient: int) -> bytes:
    # one key per pair and round, each direction sent once (a second share step is refused)
    return _u32(sender) + _u32(recipient) + bytes(4)


@dataclass
class SecAggClient:
    """One site's side of a round (the module docstring lists the steps): its secrets, the
    shares it holds of the others', and what it has done this round, which it refuses to do
    twice. ``min_cohort``: the fewest sites (itself included) it takes part with, from its own
    configuration (0: the threshold alone)."""

    context: RoundContext
    client_id: str
    signing_key: Ed25519PrivateKey
    #: the masking key: pair keys with the others; Shamir-shared, revealed if this site drops out
    private_key: X25519PrivateKey
    self_seed: bytes
    #: encrypts the shares this site sends and receives; never shared
    share_key: X25519PrivateKey
    min_cohort: int = 0
    #: the advertised keys of the round's sites (index -> bytes), kept at the share step
    public_keys: dict[int, bytes] = field(default_factory=dict)
    share_public_keys: dict[int, bytes] = field(default_factory=dict)
    #: sender index -> (share of the sender's private key, share of its self-mask seed)
    held_shares: dict[int, tuple[tuple[int, int], tuple[int, int]]] = field(default_factory=dict)
    #: the round's progress, persisted: each step happens at most once
    shared: bool = False
    participants: list[int] | None = None
    complaints: list[int] = field(default_factory=list)
    uploading: bool = False
    masked: list[str] = field(default_factory=list)
    confirmed: list[int] | None = None
    revealed: bool = False
    _pair_keys: dict[int, bytes] = field(default_factory=dict, repr=False)

    def __post_init__(self):
        index = self.context.roster.index(self.client_id)
        if _raw(self.signing_key.public_key()) != self.context.roster.key(self.client_id):
            raise SecAggError(f"site {self.client_id!r}: its signing key is not the roster's key for it")
        self.index = index

    @classmethod
    def create(cls, context: RoundContext, client_id: str, signing_key: Ed25519PrivateKey, *, min_cohort: int = 0,
               rng: "_Randomness | None" = None) -> "SecAggClient":
        """Fresh secrets for one round, from ``rng`` (a seeded simulation) or the OS."""
        rng = rng or _Randomness(None)
        return cls(context, str(client_id), signing_key, X25519PrivateKey.from_private_bytes(rng.bytes(32)),
                   rng.bytes(32), X25519PrivateKey.from_private_bytes(rng.bytes(32)), int(min_cohort))

    @property
    def bits(self) -> int:
        return self.context.bits

    @property
    def threshold(self) -> int:
        return self.context.threshold

    @property
    def public_key(self) -> bytes:
        return _raw(self.private_key.public_key())

    def _refuse(self, what: str) -> SecAggError:
        c = self.context
        return SecAggError(f"site {self.client_id!r}, run {c.run_id}, round {c.round_index}: {what}")

    def _check_cohort(self, sites: Iterable[int], what: str) -> list[int]:
        sites = sorted(set(sites))
        if not all(isinstance(j, int) and 0 <= j < len(self.context.roster) for j in sites):
            raise self._refuse(f"{what} {sites} are not all sites of its {len(self.context.roster)}-site roster")
        if self.index not in sites:
            raise self._refuse(f"{what} {sites} do not include this site ({self.index})")
        floor = max(self.threshold, self.min_cohort)
        if len(sites) < floor:
            raise self._refuse(f"{len(sites)} {what}, fewer than the threshold {self.threshold} or this site's "
                               f"minimum cohort {self.min_cohort}")
        return sites

    def advertise(self) -> Advertisement:
        """The keys the server relays to every site, signed (deterministic: Ed25519)."""
        share, masking = _raw(self.share_key.public_key()), self.public_key
        commitment = _seed_commitment(self.context, self.index, self.self_seed)
        signature = self.signing_key.sign(Advertisement.message(self.context, self.index, share, masking, commitment))
        return Advertisement(share, masking, commitment, signature)

    def share_secrets(self, advertised: Mapping[int, Advertisement], rng: "_Randomness | None" = None
                      ) -> dict[int, bytes]:
        """Verify every advertised key against the roster, keep them; Shamir-split the masking
        key and the self-mask seed t-of-n (n: the roster); one ciphertext per advertised site
        (itself included), readable by its recipient only. Once per round."""
        if self.shared:
            raise self._refuse("already shared its secrets this round (a second share step would send new shares "
                               "under the same key and nonce)")
        self._check_cohort(advertised, "advertised sites")
        own = advertised[self.index]
        if (own.share_key, own.masking_key) != (_raw(self.share_key.public_key()), self.public_key):
            raise self._refuse("the server relayed other keys as this site's")
        for j, advert in advertised.items():
            try:
                check_advertisement(self.context, j, advert)
            except SecAggError as err:
                raise self._refuse(str(err)) from None
        rng = rng or _Randomness(None)
        self.shared = True
        self.share_public_keys = {j: bytes(a.share_key) for j, a in advertised.items()}
        self.public_keys = {j: bytes(a.masking_key) for j, a in advertised.items()}
        holders = len(self.context.roster)  # share x = holder index + 1
        sk_shares = shamir_split(_private_raw(self.private_key), holders, self.threshold, rng)
        b_shares = shamir_split(self.self_seed, holders, self.threshold, rng)
        out = {}
        for j in sorted(advertised):
            plain = sk_shares[j][1].to_bytes(SHARE_BYTES, "little") + b_shares[j][1].to_bytes(SHARE_BYTES, "little")
            cipher = _share_cipher(self.context, self.share_key, self.share_public_keys[j], self.index, j)
            out[j] = cipher.encrypt(_share_nonce(self.index, j), plain, None)
        return out

    def receive_shares(self, inbox: Mapping[int, bytes], participants: Sequence[int]) -> list[int]:
        """Take the round's participants (SecAgg's U2: the sites whose shares the server
        relayed; pair masks with them only) and decrypt what they sent this site (sender index
        -> ciphertext). Returns the participants whose ciphertext is missing or does not
        decrypt: the site reports them with its upload (the server drops them from the sum)."""
        if not self.shared:
            raise self._refuse("shares received before this site shared its own")
        if self.participants is not None:
            raise self._refuse("already received the round's shares")
        keep = self._check_cohort(participants, "participants")
        if not set(keep) <= set(self.public_keys):
            raise self._refuse(f"participants {keep} include sites that advertised no keys {sorted(self.public_keys)}")
        stray = sorted(set(inbox) - set(keep))
        if stray:
            raise self._refuse(f"shares from {stray}, who are not participants {keep}")
        x = self.index + 1
        complaints = []
        for sender in keep:
            cipher = _share_cipher(self.context, self.share_key, self.share_public_keys[sender], self.index, sender)
            try:
                plain = cipher.decrypt(_share_nonce(sender, self.index), bytes(inbox[sender]), None)
            except (KeyError, InvalidTag, TypeError):
                complaints.append(sender)
                continue
            if len(plain) != 2 * SHARE_BYTES:
                complaints.append(sender)
                continue
            self.held_shares[sender] = ((x, int.from_bytes(plain[:SHARE_BYTES], "little")),
                                        (x, int.from_bytes(plain[SHARE_BYTES:], "little")))
        if self.index in complaints:
            raise self._refuse("its own share to itself did not come back intact")
        self.participants, self.complaints = keep, complaints
        self.public_keys = {j: k for j, k in self.public_keys.items() if j in keep}
        return list(complaints)

    def begin_upload(self, plan: bytes) -> None:
        """Open this round's one upload, for the plan (its :func:`plan_digest`) signed at the
        key step. Persist :meth:`to_record` before the first word leaves: a second upload under
        the same secrets (e.g. for another plan) would give away the difference of the masks."""
        if self.participants is None:
            raise self._refuse("an upload before the round's shares were received")
        if self.uploading:
            raise self._refuse("already uploaded this round (a second upload under the same secrets gives away "
                               "the difference of the two)")
        if bytes(plan) != self.context.plan_digest:
            raise self._refuse("the upload's plan is not the plan this site signed at the key step")
        self.uploading = True

    def _pair(self, j: int) -> bytes:
        if j not in self._pair_keys:
            self._pair_keys[j] = pair_key(self.context, self.private_key, self.public_keys[j], self.index, j)
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
        the self mask and the signed pair masks, modulo 2^k. Each name once per round."""
        if not self.uploading:
            raise self._refuse(f"{name}: masked before begin_upload")
        if name in self.masked:
            raise self._refuse(f"{name}: already masked this round (two vectors under one pad give away their "
                               "difference)")
        dtype = _word_dtype(self.bits)
        if words.dtype != dtype or words.ndim != 1:
            raise SecAggError(f"{name}: expected a flat vector of {dtype} words, got {words.dtype} {words.shape}")
        self.masked.append(name)
        y = words.copy()
        y += keystream_words(self.self_seed, f"self:{name}", y.size, self.bits)
        for j in self.participants:
            if j == self.index:
                continue
            g = keystream_words(self._pair(j), f"pair:{name}", y.size, self.bits)
            if _pair_sign(self.index, j) > 0:
                y += g
            else:
                y -= g
        return _reduce(y, self.bits)

    def confirm_survivors(self, survivors: Sequence[int]) -> bytes:
        """Sign the survivor list the server announced (SecAgg's consistency check); one list per
        round: asked again with another, the site refuses."""
        if not self.uploading:
            raise self._refuse("asked to confirm survivors without having uploaded")
        alive = self._check_cohort(survivors, "survivors")
        if not set(alive) <= set(self.participants):
            raise self._refuse(f"survivors {alive} are not all participants {self.participants}")
        if self.confirmed is not None and self.confirmed != alive:
            raise self._refuse(f"already confirmed the survivors {self.confirmed}, now told {alive}")
        self.confirmed = alive
        return self.signing_key.sign(_survivors_message(self.context, alive))

    def reveal(self, survivors: Sequence[int], confirmations: Mapping[int, bytes]
               ) -> dict[int, tuple[str, tuple[int, int]]]:
        """The unmasking step, once per round, only for the survivor list this site confirmed and
        only with valid signatures on that same list from at least t survivors: per participant,
        the share of its self-mask seed if it survived, of its private key if not (never both)."""
        if self.revealed:
            raise self._refuse("already revealed its shares this round")
        alive = sorted(set(survivors))
        if self.confirmed is None or self.confirmed != alive:
            raise self._refuse(f"asked to reveal for survivors {alive}, it confirmed {self.confirmed}")
        signers = sorted(set(confirmations))
        bad = [j for j in signers if j not in alive
               or not self.context.roster.verifies(j, confirmations[j], _survivors_message(self.context, alive))]
        if bad:
            raise self._refuse(f"confirmations of survivors {alive} from {bad} do not verify: the sites were told "
                               "different survivor lists, or the confirmations were altered")
        if len(signers) < self.threshold:
            raise self._refuse(f"{len(signers)} confirmations of survivors {alive}, the threshold is {self.threshold}")
        self.revealed = True
        return {s: ("self", b) if s in alive else ("key", sk) for s, (sk, b) in self.held_shares.items()}

    def to_record(self) -> dict:
        """This site's state between the steps of a round, as plain values (a Flower ClientApp
        keeps it in the site's own ``context.state``, never sent). The signing key is not in it."""
        owners = sorted(self.held_shares)
        clients = sorted(self.public_keys)
        return {
            **self.context.to_record(), "client_id": self.client_id, "min_cohort": self.min_cohort,
            "private_key": _private_raw(self.private_key), "share_key": _private_raw(self.share_key),
            "self_seed": self.self_seed, "clients": clients,
            "public_keys": [self.public_keys[j] for j in clients],
            "share_public_keys": [self.share_public_keys[j] for j in clients],
            "owners": owners,
            "key_shares": [self.held_shares[o][0][1].to_bytes(SHARE_BYTES, "little") for o in owners],
            "seed_shares": [self.held_shares[o][1][1].to_bytes(SHARE_BYTES, "little") for o in owners],
            "shared": self.shared, "received": self.participants is not None,
            "participants": list(self.participants or []), "complaints": list(self.complaints),
            "uploading": self.uploading, "masked": list(self.masked),
            "has_confirmed": self.confirmed is not None, "confirmed": list(self.confirmed or []),
            "revealed": self.revealed,
        }

    @classmethod
    def from_record(cls, record: Mapping, signing_key: Ed25519PrivateKey) -> "SecAggClient":
        context = RoundContext.from_record(record)
        cid = str(record["client_id"])
        x = context.roster.index(cid) + 1
        clients = [int(j) for j in record["clients"]]
        return cls(
            context, cid, signing_key, X25519PrivateKey.from_private_bytes(bytes(record["private_key"])),
            bytes(record["self_seed"]), X25519PrivateKey.from_private_bytes(bytes(record["share_key"])),
            int(record["min_cohort"]), dict(zip(clients, map(bytes, record["public_keys"]))),
            dict(zip(clients, map(bytes, record["share_public_keys"]))),
            {int(o): ((x, int.from_bytes(k, "little")), (x, int.from_bytes(b, "little")))
             for o, k, b in zip(record["owners"], record["key_shares"], record["seed_shares"])},
            bool(record["shared"]), [int(j) for j in record["participants"]] if record["received"] else None,
            [int(j) for j in record["complaints"]], bool(record["uploading"]), [str(n) for n in record["masked"]],
            [int(j) for j in record["confirmed"]] if record["has_confirmed"] else None, bool(record["revealed"]))


def _reduce(words: np.ndarray, bits: int) -> np.ndarray:
    if bits < 8 * words.dtype.itemsize:
        words &= words.dtype.type((1 << bits) - 1)
    return words


def check_vote_totals(name: str, counts: torch.Tensor, n_clients: int, cohort: Mapping) -> None:
    """What m honest sites' masks sum to, checked on the unmasked ``counts`` (the layer's
    shape): under a uniform allocation every comparison group of the cohort's ``group`` holds
    m * k votes (each site prunes k of it, :func:`fedlib.groups.pruned_count`; N of every M for
    N:M); under a per-layer ratio (``nonuniform``) every row (column) holds the same total. A
    wrong total is an upload that is not the mask its site claims (or a corrupt share)."""
    group, allocation = cohort["group"], cohort["allocation"]
    rows, cols = counts.shape
    if group == "layer":
        by_group, size = counts.reshape(1, -1), rows * cols
    elif group == "row":
        by_group, size = counts, cols
    elif group == "column":
        by_group, size = counts.T, rows
    else:
        k, m = parse_nm(group)
        by_group = counts.reshape(-1, m)
    totals = by_group.sum(1, dtype=torch.int64)
    if group not in GROUPS or allocation == "uniform":  # N:M prunes N of every M whatever the allocation
        k = pruned_count(size, float(cohort["sparsity"])) if group in GROUPS else k
        want, what = n_clients * k, f"{n_clients} sites each pruning {k} of every {group} group give {n_clients * k}"
    elif allocation == "nonuniform" and group in ("row", "column"):
        want, what = int(totals[0]), f"one ratio per layer gives every {group} the same total ({int(totals[0])})"
    elif allocation == "nonuniform":
        return  # one group per layer: its total is the sites' own allocation
    else:
        raise SecAggError(f"layer {name}: allocation {allocation!r}, expected 'uniform' or 'nonuniform'")
    odd = (totals != want).nonzero()
    if len(odd):
        i = int(odd[0, 0])
        raise SecAggError(f"layer {name}: {group} group {i} holds {int(totals[i])} votes; {what}: an upload is not "
                          "the mask its site claims (or a share is corrupt)")


@dataclass
class SecAggServer:
    """The server's side: the context, the sites' advertised public keys, the uploads and the
    reveals; it never holds a secret that could reveal a site's mask. ``suspects``: client id ->
    what it was caught doing (for the round's record)."""

    context: RoundContext
    advertised: dict[int, Advertisement] = field(default_factory=dict)
    suspects: dict[str, str] = field(default_factory=dict)
    _survivors: list[int] | None = field(default=None, repr=False)
    _seeds: dict[int, bytes] = field(default_factory=dict, repr=False)
    _dropped: dict[int, X25519PrivateKey] = field(default_factory=dict, repr=False)

    @property
    def threshold(self) -> int:
        return self.context.threshold

    @property
    def bits(self) -> int:
        return self.context.bits

    def _suspect(self, index: int, what: str) -> None:
        cid = self.context.roster.ids[index]
        self.suspects[cid] = f"{self.suspects[cid]}; {what}" if cid in self.suspects else what

    def admit(self, advertised: Mapping[int, Advertisement]) -> dict[int, Advertisement]:
        """The advertisements whose signature verifies (what to relay); the others are named."""
        for j, advert in advertised.items():
            try:
                check_advertisement(self.context, j, advert)
            except SecAggError as err:
                if 0 <= j < len(self.context.roster):
                    self._suspect(j, str(err))
                continue
            self.advertised[j] = advert
        return dict(self.advertised)

    def drop_accused(self, uploaded: Iterable[int], complaints: Mapping[int, Sequence[int]]) -> list[int]:
        """The survivors: the uploaders less every site another uploader says sent it shares that
        do not decrypt (its votes leave the sum: its key is rebuilt as a dropout's, its seed never
        revealed). Both are named: only they know which of them lied."""
        uploaded = sorted(set(uploaded))
        ids, accused = self.context.roster.ids, set()
        for j in uploaded:
            for s in complaints.get(j, ()):
                if s not in self.advertised:
                    self._suspect(j, f"complained about {s!r}, not a site of this round")
                    continue
                accused.add(s)
                self._suspect(s, f"its shares to {ids[j]!r} did not decrypt (or {ids[j]!r} says so falsely)")
                self._suspect(j, f"says the shares of {ids[s]!r} did not decrypt")
        return [j for j in uploaded if j not in accused]

    def admit_confirmations(self, survivors: Sequence[int], confirmations: Mapping[int, bytes]) -> dict[int, bytes]:
        """The survivors' signatures on ``survivors`` that verify (what to relay); others named."""
        message = _survivors_message(self.context, survivors)
        valid = {}
        for j, signature in confirmations.items():
            if j in survivors and self.context.roster.verifies(j, signature, message):
                valid[j] = signature
            elif 0 <= j < len(self.context.roster):
                self._suspect(j, "its confirmation of the survivor list does not verify")
        return valid

    def recover(self, reveals: Mapping[int, Mapping[int, tuple[str, tuple[int, int]]]], survivors: Sequence[int],
                participants: Sequence[int] | None = None) -> None:
        """Rebuild, from every share revealed, the survivors' self-mask seeds and the masking keys
        of the participants that dropped out (``participants``: default, every advertiser).
        Wrong shares are corrected and their holders named; a rebuilt secret that is not what its
        site committed to (seed) or advertised (key) names that site as having dealt bad shares.
        ``reveals[j]`` is survivor j's :meth:`SecAggClient.reveal`; at least t of them."""
        survivors = sorted(set(survivors))
        participants = sorted(self.advertised if participants is None else set(participants))
        if not set(survivors) <= set(participants) <= set(self.advertised):
            raise SecAggError(f"survivors {survivors}, participants {participants}, advertised "
                              f"{sorted(self.advertised)}: each must hold the one before")
        holders = sorted(j for j in reveals if j in survivors)
        if len(survivors) < self.threshold or len(holders) < self.threshold:
            raise SecAggError(f"{len(survivors)} survivors, reveals from {len(holders)}: the threshold is "
                              f"{self.threshold}, the sum cannot be unmasked")
        ids = self.context.roster.ids
        for j in sorted(set(reveals) - set(holders)):
            self._suspect(j, "revealed shares without being a survivor (ignored)")
        self._seeds, self._dropped = {}, {}
        for owner in participants:
            kind = "self" if owner in survivors else "key"
            shares = {}
            for j in holders:
                entry = reveals[j].get(owner)
                if entry is None:
                    continue
                k, (x, y) = entry
                if k != kind or x != j + 1:
                    self._suspect(j, f"revealed a {k} share of {ids[owner]!r} at x = {x}, expected {kind} at {j + 1}")
                    continue
                shares[j] = (x, y)
            try:
                secret, off = shamir_decode(list(shares.values()), self.threshold)
            except SecAggError as err:
                raise SecAggError(f"the {kind} secret of {ids[owner]!r}: {err} (holders {[ids[j] for j in shares]}; "
                                  f"{ids[owner]!r} may have dealt inconsistent shares)") from None
            for x in off:
                self._suspect(x - 1, f"its share of the {kind} secret of {ids[owner]!r} is off the polynomial the "
                                     f"others lie on (it altered it, or {ids[owner]!r} dealt it wrong)")
            advert = self.advertised[owner]
            if kind == "self":
                if _seed_commitment(self.context, owner, secret) != advert.seed_commitment:
                    raise self._dealer(owner, "self-mask seed is not the one it committed to")
                self._seeds[owner] = secret
            else:
                key = X25519PrivateKey.from_private_bytes(secret)
                if _raw(key.public_key()) != advert.masking_key:
                    raise self._dealer(owner, "masking key does not match its advertised public key")
                self._dropped[owner] = key
        self._survivors = survivors

    def _dealer(self, owner: int, what: str) -> SecAggError:
        cid = self.context.roster.ids[owner]
        self._suspect(owner, f"dealt shares of another secret: the rebuilt {what}")
        return SecAggError(f"site {cid!r} dealt shares of another secret: the rebuilt {what}; the round has no result")

    def unmask_words(self, name: str, uploads: Mapping[int, np.ndarray]) -> np.ndarray:
        """The sum modulo 2^k of the survivors' words (``uploads``: their masked uploads, after
        :meth:`recover`): their self masks and the pair masks with dropped sites removed; pair
        masks between two survivors cancel in the sum."""
        if self._survivors is None:
            raise SecAggError(f"{name}: unmask before recover")
        if sorted(uploads) != self._survivors:
            raise SecAggError(f"{name}: uploads from {sorted(uploads)}, the survivors are {self._survivors}")
        sizes = {u.size for u in uploads.values()}
        if len(sizes) != 1:
            raise SecAggError(f"{name}: uploads of different lengths {sorted(sizes)}")
        numel = sizes.pop()
        dtype = _word_dtype(self.bits)
        total = np.zeros(numel, dtype=dtype)
        for u in uploads.values():
            if u.dtype != dtype:
                raise SecAggError(f"{name}: an upload of dtype {u.dtype}, expected {dtype}")
            total += u
        for i in self._survivors:
            total -= keystream_words(self._seeds[i], f"self:{name}", numel, self.bits)
        for d, key in self._dropped.items():
            for j in self._survivors:
                # j's upload holds sign(j, d) * G(s_jd): remove it
                g = keystream_words(pair_key(self.context, key, self.advertised[j].masking_key, d, j), f"pair:{name}",
                                    numel, self.bits)
                if _pair_sign(j, d) > 0:
                    total -= g
                else:
                    total += g
        return _reduce(total, self.bits)

    def unmask(self, name: str, uploads: Mapping[int, np.ndarray], shape: Sequence[int],
               cohort: Mapping | None) -> torch.Tensor:
        """sum_i M_i over the survivors, as int16 counts of ``shape``, checked: at most one vote per
        survivor, and the group totals of :func:`check_vote_totals` for the masks' ``cohort``
        (its ``group``, ``sparsity``, ``allocation``; None only for masks of no declared group)."""
        counts = self.unmask_words(name, uploads)
        if counts.size != int(np.prod(shape)):
            raise SecAggError(f"layer {name}: {counts.size} words, its shape {tuple(shape)} holds "
                              f"{int(np.prod(shape))}")
        if int(counts.max(initial=0)) > len(uploads):
            raise SecAggError(f"layer {name}: unmasked counts exceed the {len(uploads)} survivors "
                              "(an upload or a share is corrupt)")
        votes = torch.from_numpy(counts.astype(np.int16)).reshape(tuple(shape))
        if cohort is not None:
            check_vote_totals(name, votes, len(uploads), cohort)
        return votes


class ContributionLedger:
    """A site's record of the plans it contributed to secure aggregation (their
    :func:`plan_digest`, the run, whether the upload was differentially private), a JSON file of
    the site's own. Two sums of one plan over cohorts that differ by this site give its mask
    away: :meth:`admit` refuses a plan it already contributed (in another run, or again in the
    same run under fresh keys) unless the new upload is DP. Digest what determines the mask
    (method, sparsity, group, options, round, data), not the encoding: a plan that differs only
    in the file format is the same mask."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def entries(self) -> list[dict]:
        if not self.path.exists():
            return []
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError) as err:
            raise SecAggError(f"{self.path}: not a readable contribution ledger ({err})") from None
        entries = data.get("contributions") if isinstance(data, dict) else None
        if not isinstance(entries, list):
            raise SecAggError(f"{self.path}: field 'contributions': expected a list")
        for i, e in enumerate(entries):
            ok = isinstance(e, dict) and isinstance(e.get("run"), str) and isinstance(e.get("dp"), bool) \
                and isinstance(e.get("plan"), str) and re.fullmatch(r"[0-9a-f]{64}", e["plan"])
            if not ok:
                raise SecAggError(f"{self.path}: contributions[{i}]: expected plan (64 hex digits), run (a string), "
                                  "dp (true/false)")
        return entries

    def admit(self, plan: bytes, run_id: str, dp: bool) -> None:
        """Record this upload of ``plan`` (a digest) in run ``run_id``, or refuse it: the plan was
        contributed before and this upload is not DP. Recorded before the upload leaves."""
        entries, digest, run_id = self.entries(), bytes(plan).hex(), str(run_id)
        if not dp:
            earlier = sorted({e["run"] for e in entries if e["plan"] == digest})
            if earlier:
                raise SecAggError(f"{self.path}: this site already contributed this plan (run {', '.join(earlier)}); "
                                  "a second sum over another cohort would give its mask away: refused unless the "
                                  "upload is differentially private")
        entries.append({"plan": digest, "run": run_id, "dp": bool(dp)})
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as handle:
            json.dump({"contributions": entries}, handle, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.path)


def simulation_sites(n_clients: int, rng: "_Randomness") -> tuple[Roster, list[str], list[Ed25519PrivateKey]]:
    """n sites with ids ``site-000``... and Ed25519 keys from ``rng``: a simulation's roster."""
    width = len(str(n_clients - 1))
    ids = [f"site-{i:0{width}d}" for i in range(n_clients)]
    keys = [Ed25519PrivateKey.from_private_bytes(rng.bytes(32)) for _ in ids]
    return Roster({cid: _raw(k.public_key()) for cid, k in zip(ids, keys)}), ids, keys


#: the plan a simulated round signs (one process: nobody can send another)
SIMULATION_PLAN = plan_digest({"simulation": True})


def setup_round(n_clients: int, threshold: int | None = None, seed: int | None = 0, bits: int | None = None,
                run_id: str = "simulation", round_index: int = 0) -> tuple[list[SecAggClient], SecAggServer]:
    """Key advertisement and share distribution of one simulated round: n sites of a roster
    (:func:`simulation_sites`), every secret Shamir-shared t-of-n (default t = floor(n/2) + 1)
    and encrypted to its holder, the server relaying signed keys and ciphertexts (here in one
    process; over the network: flower/); each site has begun its upload (:meth:`SecAggClient.begin_upload`).
    ``bits``: the word size (default: the smallest that counts n votes, :func:`modulus_bits`)."""
    rng = _Randomness(seed)
    roster, ids, keys = simulation_sites(n_clients, rng)
    threshold = default_threshold(n_clients) if threshold is None else int(threshold)
    context = RoundContext(run_id, round_index, roster, SIMULATION_PLAN, threshold, bits)
    clients = [SecAggClient.create(context, cid, key, rng=rng) for cid, key in zip(ids, keys)]
    server = SecAggServer(context)
    advertised = server.admit({c.index: c.advertise() for c in clients})
    outboxes = {c.index: c.share_secrets(advertised, rng) for c in clients}
    for c in clients:
        c.receive_shares({sender: box[c.index] for sender, box in outboxes.items()}, sorted(outboxes))
        c.begin_upload(SIMULATION_PLAN)
    return clients, server


def finish_round(clients: Sequence[SecAggClient], server: SecAggServer, survivors: Sequence[int]) -> None:
    """The simulated round's consistency check and reveal: the survivors confirm the list, reveal
    against each other's confirmations, the server recovers what it needs to unmask."""
    signatures = {j: clients[j].confirm_survivors(survivors) for j in survivors}
    confirmations = server.admit_confirmations(survivors, signatures)
    reveals = {j: clients[j].reveal(survivors, confirmations) for j in survivors}
    server.recover(reveals, survivors)


def secure_vote_counts(masks: Sequence[Mapping[str, torch.Tensor]], names: Sequence[str],
                       threshold: int | None = None, seed: int | None = 0, dropped: Sequence[int] = (),
                       cohort: Mapping | None = None) -> dict[str, torch.Tensor]:
    """One simulated round over whole masks: every site in ``masks`` masks each layer, the sites
    in ``dropped`` never send their uploads, the server unmasks the survivors' sum per layer
    ({name: int16 counts in the layer's shape}), checking the totals of the masks' ``cohort``
    (:func:`check_vote_totals`; None: masks of no declared group)."""
    clients, server = setup_round(len(masks), threshold, seed)
    survivors = [c.index for c in clients if c.index not in set(dropped)]
    finish_round(clients, server, survivors)
    out = {}
    for name in names:
        uploads = {j: clients[j].masked_upload(name, masks[j][name]) for j in survivors}
        out[name] = server.unmask(name, uploads, masks[0][name].shape, cohort)
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
