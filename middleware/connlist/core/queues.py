"""The ordered queues of the lists beyond Node's: ``body``, ``stalled`` and ``closing``, and ``idle_queue``.

Theory of operation.  Each of these lists holds records in the order of one
stamp, a clock value written on the record before it joins the tail (the
``stamp`` attribute the queue is made with): the clock never goes back, so
appending keeps the queue ordered, and a walk from the head meets the oldest
first and stops at the first record too young to matter.  The queue is
intrusive, like the pure-Python ``OrderedDict`` in CPython: a record carries
one ``Link`` per queue it can be in (``stalled`` and ``closing`` share one,
a record is in at most one of them), and each queue has a sentinel root.

Invariants:

* A link in no queue is linked to itself: "is it queued?" is one identity
  test (``link.next is not link``), and ``unlink`` is idempotent.  A record that was never
  queued holds the shared ``UNQUEUED`` link; its first ``append`` gives it
  its own, which it keeps.
* ``append`` (at the tail), ``unlink`` and ``move_to_end`` are O(1) and,
  after that first one, allocate nothing; ``len`` is kept as links move.
* The stamps of a queue's records never decrease from head to tail, as long
  as every record is stamped no earlier than the tail's before it joins.
* A walk may unlink the record it is on, or move it to the tail.

``idle_queue`` is a ``Heap`` instead: its keys come back out of order (a
connection idle again goes back with the time its last response ended,
which the sweep learns late: ``connlist.core.budget``), so the smallest is found
by a binary heap, O(log n) per push and pop, and never on a request's path.
The keys that do come in order (most of them) wait in a sorted run in front
of the heap instead, O(1) each (``Heap``).

A plain insertion-ordered ``dict`` does not serve: after records leave from
its head, finding the head again scans the deleted entries, so a queue
walked from the head and emptied from it grows quadratic until the dict is
rebuilt (docs/benchmarks.md, "Data structures", has the figures).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterator
from itertools import count
from operator import attrgetter
from typing import Any, Generic, TypeVar

__all__ = ["UNQUEUED", "Heap", "Link", "Queue"]

T = TypeVar("T")


class Link(Generic[T]):
    """A record's place in one queue: linked to itself while in none."""

    __slots__ = ("next", "owner", "prev")

    def __init__(self, owner: T) -> None:
        self.prev: Link[T] = self
        self.next: Link[T] = self
        # The record whose place this is (None: a root's, or UNQUEUED).
        self.owner = owner

    def release(self) -> None:
        """Its record is gone for good (removed): the link no longer refers to it, so no cycle holds it."""
        self.owner = None  # type: ignore[assignment]  # as a root's


# The link of every record not queued yet: never linked.
UNQUEUED: Link[Any] = Link(None)


class Queue(Generic[T]):
    """Records in the order of their ``stamp``, oldest at the head (see the module docstring).

    ``link`` names the record's attribute that holds its ``Link`` for this
    queue, ``stamp`` the clock value the queue is ordered by.
    """

    __slots__ = ("_count", "_link", "_name", "_root", "stamp")

    def __init__(self, link: str, stamp: str) -> None:
        self._root: Link[T] = Link(None)  # type: ignore[arg-type]  # the sentinel's owner is none
        self._count = 0
        self._name = link
        self._link: Callable[[T], Link[T]] = attrgetter(link)
        # The record's stamp, read by the walks.
        self.stamp: Callable[[T], float] = attrgetter(stamp)

    def __len__(self) -> int:
        return self._count

    def append(self, record: T) -> None:
        """Join the tail; the record's stamp must not be older than any in the queue."""
        link = self._link(record)
        if link.owner is None:
            link = Link(record)
            setattr(record, self._name, link)
        root = self._root
        last = root.prev
        link.prev = last
        link.next = root
        last.next = link
        root.prev = link
        self._count += 1

    def unlink(self, record: T) -> None:
        """Leave the queue (nothing happens if the record is in none)."""
        link = self._link(record)
        nxt = link.next
        if nxt is link:
            return
        prev = link.prev
        prev.next = nxt
        nxt.prev = prev
        link.prev = link.next = link
        self._count -= 1

    def move_to_end(self, record: T) -> None:
        """To the tail (restamped by the caller first, as for ``append``)."""
        self.unlink(record)
        self.append(record)

    def head(self) -> T | None:
        """The oldest record, or None."""
        return self._root.next.owner

    def head_stamp(self) -> float | None:
        """The oldest record's stamp, or None."""
        first = self._root.next
        return None if first is self._root else self.stamp(first.owner)

    def __iter__(self) -> Iterator[T]:
        """From the head; unlinking the current record, or moving it to the tail, is safe."""
        root = self._root
        link = root.next
        # A link unlinked during the yield is linked to itself: the walk
        # carries on from the successor taken before, and ends at one that
        # was unlinked too rather than loop on it.
        while link is not root and link.next is not link:
            nxt = link.next
            yield link.owner
            link = nxt

    def __reversed__(self) -> Iterator[T]:
        """From the tail (the youngest first); the records must stay where they are."""
        root = self._root
        link = root.prev
        while link is not root:
            yield link.owner
            link = link.prev

    def due(self, bound: float, limit: int) -> list[T]:
        """Up to ``limit`` records from the head stamped at or before ``bound`` (they stay queued)."""
        stamp = self.stamp
        due: list[T] = []
        for record in self:
            if stamp(record) > bound or len(due) >= limit:
                break
            due.append(record)
        return due


# A dead entry's record (see Heap.unlink).
_DEAD: Any = None


class Heap(Generic[T]):
    """Records by a key (a clock value), the smallest first: a sorted run in front of a binary heap.

    An entry is ``[key, sequence, record]`` (the sequence breaks ties, so
    records are never compared, and equal keys come out in the order they
    went in), and the record's ``entry`` attribute holds it while the
    record is in the heap (None otherwise): its place, as a ``Link`` is a
    record's place in a ``Queue``.  ``key`` names the record's attribute
    that ``push`` writes the key to.

    Most keys come in order (a connection goes idle after the one before
    it), and a binary heap's pop costs a sift through all its levels, a
    comparison of two entries at each: thousands of instructions per record
    at thousands of records, at a mass close.  So an entry whose key is no
    smaller than the last one pushed in order joins ``_run``, a deque in
    order, and only the others the heap (``_entries``); the smallest entry
    is the smaller of the two heads.  A push in order and its pop are O(1).

    Invariants: a record is in the heap at most once; ``len`` counts the
    records in it; the entries of ``_run`` are in order, head first.
    ``unlink`` is O(1): it marks the entry dead, and a dead entry is
    dropped when it comes to the head of either, or with every other dead
    one when they outnumber the live (both are rebuilt), so the dead never
    hold more than the live do.  ``push`` and ``pop`` are O(log n) at most;
    a push allocates its entry.
    """

    __slots__ = ("_count", "_dead", "_entries", "_entry", "_get", "_key", "_run", "_sequence")

    def __init__(self, entry: str, key: str) -> None:
        self._run: deque[list[Any]] = deque()
        self._entries: list[list[Any]] = []
        self._count = 0
        self._dead = 0
        self._entry = entry
        self._get: Callable[[T], list[Any] | None] = attrgetter(entry)
        self._key = key
        self._sequence = count()

    def __len__(self) -> int:
        return self._count

    def __contains__(self, record: T) -> bool:
        return self._get(record) is not None

    def push(self, record: T, key: float) -> None:
        """Join with ``key`` (written to the record too); the record must be in no heap."""
        entry = [key, next(self._sequence), record]
        setattr(record, self._key, key)
        setattr(record, self._entry, entry)
        run = self._run
        if not run or key >= run[-1][0]:
            run.append(entry)
        else:
            heapq.heappush(self._entries, entry)
        self._count += 1

    def unlink(self, record: T) -> None:
        """Leave the heap (nothing happens if the record is in none)."""
        entry = self._get(record)
        if entry is None:
            return
        entry[2] = _DEAD
        setattr(record, self._entry, None)
        self._count -= 1
        self._dead += 1
        if self._dead > 32 and self._dead > self._count:
            self._run = deque(entry for entry in self._run if entry[2] is not _DEAD)
            self._entries = [entry for entry in self._entries if entry[2] is not _DEAD]
            heapq.heapify(self._entries)
            self._dead = 0

    def _top(self) -> list[Any] | None:
        run = self._run
        while run and run[0][2] is _DEAD:
            run.popleft()
            self._dead -= 1
        entries = self._entries
        while entries and entries[0][2] is _DEAD:
            heapq.heappop(entries)
            self._dead -= 1
        if entries and (not run or entries[0] < run[0]):
            return entries[0]
        return run[0] if run else None

    def head(self) -> T | None:
        """The record with the smallest key, or None."""
        top = self._top()
        return None if top is None else top[2]

    def head_stamp(self) -> float | None:
        """The smallest key, or None."""
        top = self._top()
        return None if top is None else top[0]

    def pop(self) -> T | None:
        """Take the record with the smallest key out of the heap, or None if it is empty."""
        taken = self.take_through(math.inf, 1)
        return taken[0] if taken else None

    def take_through(self, bound: float, limit: int) -> list[T]:
        """Take out the records whose key is at most ``bound``, smallest first, at most ``limit`` of them."""
        # ``_top`` and the take in one walk, not a call of it, and a batch per
        # call: the keep-alive step takes every connection of a mass close.
        run = self._run
        entries = self._entries
        entry_attribute = self._entry
        taken: list[T] = []
        left = limit
        while left:
            # The smaller head (a dead entry's key and sequence still order it).
            if entries and (not run or entries[0] < run[0]):
                top = entries[0]
                if top[0] > bound and top[2] is not _DEAD:
                    break
                heapq.heappop(entries)
            elif run:
                # Taken, and put back if too young: one subscript less per record.
                top = run.popleft()
                if top[0] > bound and top[2] is not _DEAD:
                    run.appendleft(top)
                    break
            else:
                break
            record: T = top[2]
            if record is _DEAD:
                self._dead -= 1
                continue
            setattr(record, entry_attribute, None)
            taken.append(record)
            left -= 1
        self._count -= len(taken)
        return taken

    def __iter__(self) -> Iterator[T]:
        """The records in the heap, in no particular order (the heap must not change meanwhile)."""
        return (
            entry[2] for entries in (self._run, self._entries) for entry in entries if entry[2] is not _DEAD
        )
