"""The ordered queue of the lists beyond Node's: ``body``, ``stalled``, ``closing`` and ``idle_queue``.

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
  (``idle_queue`` is the exception its owner handles: records join it unstamped,
  0, and are stamped from the tail back before a walk: ``connlist.budget``.)
* A walk may unlink the record it is on, or move it to the tail.

A plain insertion-ordered ``dict`` does not serve: after records leave from
its head, finding the head again scans the deleted entries, so a queue
walked from the head and emptied from it grows quadratic until the dict is
rebuilt (docs/benchmarks.md, "Data structures").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from operator import attrgetter
from typing import Any, Generic, TypeVar

__all__ = ["UNQUEUED", "Link", "Queue"]

T = TypeVar("T")


class Link(Generic[T]):
    """A record's place in one queue: linked to itself while in none."""

    __slots__ = ("next", "owner", "prev")

    def __init__(self, owner: T) -> None:
        self.prev: Link[T] = self
        self.next: Link[T] = self
        # The record whose place this is (None: a root's, or UNQUEUED).
        self.owner = owner


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
