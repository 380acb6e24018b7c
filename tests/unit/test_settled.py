"""What a workflow's release tells the worker that did it (store/dependencies.Settled)."""

from django_delayq.store.dependencies import Settled


def test_a_release_is_told_only_when_its_own_statement_woke_every_queue_and_no_group_holds_a_step():
    assert not Settled().told  # nothing released
    assert Settled(released=[1]).told  # notified by end_edges itself
    assert not Settled(released=[1], queues={"q"}).told  # a queue still to wake
    assert not Settled(released=[1], grouped={1: ("q", "g")}).told  # a group may hold it
    assert not Settled(cancelled=[2]).told  # cancelled only: nothing to claim
