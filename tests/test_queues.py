"""connlist.queues.Queue on records of its own: order, counts, and walks that unlink or move as they go."""

from __future__ import annotations

from connlist.queues import UNQUEUED, Link, Queue


class Record:
    __slots__ = ("link", "stamp")

    def __init__(self, stamp: float) -> None:
        self.link: Link[Record] = UNQUEUED
        self.stamp = stamp


def queue_of(*stamps: float) -> tuple[Queue[Record], list[Record]]:
    queue: Queue[Record] = Queue("link", "stamp")
    records = [Record(stamp) for stamp in stamps]
    for record in records:
        queue.append(record)
    return queue, records


def test_an_empty_queue() -> None:
    queue: Queue[Record] = Queue("link", "stamp")
    assert (len(queue), list(queue), list(reversed(queue))) == (0, [], [])
    assert queue.head() is None and queue.head_stamp() is None
    assert queue.due(10.0, 5) == []
    queue.unlink(Record(1.0))  # never queued: nothing happens
    assert len(queue) == 0 and UNQUEUED.next is UNQUEUED


def test_append_gives_a_record_its_own_link_once_and_keeps_the_order() -> None:
    queue, (a, b, c) = queue_of(1.0, 2.0, 3.0)
    assert a.link is not UNQUEUED and a.link.owner is a
    assert (len(queue), list(queue), list(reversed(queue))) == (3, [a, b, c], [c, b, a])
    assert (queue.head(), queue.head_stamp()) == (a, 1.0)
    link = a.link
    queue.unlink(a)
    queue.unlink(a)  # idempotent
    assert a.link is link and link.next is link
    assert (len(queue), list(queue)) == (2, [b, c])
    a.stamp = 4.0
    queue.append(a)
    assert a.link is link  # kept: nothing allocated again
    assert list(queue) == [b, c, a]


def test_due_takes_from_the_head_up_to_the_bound_and_the_limit() -> None:
    queue, (a, b, c) = queue_of(1.0, 2.0, 3.0)
    assert queue.due(2.0, 10) == [a, b]
    assert queue.due(3.0, 2) == [a, b]
    assert queue.due(0.5, 10) == []
    assert queue.due(3.0, 10) == [a, b, c]
    assert len(queue) == 3  # due leaves them queued


def test_a_walk_may_unlink_or_move_the_record_it_is_on() -> None:
    queue, (a, b, c, d) = queue_of(1.0, 2.0, 3.0, 4.0)
    seen = []
    for record in queue:
        seen.append(record)
        if record is a:
            queue.unlink(a)
        elif record is b:
            b.stamp = 5.0
            queue.move_to_end(b)  # met again at the tail
        elif record is c:
            queue.unlink(d)  # the successor goes too: the walk ends there
    assert seen == [a, b, c]
    assert list(queue) == [c, b] and len(queue) == 2
