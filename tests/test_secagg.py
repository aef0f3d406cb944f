"""Secure aggregation (fedlib.server.secagg): the server's unmasked sum is plain vote counting bit
for bit, with and without dropouts; a single masked upload says nothing about its mask."""

import numpy as np
import pytest
import torch
from scipy import stats

from fedlib.maskfile import MaskFile
from fedlib.models import fingerprint, prunable_layers
from fedlib.server import FedPrLLM
from fedlib.server.fedprllm import global_mask_from_votes
from fedlib.server.secagg import (
    SecAggClient, SecAggError, _Randomness, modulus_bits, pack_words, secure_vote_counts, setup_round, shamir_combine,
    shamir_split, unpack_words,
)

from test_server import _clients


def test_unmasked_sum_is_plain_vote_counting_bit_for_bit(model, tmp_path):
    paths, masks = _clients(model, tmp_path, n=5)
    layers = prunable_layers(model)
    names = [info.name for info in layers]
    counts = secure_vote_counts(masks, names, seed=3)
    out = tmp_path / "global.mask.safetensors"
    FedPrLLM(group="row", sparsity=0.5, seed=0).aggregate(paths, fingerprint(model), layers, out)
    plain = MaskFile(out, fingerprint(model), layers)
    for name in names:
        assert counts[name].dtype == torch.int16
        assert torch.equal(counts[name], sum(m[name].to(torch.int16) for m in masks))
        assert torch.equal(counts[name], plain.layer_votes(name).to(torch.int16))
        # the server's selection on the securely aggregated counts is the plain global mask
        assert torch.equal(global_mask_from_votes(counts[name], 0.5, "row", 0, name), plain.layer_mask(name))


@pytest.mark.parametrize("n, dropped, threshold", [(6, [1, 4], 4), (6, [0], None), (5, [2, 3], 3), (2, [], 2)])
def test_dropouts_leave_the_survivors_sum(n, dropped, threshold):
    gen = torch.Generator().manual_seed(n)
    masks = [{"a": torch.rand(7, 9, generator=gen) < 0.5, "b": torch.rand(33, generator=gen) < 0.3} for _ in range(n)]
    counts = secure_vote_counts(masks, ["a", "b"], threshold=threshold, seed=1, dropped=dropped)
    for name in ("a", "b"):
        expected = sum(masks[i][name].to(torch.int16) for i in range(n) if i not in dropped)
        assert torch.equal(counts[name], expected)


def test_too_few_survivors_or_shares_give_no_result():
    masks = [{"a": torch.ones(10, dtype=torch.bool)} for _ in range(5)]
    # the survivors themselves refuse to reveal below the threshold (SecAgg's client-side check)
    with pytest.raises(SecAggError, match=r"survivors \[3, 4\] are not 3 or more"):
        secure_vote_counts(masks, ["a"], threshold=3, dropped=[0, 1, 2])
    clients, server = setup_round(5, threshold=3, seed=0)
    survivors = [0, 1, 2, 3, 4]
    uploads = {j: clients[j].masked_upload("a", masks[j]["a"]) for j in survivors}
    with pytest.raises(SecAggError, match="2 surviving clients, the threshold is 3"):
        server.unmask("a", {j: uploads[j] for j in (3, 4)}, {})
    reveals = {j: clients[j].reveal(survivors) for j in survivors}
    # each survivor reveals one share per client, of the self seed only (nobody dropped)
    assert all({kind for kind, _ in r.values()} == {"self"} and len(r) == 5 for r in reveals.values())
    assert torch.equal(server.unmask("a", uploads, reveals), torch.full((10,), 5, dtype=torch.int16))
    # a client that uploaded and then vanished before revealing: t = 3 reveals still unmask
    assert torch.equal(server.unmask("a", uploads, {j: reveals[j] for j in survivors[2:]}),
                       torch.full((10,), 5, dtype=torch.int16))
    with pytest.raises(SecAggError, match="reveals from"):
        server.unmask("a", uploads, {j: reveals[j] for j in survivors[:2]})
    # a corrupted upload is caught (counts above the number of survivors), not returned
    bad = dict(uploads)
    bad[0] = (bad[0] + np.uint8(1)) & np.uint8(7)  # every count 5 -> 6 (mod 2^3)
    with pytest.raises(SecAggError, match="corrupt"):
        server.unmask("a", bad, reveals)


def test_a_dropped_client_is_revealed_by_key_share_not_self_share():
    clients, _ = setup_round(4, threshold=2, seed=0)
    r = clients[0].reveal([0, 1, 3])
    assert r[1][0] == "self" and r[3][0] == "self" and r[2][0] == "key"
    assert r[2][1] == clients[0].held_shares[2][0]  # the share of client 2's private key
    with pytest.raises(SecAggError, match="already revealed"):  # asked again, e.g. for client 2's seed share
        clients[0].reveal([0, 1, 2, 3])


def test_shares_travel_encrypted_to_their_recipient_only():
    """Each client's shares reach the others as ChaCha20-Poly1305 ciphertexts under a key of the
    pair's *share* keys: the plain share values are not in what the server relays, a ciphertext
    altered or delivered to another client is refused, and a client's state survives a round trip
    through plain values (what a Flower ClientApp keeps between the steps)."""
    rng = _Randomness(4)
    clients = [SecAggClient.create(i, 3, rng) for i in range(3)]
    advertised = {c.index: c.advertise() for c in clients}
    outboxes = {c.index: c.share_secrets(advertised, 2, rng) for c in clients}
    relayed = b"".join(data for box in outboxes.values() for data in box.values())
    for c in clients:
        c.receive_shares({sender: box[c.index] for sender, box in outboxes.items()})
    for holder in clients:
        for _, (sk, b) in holder.held_shares.items():
            assert sk[1].to_bytes(66, "little") not in relayed and b[1].to_bytes(66, "little") not in relayed
    # any two holders rebuild client 0's self seed, as Shamir 2-of-3
    assert shamir_combine([clients[1].held_shares[0][1], clients[2].held_shares[0][1]]) == clients[0].self_seed
    fresh = SecAggClient.create(1, 3, _Randomness(4))
    with pytest.raises(SecAggError, match="relayed other public keys"):
        fresh.share_secrets(advertised, 2, rng)
    tampered = bytearray(outboxes[0][1])
    tampered[0] ^= 1
    with pytest.raises(SecAggError, match="from client 0 does not decrypt"):
        clients[1].receive_shares({0: bytes(tampered)})
    with pytest.raises(SecAggError, match="from client 0 does not decrypt"):
        clients[2].receive_shares({0: outboxes[0][1]})  # meant for client 1
    again = SecAggClient.from_record(clients[1].to_record())
    assert again.held_shares == clients[1].held_shares and again.advertise() == clients[1].advertise()
    mask = torch.rand(50, generator=torch.Generator().manual_seed(1)) < 0.5
    assert np.array_equal(again.masked_upload("w", mask), clients[1].masked_upload("w", mask))


def test_shamir_threshold():
    rng = _Randomness(5)
    secret = bytes(range(32))
    shares = shamir_split(secret, 7, 4, rng)
    for pick in ([0, 1, 2, 3], [6, 2, 4, 0], [1, 3, 5, 6, 0]):
        assert shamir_combine([shares[i] for i in pick]) == secret
    with pytest.raises(SecAggError, match="do not reconstruct"):
        shamir_combine(shares[:3])  # t - 1 shares: a random field element, not the secret


def test_single_upload_is_uniform_and_independent_of_the_mask():
    n, numel = 3, 4096
    bits = modulus_bits(n)
    assert bits == 2  # 2^k > n
    zeros, ones = torch.zeros(numel, dtype=torch.bool), torch.ones(numel, dtype=torch.bool)
    clients, _ = setup_round(n, seed=11)
    y0 = clients[0].masked_upload("w", zeros)
    y1 = clients[0].masked_upload("w", ones)
    # same keys: the two uploads differ exactly by the masks (an additive one-time pad) ...
    assert np.array_equal((y1.astype(np.int64) - y0) % (1 << bits), np.ones(numel, dtype=np.int64))
    # ... and each is uniform over the 2^k words (chi-square at the 0.1 % level, fixed seed)
    for y in (y0, y1):
        assert stats.chisquare(np.bincount(y, minlength=1 << bits)).pvalue > 1e-3
    # over fresh rounds, the server's view of one word is the same law for mask 0 and mask 1:
    # a two-sample chi-square cannot tell them apart, and both are uniform
    views = {b: np.array([setup_round(n, seed=s)[0][1].masked_upload("w", torch.tensor([b]))[0]
                          for s in range(100 * b, 100 * b + 100)]) for b in (False, True)}
    table = np.array([np.bincount(views[b], minlength=1 << bits) for b in (False, True)])
    assert stats.chi2_contingency(table).pvalue > 1e-3
    assert all(stats.chisquare(row).pvalue > 1e-3 for row in table)


@pytest.mark.slow
def test_rounds_are_reproducible_and_words_pack_to_k_bits():
    mask = torch.rand(1001, generator=torch.Generator().manual_seed(0)) < 0.5
    a = setup_round(17, seed=2)[0][5].masked_upload("w", mask)
    assert np.array_equal(a, setup_round(17, seed=2)[0][5].masked_upload("w", mask))
    assert not np.array_equal(a, setup_round(17, seed=3)[0][5].masked_upload("w", mask))
    bits = modulus_bits(17)
    assert bits == 5 and a.max() < 32
    wire = pack_words(a, bits)
    assert len(wire) == bits * 126  # 5 bit planes of ceil(1001 / 8) bytes
    assert np.array_equal(unpack_words(wire, 1001, bits), a)
    with pytest.raises(SecAggError, match="expected 5 planes"):
        unpack_words(wire[:-1], 1001, bits)
    assert modulus_bits(255) == 8 and modulus_bits(256) == 9
    big = setup_round(300, seed=0)[0][0].masked_upload("w", mask)
    assert big.dtype == np.uint16 and big.max() < 512
