"""Runs of a bounded length and a bounded number of keys (app.core.chunks.packed): what a
batch across partitions is cut into."""

from __future__ import annotations

from app.core.chunks import packed


def test_runs_hold_at_most_size_items_and_keys_keys_a_key_kept_together() -> None:
    items = [("a", 1), ("b", 1), ("a", 2), ("c", 1), ("d", 1), ("c", 2), ("e", 1)]
    runs = packed(items, lambda i: i[0], size=4, keys=2)
    assert runs == [[("a", 1), ("a", 2), ("b", 1)], [("c", 1), ("c", 2), ("d", 1)],
                    [("e", 1)]]


def test_a_key_with_more_items_than_a_run_holds_spans_runs_of_its_own() -> None:
    items = [("a", n) for n in range(5)] + [("b", 0)]
    runs = packed(items, lambda i: i[0], size=2, keys=10)
    assert runs == [[("a", 0), ("a", 1)], [("a", 2), ("a", 3)], [("a", 4), ("b", 0)]]
    assert packed([], lambda i: i, size=2, keys=2) == []
