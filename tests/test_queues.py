"""connlist.core.queues on records of its own: the Queue's order, counts and walks; the Heap's order."""

from __future__ import annotations

import math

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

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


def test_keys_in_order_wait_in_the_run_and_the_others_in_the_heap() -> None:
    heap: Heap[Idle] = Heap("entry", "key")
    records = [Idle(str(i)) for i in range(6)]
    for record, key in zip(records, (1.0, 2.0, 2.0, 5.0, 3.0, 0.5), strict=True):
        heap.push(record, key)
    # In order (equal keys too) at O(1): the run; behind it: the heap.
    assert [entry[2] for entry in heap._run] == records[:4]
    assert sorted(entry[2].name for entry in heap._entries) == ["4", "5"]
    assert heap.take_through(0.4, 8) == [] and len(heap) == 6  # nothing that old: nothing taken
    assert heap.take_through(2.0, 1) == [records[5]] and records[5] not in heap
    assert heap.take_through(2.0, 0) == [] and len(heap) == 5  # a limit of none takes none
    assert heap.take_through(2.0, 8) == records[:3] and len(heap) == 2  # the bound stops it
    assert all(record not in heap for record in records[:3])
    assert heap.head_stamp() == 3.0 and heap.pop() is records[4] and heap.pop() is records[3]
    assert heap.take_through(math.inf, 8) == [] and len(heap) == 0
    # Equal keys in the run and the heap: the first pushed comes out first, wherever it waits.
    a, b, c, d = records[:4]
    heap.push(a, 1.0)
    heap.push(b, 3.0)
    heap.push(c, 2.0)  # behind b: the heap
    assert heap.pop() is a
    heap.unlink(b)
    assert heap.head() is c  # the run is empty now
    heap.push(d, 2.0)  # the run again, after c
    assert [heap.pop(), heap.pop(), heap.pop()] == [c, d, None]
    # Dead entries at the head of either are dropped on the way, and counted off.
    heap.push(a, 4.0)
    heap.push(b, 5.0)
    heap.push(c, 3.0)  # the heap
    heap.push(d, 6.0)
    for record in (a, b, c):
        heap.unlink(record)
    assert heap._dead == 3 and heap.take_through(5.5, 8) == [] and heap._dead == 0
    assert heap.take_through(6.0, 8) == [d] and len(heap) == 0


class HeapMachine(RuleBasedStateMachine):
    """The heap against a sorted model: the smallest key first, equal keys in the order they went in."""

    def __init__(self) -> None:
        super().__init__()
        self.heap: Heap[Idle] = Heap("entry", "key")
        self.records = [Idle(str(i)) for i in range(8)]
        # record -> (key, order of its push)
        self.model: dict[Idle, tuple[float, int]] = {}
        self.pushes = 0
        self.last = 0.0

    def smallest(self) -> Idle | None:
        return min(self.model, key=self.model.__getitem__) if self.model else None

    @rule(index=st.integers(0, 7), step=st.sampled_from([0.0, 0.5, 1.0, -1.0, -3.0]))
    def push(self, index: int, step: float) -> None:
        # Mostly in order, as connections go idle; sometimes behind (a key learnt late).
        record = self.records[index]
        if record in self.model:
            return
        self.last += step
        self.heap.push(record, self.last)
        self.model[record] = (self.last, self.pushes)
        self.pushes += 1

    @rule(index=st.integers(0, 7))
    def unlink(self, index: int) -> None:
        record = self.records[index]
        self.heap.unlink(record)
        self.model.pop(record, None)

    @rule()
    def pop(self) -> None:
        expected = self.smallest()
        assert self.heap.pop() is expected
        self.model.pop(expected, None)  # type: ignore[arg-type]

    @rule(bound=st.sampled_from([-2.0, 0.0, 1.0, 3.0]), limit=st.integers(0, 4))
    def take_through(self, bound: float, limit: int) -> None:
        in_order = sorted(self.model, key=self.model.__getitem__)
        expected = [record for record in in_order if self.model[record][0] <= bound][:limit]
        assert self.heap.take_through(bound, limit) == expected
        for record in expected:
            del self.model[record]

    @invariant()
    def agrees(self) -> None:
        assert len(self.heap) == len(self.model)
        assert sorted(record.name for record in self.heap) == sorted(record.name for record in self.model)
        smallest = self.smallest()
        assert self.heap.head() is smallest
        assert self.heap.head_stamp() == (None if smallest is None else self.model[smallest][0])
        for record in self.records:
            assert (record in self.heap) == (record in self.model)
        # The dead are counted as they are, and never outnumber the live by more than the rebuild's threshold.
        entries = [*self.heap._run, *self.heap._entries]
        assert self.heap._dead == sum(1 for entry in entries if entry[2] is None)
        assert len(entries) <= 2 * len(self.heap) + 33


HeapMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=60, derandomize=True, deadline=None, database=None
)
TestHeap = HeapMachine.TestCase
