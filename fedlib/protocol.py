"""The protocol's shared vocabulary: names that the mask file format (:mod:`fedlib.maskfile`)
checks and the servers (:mod:`fedlib.server`) write.

A leaf module (it imports only ``re``), so the file format and the command line learn these names
without importing the server that writes them (which imports the file format) or torch. The
registries keep their classes; tests/test_protocol.py keeps each registry's names equal to these.
"""

import re

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

#: the clients' pruning methods (:data:`fedlib.methods.METHODS`), a client file's ``method``
METHODS = ("magnitude", "wanda", "sparsegpt", "sparsegpt_update", "owl", "besa")

#: the methods that read no calibration data (``needs_calibration`` False)
CALIBRATION_FREE = ("magnitude",)

#: the comparison groups (:data:`fedlib.groups.GROUPS`); N:M (e.g. ``2:4``) besides
GROUPS = ("layer", "row", "column")

#: FedPrLLM's schedules as the command line and the server say them
#: (:data:`fedlib.server.fedprllm.SCHEDULES` maps them to the file's ``method``)
FEDPRLLM_SCHEDULES = ("one-shot", "iterative")

#: FedSpaLLM's layer samplers (:data:`fedlib.server.fedspallm.SAMPLERS`)
SAMPLERS = ("cyclic", "independent")


def show_value(value, limit: int = 60) -> str:
    """``repr(value)`` for an error message, cut at ``limit`` characters (a hostile value can be long)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


#: a client id: it names files (``<client id>.mask.safetensors``) on the server and the coordinator,
#: so letters, digits and ``._-`` only, not starting with a separator (no path, no hidden file)
CLIENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def client_id(text: str) -> str:
    """``text`` if it is a client id (:data:`CLIENT_ID`), else ValueError saying what is expected."""
    if not isinstance(text, str) or not CLIENT_ID.fullmatch(text):
        raise ValueError(f"expected a client id: 1 to 128 of A-Z a-z 0-9 . _ -, starting with a letter or digit, "
                         f"got {show_value(text)}")
    return text
