"""Secure aggregation against a dishonest coordinator or site (fedlib.server.secagg): each attack
of issue 42 is carried out against the code, and refused or detected; the honest sums are checked
against plain sums of the masks."""

import dataclasses
import json

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from fedlib.groups import prune_lowest
from fedlib.server.secagg import (
    ContributionLedger, RoundContext, Roster, SecAggClient, SecAggError, SecAggServer, _Randomness, _share_cipher,
    default_threshold, pair_key, plan_digest, shamir_split, simulation_sites,
)

WANDA = {"method": "wanda", "sparsity": 0.5, "group": "row", "round": 0}
MAGNITUDE = {**WANDA, "method": "magnitude"}
ROW = {"group": "row", "sparsity": 0.5, "allocation": "uniform"}
SHAPE = (6, 8)


def _keys_step(n, threshold=None, run="run-7", seed=0, min_cohort=0):
    """The key step of one round: the roster, the sites with fresh secrets, their signing keys."""
    rng = _Randomness(seed)
    roster, ids, keys = simulation_sites(n, rng)
    context = RoundContext(run, 0, roster, plan_digest(WANDA), default_threshold(n) if threshold is None else threshold)
    clients = [SecAggClient.create(context, cid, key, min_cohort=min_cohort, rng=rng) for cid, key in zip(ids, keys)]
    return context, clients, keys, rng


def _share_step(clients, rng):
    """The share step, relayed honestly: every site's complaints (none when all are honest)."""
    advertised = {c.index: c.advertise() for c in clients}
    outboxes = {c.index: c.share_secrets(advertised, rng) for c in clients}
    return outboxes, {c.index: c.receive_shares({s: box[c.index] for s, box in outboxes.items()}, sorted(outboxes))
                      for c in clients}


def _row_masks(n, seed=0):
    """n uniform 50 % row masks of SHAPE (each row prunes 4 of 8), from independent scores."""
    return [prune_lowest(torch.rand(SHAPE, generator=torch.Generator().manual_seed(seed * 100 + i)), 0.5, "row", i,
                         "w") for i in range(n)]


def _upload(clients, masks, sites):
    for j in sites:
        clients[j].begin_upload(plan_digest(WANDA))
    return {j: clients[j].masked_upload("w", masks[j]) for j in sites}


def _reveal(clients, server, survivors):
    signatures = {j: clients[j].confirm_survivors(survivors) for j in survivors}
    confirmations = server.admit_confirmations(survivors, signatures)
    return {j: clients[j].reveal(survivors, confirmations) for j in survivors}


def _plain(masks, sites):
    return sum(masks[j].to(torch.int16) for j in sites)


def test_an_honest_round_sums_the_masks_and_names_nobody():
    context, clients, _, rng = _keys_step(5)
    server = SecAggServer(context)
    assert len(server.admit({c.index: c.advertise() for c in clients})) == 5
    _, complaints = _share_step(clients, rng)
    masks = _row_masks(5)
    uploads = _upload(clients, masks, range(5))
    survivors = server.drop_accused(uploads, complaints)
    assert survivors == [0, 1, 2, 3, 4]
    server.recover(_reveal(clients, server, survivors), survivors)
    assert torch.equal(server.unmask("w", uploads, SHAPE, ROW), _plain(masks, range(5)))
    assert server.suspects == {}


@pytest.mark.parametrize("n, refused", [(5, (1, 2)), (4, (1, 2)), (2, (1,))])
def test_a_threshold_below_a_majority_of_the_roster_is_refused(n, refused):
    rng = _Randomness(0)
    roster, ids, keys = simulation_sites(n, rng)
    # what the coordinator is after: with t = 1 every share is the secret itself
    secret = bytes(range(32))
    assert {y for _, y in shamir_split(secret, n, 1, rng)} == {int.from_bytes(secret, "little")}
    for t in refused:
        with pytest.raises(SecAggError, match=f"threshold {t}: a site accepts only a majority of its {n}-site roster, "
                                              f"{n // 2 + 1}..{n}"):
            RoundContext("run", 0, roster, plan_digest(WANDA), t)
    RoundContext("run", 0, roster, plan_digest(WANDA), n // 2 + 1)


def test_sites_told_different_thresholds_or_rosters_refuse_each_other():
    rng = _Randomness(1)
    roster, ids, keys = simulation_sites(5, rng)
    at = {t: RoundContext("run", 0, roster, plan_digest(WANDA), t) for t in (3, 4)}
    clients = [SecAggClient.create(at[3 if i == 0 else 4], cid, key, rng=rng) for i, (cid, key) in
               enumerate(zip(ids, keys))]
    advertised = {c.index: c.advertise() for c in clients}
    with pytest.raises(SecAggError, match="'site-1': the signature on its advertised keys does not verify"):
        clients[0].share_secrets(advertised, rng)
    with pytest.raises(SecAggError, match="'site-0': the signature on its advertised keys does not verify"):
        clients[1].share_secrets(advertised, rng)
    # a peer whose roster has one more site signs another roster digest: refused as well
    extra = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    other = Roster({**{c: roster.key(c) for c in ids}, "site-5": extra.public_key().public_bytes_raw()})
    odd = SecAggClient.create(RoundContext("run", 0, other, plan_digest(WANDA), 4), ids[2], keys[2], rng=rng)
    honest = [SecAggClient.create(at[4], cid, key, rng=rng) for cid, key in zip(ids, keys)]
    mixed = {c.index: c.advertise() for c in honest}
    mixed[2] = odd.advertise()
    with pytest.raises(SecAggError, match="'site-2': the signature"):
        honest[0].share_secrets(mixed, rng)
    # participants outside the roster: refused at the share step and at the upload step
    with pytest.raises(SecAggError, match=r"advertised sites \[0, 1, 2, 3, 4, 7\] are not all sites of its 5-site"):
        honest[0].share_secrets({**{c.index: c.advertise() for c in honest}, 7: mixed[0]}, rng)
    outboxes = {c.index: c.share_secrets({h.index: h.advertise() for h in honest}, rng) for c in honest}
    with pytest.raises(SecAggError, match=r"participants \[0, 1, 2, 3, 4, 9\] are not all sites"):
        honest[0].receive_shares({s: box[0] for s, box in outboxes.items()}, [0, 1, 2, 3, 4, 9])


def test_a_second_share_request_is_refused_also_after_a_restart():
    _, clients, keys, rng = _keys_step(3)
    advertised = {c.index: c.advertise() for c in clients}
    clients[0].share_secrets(advertised, rng)
    # asked again: new shares under the pair's key and the same nonce would leak their XOR
    with pytest.raises(SecAggError, match="already shared its secrets this round"):
        clients[0].share_secrets(advertised, rng)
    restarted = SecAggClient.from_record(clients[0].to_record(), keys[0])
    with pytest.raises(SecAggError, match="already shared its secrets this round"):
        restarted.share_secrets(advertised, rng)
    with pytest.raises(SecAggError, match="its signing key is not the roster's key for it"):
        SecAggClient.from_record(clients[0].to_record(), keys[1])


def test_a_second_upload_under_the_same_secrets_is_refused_also_after_a_restart():
    _, clients, keys, rng = _keys_step(3)
    _share_step(clients, rng)
    site = clients[0]
    wanda, magnitude = _row_masks(2, seed=3)
    before = site.to_record()
    # a plan other than the one signed at the key step is refused
    with pytest.raises(SecAggError, match="not the plan this site signed at the key step"):
        site.begin_upload(plan_digest(MAGNITUDE))
    site.begin_upload(plan_digest(WANDA))
    first = site.masked_upload("w", wanda)
    for s in (site, SecAggClient.from_record(site.to_record(), keys[0])):
        with pytest.raises(SecAggError, match="already uploaded this round"):
            s.begin_upload(plan_digest(MAGNITUDE))
        with pytest.raises(SecAggError, match="already uploaded this round"):
            s.begin_upload(plan_digest(WANDA))
        with pytest.raises(SecAggError, match="w: already masked this round"):
            s.masked_upload("w", magnitude)
    # what the refusal prevents (a state from before the upload, which a site never keeps once it
    # has begun): the difference of two uploads under one pad is the difference of the masks
    rolled_back = SecAggClient.from_record(before, keys[0])
    rolled_back.begin_upload(plan_digest(WANDA))
    second = rolled_back.masked_upload("w", magnitude)
    bits = site.bits
    assert np.array_equal((first.astype(np.int64) - second) % (1 << bits),
                          (wanda.reshape(-1).long() - magnitude.reshape(-1).long()).numpy() % (1 << bits))


def test_a_coordinator_substituting_a_recipients_key_is_caught_by_its_signature():
    context, clients, _, rng = _keys_step(5)
    advertised = {c.index: c.advertise() for c in clients}
    coordinator = X25519PrivateKey.from_private_bytes(bytes(range(1, 33)))
    forged = dict(advertised)
    forged[2] = dataclasses.replace(advertised[2], share_key=coordinator.public_key().public_bytes_raw())
    # even re-signed with a key the coordinator holds: the roster says whose key signs for site-2
    own = Ed25519PrivateKey.from_private_bytes(bytes(32))
    resigned = dataclasses.replace(forged[2], signature=own.sign(b"anything"))
    for relayed in (forged, {**forged, 2: resigned}):
        for c in clients:
            if c.index != 2:
                with pytest.raises(SecAggError, match="'site-2': the signature on its advertised keys does not verify"):
                    c.share_secrets(relayed, rng)
    with pytest.raises(SecAggError, match="the server relayed other keys as this site's"):
        clients[2].share_secrets(forged, rng)
    # no share left any site, and nothing was recorded: with the true keys the round goes on
    assert not any(c.shared for c in clients)
    server = SecAggServer(context)
    assert sorted(server.admit(forged)) == [0, 1, 3, 4] and "does not verify" in server.suspects["site-2"]
    _, complaints = _share_step(clients, rng)
    assert complaints == {j: [] for j in range(5)}


def test_inconsistent_survivor_lists_get_no_reveal():
    context, clients, _, rng = _keys_step(5)
    server = SecAggServer(context)
    server.admit({c.index: c.advertise() for c in clients})
    _share_step(clients, rng)
    masks = _row_masks(5, seed=1)
    uploads = _upload(clients, masks, range(5))
    # the coordinator tells 0, 1, 2 that everyone survived, and 3 that site 4 dropped: it wants
    # seed shares of site 4 from the first group and key shares of it from the second
    everyone, without_4 = [0, 1, 2, 3, 4], [0, 1, 2, 3]
    signed = {j: clients[j].confirm_survivors(everyone) for j in (0, 1, 2)}
    signed_3 = clients[3].confirm_survivors(without_4)
    with pytest.raises(SecAggError, match=r"already confirmed the survivors \[0, 1, 2, 3\], now told \[0, 1, 2, 3, 4"):
        clients[3].confirm_survivors(everyone)
    with pytest.raises(SecAggError, match=r"do not include this site \(4\)"):
        clients[4].confirm_survivors(without_4)
    # site 3 is shown the other group's signatures as confirmations of its list: they do not verify
    with pytest.raises(SecAggError, match=r"confirmations of survivors \[0, 1, 2, 3\] from \[0, 1, 2\] do not verify"):
        clients[3].reveal(without_4, {**signed, 3: signed_3})
    with pytest.raises(SecAggError, match=r"1 confirmations of survivors \[0, 1, 2, 3\], the threshold is 3"):
        clients[3].reveal(without_4, {3: signed_3})
    with pytest.raises(SecAggError, match=r"asked to reveal for survivors \[0, 1, 2, 3\], it confirmed \[0, 1, 2, 3,"):
        clients[0].reveal(without_4, signed)
    assert not clients[3].revealed
    # an honest server relays only confirmations of the list it announced, and names the others
    assert sorted(server.admit_confirmations(everyone, {**signed, 3: signed_3})) == [0, 1, 2]
    assert server.suspects == {"site-3": "its confirmation of the survivor list does not verify"}
    # the first group reveals (three signatures on its list): seed shares only, site 4's key stays hidden
    reveals = {j: clients[j].reveal(everyone, signed) for j in (0, 1, 2)}
    assert all(kind == "self" for r in reveals.values() for kind, _ in r.values())
    server.recover(reveals, everyone)
    assert torch.equal(server.unmask("w", uploads, SHAPE, ROW), _plain(masks, everyone))


@pytest.mark.parametrize("cohort, shape, group", [
    (ROW, SHAPE, "row"), ({**ROW, "group": "column"}, SHAPE, "column"), ({**ROW, "group": "layer"}, SHAPE, "layer"),
    ({**ROW, "group": "2:4"}, SHAPE, "2:4"),
])
def test_a_site_taking_one_vote_off_is_caught_by_the_group_totals(cohort, shape, group):
    context, clients, _, rng = _keys_step(4)
    server = SecAggServer(context)
    server.admit({c.index: c.advertise() for c in clients})
    _share_step(clients, rng)
    masks = [prune_lowest(torch.rand(shape, generator=torch.Generator().manual_seed(i)), 0.5, group, i, "w")
             for i in range(4)]
    uploads = _upload(clients, masks, range(4))
    server.recover(_reveal(clients, server, [0, 1, 2, 3]), [0, 1, 2, 3])
    plain = _plain(masks, range(4))
    assert torch.equal(server.unmask("w", uploads, shape, cohort), plain)
    # site 2 takes one vote off a weight it prunes: the count stays in 0..m, the bound misses it
    at = int(masks[2].reshape(-1).nonzero()[0, 0])
    lying = dict(uploads)
    lying[2] = uploads[2].copy()
    lying[2][at] = (int(lying[2][at]) - 1) % (1 << server.bits)
    expected = plain.clone().reshape(-1)
    expected[at] -= 1
    assert torch.equal(server.unmask("w", lying, shape, None).reshape(-1), expected)
    k = {"row": 4, "column": 3, "layer": 24, "2:4": 2}[group]
    with pytest.raises(SecAggError, match=f"{group} group \\d+ holds {4 * k - 1} votes; 4 sites each pruning {k} "
                                          f"of every {group} group give {4 * k}: an upload is not the mask its site"):
        server.unmask("w", lying, shape, cohort)
    # what remains possible (module docstring): a vote moved inside one group keeps every total
    cols = shape[1]
    group_of = {"row": lambda i: i // cols, "column": lambda i: i % cols, "layer": lambda i: 0,
                "2:4": lambda i: i // 4}[group]
    unpruned = next(i for i in range(masks[2].numel())
                    if not masks[2].reshape(-1)[i] and group_of(i) == group_of(at))
    moved = dict(lying)
    moved[2] = lying[2].copy()
    moved[2][unpruned] = (int(moved[2][unpruned]) + 1) % (1 << server.bits)
    server.unmask("w", moved, shape, cohort)


def test_nonuniform_cohorts_are_checked_row_by_row():
    context, clients, _, rng = _keys_step(3)
    server = SecAggServer(context)
    server.admit({c.index: c.advertise() for c in clients})
    _share_step(clients, rng)
    # a per-layer ratio: site i prunes 2 + i of every row
    masks = [prune_lowest(torch.rand(SHAPE, generator=torch.Generator().manual_seed(i)), (2 + i) / 8, "row", i, "w")
             for i in range(3)]
    uploads = _upload(clients, masks, range(3))
    server.recover(_reveal(clients, server, [0, 1, 2]), [0, 1, 2])
    cohort = {"group": "row", "sparsity": 0.4, "allocation": "nonuniform"}
    assert torch.equal(server.unmask("w", uploads, SHAPE, cohort), _plain(masks, range(3)))
    lying = dict(uploads)
    lying[1] = uploads[1].copy()
    at = int(masks[1][3].nonzero()[0, 0]) + 3 * SHAPE[1]  # a weight site 1 prunes in row 3
    lying[1][at] = (int(lying[1][at]) - 1) % (1 << server.bits)
    with pytest.raises(SecAggError, match=r"row group 3 holds 8 votes; one ratio per layer gives every row the same "
                                          r"total \(9\)"):
        server.unmask("w", lying, SHAPE, cohort)


def test_a_site_whose_shares_do_not_decrypt_is_dropped_and_named():
    context, clients, _, rng = _keys_step(5)
    server = SecAggServer(context)
    advertised = server.admit({c.index: c.advertise() for c in clients})
    outboxes = {c.index: c.share_secrets(advertised, rng) for c in clients}
    garbled = bytearray(outboxes[1][3])
    garbled[5] ^= 0xFF  # site 1 sends site 3 a share nobody can open
    outboxes[1][3] = bytes(garbled)
    complaints = {c.index: c.receive_shares({s: box[c.index] for s, box in outboxes.items()}, [0, 1, 2, 3, 4])
                  for c in clients}
    assert complaints == {0: [], 1: [], 2: [], 3: [1], 4: []}
    masks = _row_masks(5, seed=2)
    uploads = _upload(clients, masks, range(5))
    survivors = server.drop_accused(uploads, complaints)
    assert survivors == [0, 2, 3, 4]
    assert "its shares to 'site-3' did not decrypt" in server.suspects["site-1"]
    assert "says the shares of 'site-1' did not decrypt" in server.suspects["site-3"]
    reveals = _reveal(clients, server, survivors)
    # site 1's seed is never revealed (its upload stays padded); its key is, as a dropout's
    assert {r[1][0] for r in reveals.values() if 1 in r} == {"key"} and 1 not in reveals[3]
    server.recover(reveals, survivors, participants=[0, 1, 2, 3, 4])
    assert torch.equal(server.unmask("w", {j: uploads[j] for j in survivors}, SHAPE, ROW), _plain(masks, survivors))


def test_a_corrupt_reveal_share_is_named_and_the_sum_still_right():
    context, clients, _, rng = _keys_step(5)
    server = SecAggServer(context)
    server.admit({c.index: c.advertise() for c in clients})
    _share_step(clients, rng)
    masks = _row_masks(5, seed=4)
    uploads = _upload(clients, masks, range(5))
    everyone = [0, 1, 2, 3, 4]
    reveals = _reveal(clients, server, everyone)
    honest = {j: dict(r) for j, r in reveals.items()}
    kind, (x, y) = reveals[4][0]
    reveals[4][0] = (kind, (x, y + 1))  # site 4 alters its share of site 0's seed
    server.recover(reveals, everyone)
    assert list(server.suspects) == ["site-4"]
    assert "share of the self secret of 'site-0' is off the polynomial" in server.suspects["site-4"]
    assert torch.equal(server.unmask("w", uploads, SHAPE, ROW), _plain(masks, everyone))
    # two altered shares of one secret among five (t = 3): more than can be placed, no result
    kind, (x, y) = reveals[3][0]
    reveals[3][0] = (kind, (x, y + 7))
    with pytest.raises(SecAggError, match="the self secret of 'site-0': the 5 shares do not lie on one polynomial"):
        SecAggServer(context, dict(server.advertised)).recover(reveals, everyone)
    # a share of the wrong kind (as if site 0 had dropped) is not used, and its holder named
    reveals = {j: dict(r) for j, r in honest.items()}
    reveals[1][0] = ("key", reveals[1][0][1])
    again = SecAggServer(context, dict(server.advertised))
    again.recover(reveals, everyone)
    assert list(again.suspects) == ["site-1"]
    assert "revealed a key share of 'site-0' at x = 2, expected self" in again.suspects["site-1"]
    assert torch.equal(again.unmask("w", uploads, SHAPE, ROW), _plain(masks, everyone))


def test_a_site_that_deals_shares_of_another_seed_is_named():
    context, clients, _, rng = _keys_step(5)
    server = SecAggServer(context)
    advertised = server.admit({c.index: c.advertise() for c in clients})  # site 2 commits to its seed b
    honest_seed = clients[2].self_seed
    clients[2].self_seed = bytes(32)  # ... shares another one ...
    outboxes = {c.index: c.share_secrets(advertised, rng) for c in clients}
    clients[2].self_seed = honest_seed  # ... and masks with b: the unmasked sum would be noise
    for c in clients:
        c.receive_shares({s: box[c.index] for s, box in outboxes.items()}, [0, 1, 2, 3, 4])
    uploads = _upload(clients, _row_masks(5), range(5))
    with pytest.raises(SecAggError, match="site 'site-2' dealt shares of another secret: the rebuilt self-mask seed is "
                                          "not the one it committed to"):
        server.recover(_reveal(clients, server, list(uploads)), list(uploads))
    assert "dealt shares of another secret" in server.suspects["site-2"]


def test_run_and_round_are_in_every_key_derivation():
    rng = _Randomness(8)
    roster, ids, _ = simulation_sites(3, rng)
    a, b = X25519PrivateKey.from_private_bytes(rng.bytes(32)), X25519PrivateKey.from_private_bytes(rng.bytes(32))
    b_pub = b.public_key().public_bytes_raw()
    contexts = [RoundContext(run, r, roster, plan_digest(WANDA), 2) for run, r in (("1", 0), ("2", 0), ("1", 1))]
    pairs = {pair_key(c, a, b_pub, 0, 1) for c in contexts}
    sealed = {_share_cipher(c, a, b_pub, 0, 1).encrypt(bytes(12), b"share", None) for c in contexts}
    assert len(pairs) == 3 and len(sealed) == 3
    # and both ends derive the same key in one context
    assert pair_key(contexts[0], b, a.public_key().public_bytes_raw(), 1, 0) == pair_key(contexts[0], a, b_pub, 0, 1)


def test_a_site_refuses_a_cohort_below_its_own_minimum():
    _, clients, _, rng = _keys_step(6, min_cohort=5)
    advertised = {c.index: c.advertise() for c in clients}
    with pytest.raises(SecAggError, match="4 advertised sites, fewer than the threshold 4 or this site's minimum "
                                          "cohort 5"):
        clients[0].share_secrets({j: advertised[j] for j in range(4)}, rng)
    outboxes = {c.index: c.share_secrets(advertised, rng) for c in clients}
    with pytest.raises(SecAggError, match="4 participants, fewer than the threshold 4 or this site's minimum cohort 5"):
        clients[0].receive_shares({s: outboxes[s][0] for s in range(4)}, [0, 1, 2, 3])
    for c in clients:
        c.receive_shares({s: box[c.index] for s, box in outboxes.items()}, list(range(6)))
        c.begin_upload(plan_digest(WANDA))
    with pytest.raises(SecAggError, match="4 survivors, fewer than the threshold 4 or this site's minimum cohort 5"):
        clients[0].confirm_survivors([0, 1, 2, 3])
    clients[0].confirm_survivors([0, 1, 2, 3, 4])


def test_the_ledger_refuses_the_same_plan_twice_unless_dp(tmp_path):
    path = tmp_path / "site.ledger.json"
    ledger = ContributionLedger(path)
    ledger.admit(plan_digest(WANDA), "run-1", dp=False)
    ledger.admit(plan_digest(MAGNITUDE), "run-1", dp=False)
    # a second federation over a cohort one site smaller would give this site's mask by difference
    again = ContributionLedger(path)  # another process: the record is on disk
    with pytest.raises(SecAggError, match="already contributed this plan \\(run run-1\\)"):
        again.admit(plan_digest(WANDA), "run-2", dp=False)
    with pytest.raises(SecAggError, match="already contributed this plan"):
        again.admit(plan_digest(WANDA), "run-1", dp=False)  # the same round re-keyed in one run
    again.admit(plan_digest(WANDA), "run-2", dp=True)
    again.admit(plan_digest({**WANDA, "round": 1}), "run-2", dp=False)
    assert [(e["run"], e["dp"]) for e in again.entries()] == [("run-1", False), ("run-1", False), ("run-2", True),
                                                              ("run-2", False)]
    path.write_text(json.dumps({"contributions": [{"plan": "xyz", "run": "1", "dp": False}]}))
    with pytest.raises(SecAggError, match=r"site.ledger.json: contributions\[0\]: expected plan \(64 hex digits\)"):
        again.admit(plan_digest(WANDA), "run-3", dp=False)


def test_rosters_are_checked():
    key, other = (Ed25519PrivateKey.from_private_bytes(bytes([b]) * 32).public_key().public_bytes_raw() for b in (1, 2))
    roster = Roster({"beta": other, "alpha": key}, "roster.json")
    assert roster.ids == ["alpha", "beta"] and roster.index("beta") == 1
    with pytest.raises(SecAggError, match=r"roster.json: sites 'alpha' and 'alpha2' have one key"):
        Roster({"alpha": key, "alpha2": key}, "roster.json")
    with pytest.raises(SecAggError, match=r"roster.json: site id '../beta': expected 1 to 128 letters, digits"):
        Roster({"alpha": key, "../beta": other}, "roster.json")
    with pytest.raises(SecAggError, match=r"roster.json: site 'alpha': expected a 32-byte Ed25519 public key"):
        Roster({"alpha": bytes.fromhex("00ff")}, "roster.json")
