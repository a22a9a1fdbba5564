"""The reference block manager: pure Python, the executable specification."""

from blockspace.reference.manager import ReferenceBlockSpaceManager
from blockspace.reference.placeholder import PlaceholderBlockSpaceManager

__all__ = ["PlaceholderBlockSpaceManager", "ReferenceBlockSpaceManager"]
