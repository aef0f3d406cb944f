"""Rosters and signing keys: who is in a federation, written by people, exchanged out of band.

A roster is a JSON object, client id -> that site's Ed25519 public key, the key written either
as 64 hex digits (its 32 raw bytes) or as a PEM ``PUBLIC KEY`` block::

    {"hospital-a": "3b6a27bc...", "hospital-b": "-----BEGIN PUBLIC KEY-----\\n...\\n-----END PUBLIC KEY-----\\n"}

The coordinator's roster (run config ``roster``) assigns each node its client id from the key
the node proves it holds in ``hello``; a site's roster (node config ``roster``) names its peers
in the same format. Ids are :data:`fedlib.protocol.CLIENT_ID` names, two ids never share a key.
A site's signing key (node config ``signing-key``) is an unencrypted PKCS#8 PEM Ed25519
private key (``openssl genpkey -algorithm ed25519``).
"""

from __future__ import annotations

import json
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fedlib.protocol import client_id

#: raw Ed25519 public keys are 32 bytes
KEY_BYTES = 32


class RosterError(ValueError):
    """A roster or key file that is not what this module's docstring describes."""

    def __init__(self, path: Path | str, field: str, message: str):
        self.path, self.field = str(path), field
        super().__init__(f"{path}: field {field!r}: {message}")


def raw_public_key(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _public_key(text: object, path: Path, field: str) -> Ed25519PublicKey:
    if not isinstance(text, str):
        raise RosterError(path, field, f"expected a public key (64 hex digits or PEM), got {type(text).__name__}")
    try:
        if text.startswith("-----BEGIN PUBLIC KEY-----"):
            key = serialization.load_pem_public_key(text.encode())
        elif len(text) == 2 * KEY_BYTES:
            key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(text))
        else:
            raise ValueError(f"{len(text)} characters, neither 64 hex digits nor a PEM block")
    except ValueError as err:
        raise RosterError(path, field, f"not an Ed25519 public key: {err}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise RosterError(path, field, f"a {type(key).__name__.lstrip('_')}, expected an Ed25519 public key")
    return key


def load_roster(path: Path | str) -> dict[str, Ed25519PublicKey]:
    """The roster at ``path``: client id -> public key, in id order."""
    path = Path(path)
    try:
        entries = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise RosterError(path, "*", f"not a readable JSON roster: {err}") from None
    if not isinstance(entries, dict) or not entries:
        raise RosterError(path, "*", "expected a JSON object {client id: Ed25519 public key} with one site at least")
    roster, seen = {}, {}
    for cid in sorted(entries):
        try:
            client_id(cid)
        except ValueError as err:
            raise RosterError(path, cid, str(err)) from None
        key = _public_key(entries[cid], path, cid)
        raw = raw_public_key(key)
        if raw in seen:
            raise RosterError(path, cid, f"the same public key as {seen[raw]!r}: one key, one site")
        roster[cid], seen[raw] = key, cid
    return roster


def load_signing_key(path: Path | str) -> Ed25519PrivateKey:
    """A site's Ed25519 private key (PKCS#8 PEM, unencrypted)."""
    path = Path(path)
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as err:
        raise RosterError(path, "signing-key", f"not a readable unencrypted PEM private key: {err}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise RosterError(path, "signing-key", f"a {type(key).__name__.lstrip('_')}, expected an Ed25519 key")
    return key


def secagg_roster(roster: dict[str, Ed25519PublicKey], source: str):
    """``roster`` as :class:`fedlib.server.secagg.Roster`, what secure aggregation checks every
    signature against (a site's index in a round is its position in the sorted ids)."""
    from fedlib.server.secagg import Roster

    return Roster({cid: raw_public_key(key) for cid, key in roster.items()}, source=source)


def new_signing_key(path: Path | str) -> Ed25519PrivateKey:
    """A fresh Ed25519 key written to ``path`` (PKCS#8 PEM, owner-readable only)."""
    key = Ed25519PrivateKey.generate()
    path = Path(path)
    path.touch(mode=0o600, exist_ok=False)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return key


def write_roster(path: Path | str, keys: dict[str, Ed25519PublicKey]) -> None:
    """A roster file (hex keys) that :func:`load_roster` reads back as ``keys``."""
    Path(path).write_text(json.dumps({cid: raw_public_key(key).hex() for cid, key in sorted(keys.items())},
                                     indent=2) + "\n")


def verifies(key: Ed25519PublicKey, signature: bytes, statement: bytes) -> bool:
    try:
        key.verify(signature, statement)
    except InvalidSignature:
        return False
    return True
