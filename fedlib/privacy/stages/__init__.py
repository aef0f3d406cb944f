"""The privacy audit as workflow stages: what do shared masks reveal about private data?

One module per analysis; each runs the :mod:`fedlib.privacy` library on real masks and returns
one JSON-able result, written by ``fedlib privacy <analysis> ... --out X.json``
(:mod:`fedlib.privacy_cli`); :mod:`fedlib.privacy.tables` turns the results into report
tables and plots (``fedlib privacy report``).

* :mod:`.entropy` — bits per entry of a mask vs the fp16 weights.
* :mod:`.similarity` — Hamming distances between masks of disjoint calibration sets.
* :mod:`.sensitivity` — masks of data sets differing in one sample.
* :mod:`.membership` — LiRA membership inference on shadow masks, also under randomized response.
* :mod:`.inversion` — reconstructing calibration tokens from block-0 masks.
* :mod:`.defence` — randomized response on the clients' bits, FedPrLLM top-k on the noisy votes.

Shadow and neighbour masks are computed in-process on one loaded model
(:func:`.recompute.client_masks`); for the attack they can be restricted to the first decoder
blocks, since the masks of blocks 0..b-1 only need the forward pass through those blocks.
Mask files are read as packed bits (:mod:`fedlib.privacy.bits`). Every result says exactly
what was computed and observed.
"""
