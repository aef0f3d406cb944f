"""Differential privacy for a client's pruning statistics: the mechanisms a site runs, apart
from the attacks that audit them (:mod:`fedlib.privacy`).

* :mod:`~fedlib.dp.gaussian`: the sample-level Gaussian mechanism on raw Wanda statistics and
  its PLD accounting.
* :mod:`~fedlib.dp.public`: statistics normalised by public text, degrading to the public mask.
* :mod:`~fedlib.dp.distributed`: their sum under secure aggregation with discrete Gaussian shares.
* :mod:`~fedlib.dp.accountant`: the distributed sum's accounting (a leaf the mask reader imports).
"""
