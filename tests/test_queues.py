"""connlist.core.queues on records of its own: the Queue's order, counts and walks; the Heap's order."""

from __future__ import annotations

from connlist.core.queues import UNQUEUED, Heap, Link, Queue


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


class Idle:
    """A record as the idle heap needs it: an entry attribute and a key attribute."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.entry: list[object] | None = None
        self.key = 0.0

    def __repr__(self) -> str:
        return self.name


def test_a_heap_gives_the_smallest_key_first_whatever_the_order_of_pushes() -> None:
    heap: Heap[Idle] = Heap("entry", "key")
    assert (len(heap), heap.head(), heap.head_stamp(), heap.pop()) == (0, None, None, None)
    records = {name: Idle(name) for name in "abcd"}
    for name, key in (("a", 3.0), ("b", 1.0), ("c", 2.0), ("d", 1.0)):
        heap.push(records[name], key)
        assert records[name] in heap and records[name].key == key
    assert len(heap) == 4 and heap.head_stamp() == 1.0
    # Equal keys come out in the order they went in.
    assert [heap.pop() for _ in range(4)] == [records[name] for name in "bdca"]
    assert len(heap) == 0 and all(record not in heap for record in records.values())


def test_unlink_is_lazy_but_exact_and_the_dead_never_outnumber_the_live() -> None:
    heap: Heap[Idle] = Heap("entry", "key")
    many = [Idle(str(i)) for i in range(200)]
    for i, record in enumerate(many):
        heap.push(record, float(i))
    for record in many[:150]:
        heap.unlink(record)
        heap.unlink(record)  # idempotent
    assert len(heap) == 50 and heap.head() is many[150] and heap.head_stamp() == 150.0
    assert sorted(record.name for record in heap) == sorted(record.name for record in many[150:])
    assert len(heap._entries) <= 2 * len(heap) + 33
    # A record let go may come back, with a new key.
    heap.push(many[0], 0.5)
    assert heap.pop() is many[0] and heap.pop() is many[150]
