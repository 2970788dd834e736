"""rlkit.utils.once.Once: true once per key, across threads and after a pickle round trip."""

from __future__ import annotations

import pickle
import threading

from rlkit.utils.once import Once


def test_first_is_true_once_per_key():
    once = Once()
    assert once.first("a") and not once.first("a") and once.first(("b", 1)) and not once.first(("b", 1))
    assert once.first() and not once.first()


def test_one_winner_among_threads():
    once, wins = Once(), []
    threads = [threading.Thread(target=lambda: wins.append(once.first("k"))) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wins.count(True) == 1


def test_pickle_keeps_the_keys_seen():
    once = Once()
    once.first("seen")
    copy = pickle.loads(pickle.dumps(once))
    assert not copy.first("seen") and copy.first("new")
