"""The rule the consumer-group process tests judge a redelivery by (tests/cluster/_workload.py):
a message delivered again is explained only by its first member losing, or perhaps losing, its
session - between the two deliveries, or earlier in the holding period of the first one (the
fence's race: one delivery may begin after a suspension, before the ``lost`` that ends the
period, and is never committed)."""

from __future__ import annotations

from tests.cluster._workload import Delivery, _explained


def delivery(member: str, t0: float, part: str = "2-0", offset: int = 4708) -> Delivery:
    return Delivery(member, part, offset, 1, t0, t0 + 0.001)


def test_a_suspension_between_the_two_deliveries_explains_it() -> None:
    assert _explained(delivery("d", 10.0), delivery("c", 10.5), [10.2], [("2-0", 5.0, 10.3)])


def test_a_delivery_begun_after_the_suspension_in_the_same_period_is_explained() -> None:
    # suspended at 10.0, delivered at 10.05 (the fence's race), lost at 10.1, c again at 10.2
    assert _explained(delivery("d", 10.05), delivery("c", 10.2), [10.0], [("2-0", 5.0, 10.1)])


def test_without_a_trouble_in_that_period_it_is_not() -> None:
    periods = [("2-0", 1.0, 4.0), ("2-0", 5.0, 11.0), ("1-0", 5.0, 11.0)]
    # no trouble at all
    assert not _explained(delivery("d", 10.05), delivery("c", 10.2), [], periods)
    # a trouble in an earlier period of the same partition, or after the redelivery
    assert not _explained(delivery("d", 10.05), delivery("c", 10.2), [3.0, 10.5], periods)
    # a trouble in the period of another partition only counts for that partition
    other = [("1-0", 9.0, 11.0), ("2-0", 10.02, 11.0)]
    assert not _explained(delivery("d", 10.05), delivery("c", 10.2), [10.0], other)
