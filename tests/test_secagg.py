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
    SHARE_BYTES, SIMULATION_PLAN, RoundContext, SecAggClient, SecAggError, _Randomness,
    modulus_bits, pack_words, secure_vote_counts, setup_round, shamir_decode, shamir_split,
    simulation_sites, unpack_words,
)

from test_server import _clients


def test_unmasked_sum_is_plain_vote_counting_bit_for_bit(model, tmp_path):
    paths, masks = _clients(model, tmp_path, n=5)
    layers = prunable_layers(model)
    names = [info.name for info in layers]
    # Wanda's row masks at 50 %: every row of the sum holds 5 x half its width (the server's check)
    counts = secure_vote_counts(masks, names, seed=3, cohort={"group": "row", "sparsity": 0.5, "allocation": "uniform"})
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
    # the survivors themselves refuse to confirm a list below the threshold (SecAgg's client-side check)
    with pytest.raises(SecAggError, match="2 survivors, fewer than the threshold 3"):
        secure_vote_counts(masks, ["a"], threshold=3, dropped=[0, 1, 2])
    clients, server = setup_round(5, threshold=3, seed=0)
    survivors = [0, 1, 2, 3, 4]
    uploads = {j: clients[j].masked_upload("a", masks[j]["a"]) for j in survivors}
    with pytest.raises(SecAggError, match="unmask before recover"):
        server.unmask("a", uploads, (10,), None)
    signatures = {j: clients[j].confirm_survivors(survivors) for j in survivors}
    reveals = {j: clients[j].reveal(survivors, signatures) for j in survivors}
    # each survivor reveals one share per site, of the self seed only (nobody dropped)
    assert all({kind for kind, _ in r.values()} == {"self"} and len(r) == 5 for r in reveals.values())
    with pytest.raises(SecAggError, match="reveals from 2: the threshold is 3"):
        server.recover({j: reveals[j] for j in survivors[:2]}, survivors)
    # a site that uploaded and then vanished before revealing: t = 3 reveals still unmask
    server.recover({j: reveals[j] for j in survivors[2:]}, survivors)
    assert torch.equal(server.unmask("a", uploads, (10,), None), torch.full((10,), 5, dtype=torch.int16))
    server.recover(reveals, survivors)
    with pytest.raises(SecAggError, match=r"uploads from \[3, 4\], the survivors are \[0, 1, 2, 3, 4\]"):
        server.unmask("a", {j: uploads[j] for j in (3, 4)}, (10,), None)
    # a corrupted upload is caught (counts above the number of survivors), not returned
    bad = dict(uploads)
    bad[0] = (bad[0] + np.uint8(1)) & np.uint8(7)  # every count 5 -> 6 (mod 2^3)
    with pytest.raises(SecAggError, match="corrupt"):
        server.unmask("a", bad, (10,), None)


def test_a_dropped_client_is_revealed_by_key_share_not_self_share():
    clients, server = setup_round(4, threshold=3, seed=0)
    survivors = [0, 1, 3]
    signatures = {j: clients[j].confirm_survivors(survivors) for j in survivors}
    r = clients[0].reveal(survivors, signatures)
    assert r[1][0] == "self" and r[3][0] == "self" and r[2][0] == "key"
    assert r[2][1] == clients[0].held_shares[2][0]  # the share of site 2's private key
    with pytest.raises(SecAggError, match="already revealed"):  # asked again, e.g. for site 2's seed share
        clients[0].reveal([0, 1, 2, 3], signatures)
    # the server rebuilds site 2's masking key from the three key shares: its advertised public key
    reveals = {0: r, **{j: clients[j].reveal(survivors, signatures) for j in (1, 3)}}
    server.recover(reveals, survivors)
    assert server.suspects == {}
    assert set(server._dropped) == {2} and server._dropped[2].public_key().public_bytes_raw() == clients[2].public_key


def test_shares_travel_encrypted_to_their_recipient_only():
    """Each site's shares reach the others as ChaCha20-Poly1305 ciphertexts under a key of the
    pair's *share* keys: the plain share values are not in what the server relays, a ciphertext
    altered or delivered to another site is reported (not taken), and a site's state survives a
    round trip through plain values (what a Flower ClientApp keeps between the steps)."""
    rng = _Randomness(4)
    roster, ids, keys = simulation_sites(3, rng)
    context = RoundContext("run-1", 0, roster, SIMULATION_PLAN, 2)
    clients = [SecAggClient.create(context, cid, key, rng=rng) for cid, key in zip(ids, keys)]
    advertised = {c.index: c.advertise() for c in clients}
    outboxes = {c.index: c.share_secrets(advertised, rng) for c in clients}
    relayed = b"".join(data for box in outboxes.values() for data in box.values())
    tampered = bytearray(outboxes[0][1])
    tampered[0] ^= 1
    # site 1 gets an altered ciphertext from 0, site 2 the one meant for site 1: each reports site 0
    inboxes = {1: {0: bytes(tampered), 1: outboxes[1][1], 2: outboxes[2][1]},
               2: {0: outboxes[0][1], 1: outboxes[1][2], 2: outboxes[2][2]}}
    assert clients[1].receive_shares(inboxes[1], [0, 1, 2]) == [0]
    assert clients[2].receive_shares(inboxes[2], [0, 1, 2]) == [0]
    assert clients[0].receive_shares({s: box[0] for s, box in outboxes.items()}, [0, 1, 2]) == []
    for holder in clients:
        for _, (sk, b) in holder.held_shares.items():
            assert sk[1].to_bytes(SHARE_BYTES, "little") not in relayed
            assert b[1].to_bytes(SHARE_BYTES, "little") not in relayed
    assert 0 not in clients[1].held_shares and 0 not in clients[2].held_shares
    # any two holders rebuild site 1's self seed, as Shamir 2-of-3
    assert shamir_decode([clients[0].held_shares[1][1], clients[2].held_shares[1][1]], 2) == (clients[1].self_seed, [])
    clients[1].begin_upload(SIMULATION_PLAN)
    again = SecAggClient.from_record(clients[1].to_record(), keys[1])
    assert again.held_shares == clients[1].held_shares and again.advertise() == clients[1].advertise()
    assert again.to_record() == clients[1].to_record()
    mask = torch.rand(50, generator=torch.Generator().manual_seed(1)) < 0.5
    assert np.array_equal(again.masked_upload("w", mask), clients[1].masked_upload("w", mask))


def test_shamir_threshold():
    rng = _Randomness(5)
    secret = bytes(range(32))
    shares = shamir_split(secret, 7, 4, rng)
    for pick in ([0, 1, 2, 3], [6, 2, 4, 0], [1, 3, 5, 6, 0]):
        assert shamir_decode([shares[i] for i in pick], 4) == (secret, [])
    with pytest.raises(SecAggError, match="do not reconstruct"):
        shamir_decode(shares[:3], 3)  # t - 1 shares: a random field element, not the secret


def test_shamir_decode_uses_every_share_and_names_the_wrong_ones():
    rng = _Randomness(6)
    secret = bytes(range(32, 64))
    shares = shamir_split(secret, 9, 4, rng)  # r = 9, t = 4: up to 2 wrong shares are corrected
    assert shamir_decode(shares, 4) == (secret, [])
    wrong = list(shares)
    wrong[1] = (2, wrong[1][1] + 1)  # among the first t, which a plain combine would use
    wrong[6] = (7, 12345)
    assert shamir_decode(wrong, 4) == (secret, [2, 7])
    # in any order: the result does not depend on which t come first
    assert shamir_decode(wrong[::-1], 4) == (secret, [7, 2])
    wrong[3] = (4, 0)
    with pytest.raises(SecAggError, match="up to 2 wrong ones: cannot tell which"):
        shamir_decode(wrong, 4)
    # one share more than t: an error is seen but cannot be placed
    with pytest.raises(SecAggError, match="up to 0 wrong ones"):
        shamir_decode([shares[0], (2, shares[1][1] + 1), *shares[2:5]], 4)
    with pytest.raises(SecAggError, match="3 shares, the threshold is 4"):
        shamir_decode(shares[:3], 4)


def test_single_upload_is_uniform_and_independent_of_the_mask():
    n, numel = 3, 4096
    bits = modulus_bits(n)
    assert bits == 2  # 2^k > n
    zeros, ones = torch.zeros(numel, dtype=torch.bool), torch.ones(numel, dtype=torch.bool)
    # the same seeded secrets twice (a site masks one vector once per round: two rounds of one seed)
    y0 = setup_round(n, seed=11)[0][0].masked_upload("w", zeros)
    y1 = setup_round(n, seed=11)[0][0].masked_upload("w", ones)
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
    # the word size of 300 sites (9 bits) on 3 of them: a round of 300 would cost a minute of key agreement
    big = setup_round(3, seed=0, bits=modulus_bits(300))[0][0].masked_upload("w", mask)
    assert big.dtype == np.uint16 and big.max() < 512
