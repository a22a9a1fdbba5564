import os
import shutil
import sys
import tempfile

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


@pytest.fixture(scope="session", autouse=True)
def ray_folder():
    """A local Ray cluster that a test starts in this process (``--executor
    ray`` without ``--address``, as the option grids probe it) keeps its
    files in a short folder of this run's (``RAY_TMPDIR``; Ray's socket
    paths have a length limit), and is shut down and the folder removed when
    the run ends: a test run leaves no Ray process or folder behind."""
    folder = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    before = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = folder
    yield folder
    ray = sys.modules.get("ray")
    if ray is not None and getattr(ray, "is_initialized", lambda: False)():
        ray.shutdown()
    if before is None:
        os.environ.pop("RAY_TMPDIR", None)
    else:
        os.environ["RAY_TMPDIR"] = before
    shutil.rmtree(folder, ignore_errors=True)
