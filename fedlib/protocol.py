"""The protocol's shared vocabulary: names that the mask file format (:mod:`fedlib.maskfile`)
checks and the servers (:mod:`fedlib.server`) write.

A leaf module (it imports nothing), so the file format learns these names without importing
the server that writes them (which imports the file format). The registries keep their
classes; tests/test_protocol.py keeps each registry's names equal to these.
"""

#: what a global file's ``method`` starts with (``<schedule>[<client method>]<label>``): the
#: schedules of the registered strategies (:attr:`fedlib.server.strategy.Strategy.schedules`):
#: FedPrLLM one-shot and iterative, FedSpaLLM. A strategy whose global files start with a new
#: schedule adds it here: readers refuse a global file of a schedule they do not know.
SCHEDULES = ("fedprllm", "fedprllm-iterative", "fedspallm")

#: FedSpaLLM's mask expansion target (Eq. 7: ceil), a global weight file's ``x_rounding``
ROUNDINGS = ("ceil", "floor")

#: the robust server's screening rules (:data:`fedlib.server.robust.RULES`), a global file's
#: ``x_robust`` (``<rule>:k=<k>``)
ROBUST_RULES = ("mad",)
