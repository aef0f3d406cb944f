"""The protocol's vocabulary (fedlib.protocol) names what the registries hold: the file format
checks these names, the servers write them."""

from dataclasses import fields

from fedlib import protocol
from fedlib.strategy_options import STRATEGY_OPTIONS, STRATEGY_SENDS
from fedlib.methods import METHODS
from fedlib.server import STRATEGIES
from fedlib.server.fedprllm import SCHEDULES
from fedlib.server.robust import RULES


def test_schedules_are_the_registered_strategies():
    assert sorted(protocol.SCHEDULES) == sorted(s for cls in STRATEGIES.values() for s in cls.schedules)


def test_robust_rules_are_the_registered_rules():
    assert sorted(protocol.ROBUST_RULES) == sorted(RULES)


def test_methods_are_the_registered_methods():
    assert protocol.METHODS == tuple(METHODS)
    assert protocol.CALIBRATION_FREE == tuple(name for name, cls in METHODS.items() if not cls.needs_calibration)


def test_the_command_line_offers_each_strategy_with_its_own_settings():
    """The command line reads the strategies' settings from fedlib.strategy_options (no torch):
    each registered strategy's options are those, and each names a field of its class."""
    assert STRATEGY_OPTIONS.keys() == STRATEGIES.keys() == STRATEGY_SENDS.keys()
    for name, cls in STRATEGIES.items():
        assert cls.options is STRATEGY_OPTIONS[name] and cls.send == STRATEGY_SENDS[name]
        assert {option.field for option in cls.options} <= {f.name for f in fields(cls)}
    assert tuple(SCHEDULES) == protocol.FEDPRLLM_SCHEDULES
