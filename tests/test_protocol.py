"""The protocol's vocabulary (fedlib.protocol) names what the registries hold: the file format
checks these names, the servers write them."""

from fedlib import protocol
from fedlib.server import STRATEGIES
from fedlib.server.robust import RULES


def test_schedules_are_the_registered_strategies():
    assert sorted(protocol.SCHEDULES) == sorted(s for cls in STRATEGIES.values() for s in cls.schedules)


def test_robust_rules_are_the_registered_rules():
    assert sorted(protocol.ROBUST_RULES) == sorted(RULES)
