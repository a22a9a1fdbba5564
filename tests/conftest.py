import pytest

from blockspace import BlockSpaceManager

IMPLEMENTATIONS = ["reference", "fast"]  # both, always: a fast manager that fails to import fails the tests


@pytest.fixture(params=IMPLEMENTATIONS)
def make(request):
    """Build a manager of the implementation under test; its invariants are
    checked when the test ends."""
    cls = BlockSpaceManager.get_block_space_manager_class(request.param)
    made = []

    def build(*args, **kwargs):
        manager = cls(*args, **kwargs)
        made.append(manager)
        return manager

    yield build
    for manager in made:
        manager.check_invariants()
