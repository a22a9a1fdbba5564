"""blockspace: a paged KV-cache block manager with vLLM's v0 interface.

``BlockSpaceManager.get_block_space_manager_class("reference" | "fast" |
"placeholder" | "selfattn")`` gives an implementation; all of them take
vLLM's constructor arguments and vLLM's own sequence objects.
"""

from blockspace.enums import AllocStatus, Device, SequenceStatus
from blockspace.errors import NoFreeBlocksError
from blockspace.interfaces import BlockSpaceManager
from blockspace.sequence import Sequence, SequenceData, SequenceGroup

__version__ = "0.1.0"

__all__ = [
    "AllocStatus",
    "BlockSpaceManager",
    "Device",
    "NoFreeBlocksError",
    "Sequence",
    "SequenceData",
    "SequenceGroup",
    "SequenceStatus",
]
