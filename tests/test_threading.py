"""Concurrent use of one manager is detected when checking is enabled."""

import threading

import pytest

from blockspace import BlockSpaceManager, Sequence, SequenceGroup
from blockspace.guard import ConcurrentUseError, guard_concurrency
from conftest import IMPLEMENTATIONS


class StallingSequence(Sequence):
    """Blocks inside the manager (while it reads the tokens) until released."""

    def __init__(self, *args, inside: threading.Event, release: threading.Event, **kwargs):
        super().__init__(*args, **kwargs)
        self.inside, self.release = inside, release

    def get_token_ids(self):
        if not self.release.is_set():
            self.inside.set()
            self.release.wait(5)
        return super().get_token_ids()


@pytest.mark.parametrize("name", IMPLEMENTATIONS)
def test_second_thread_inside_the_manager_is_an_error(name):
    base = BlockSpaceManager.get_block_space_manager_class(name)
    Guarded = guard_concurrency(type(f"Guarded{base.__name__}", (base,), {}), enabled=True)
    manager = Guarded(4, 8, 0, watermark=0)
    inside, release = threading.Event(), threading.Event()
    slow = SequenceGroup("slow", [StallingSequence(1, range(8), inside=inside, release=release)])
    worker = threading.Thread(target=manager.allocate, args=(slow,))
    worker.start()
    assert inside.wait(5)
    with pytest.raises(ConcurrentUseError, match="one scheduler thread"):
        manager.get_num_free_gpu_blocks()
    release.set()
    worker.join(5)
    assert manager.get_num_free_gpu_blocks() == 6  # the first call finished normally
    manager.check_invariants()


def test_checking_is_off_by_default():
    base = BlockSpaceManager.get_block_space_manager_class("reference")
    assert guard_concurrency(base, enabled=False) is base
