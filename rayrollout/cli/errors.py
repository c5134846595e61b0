"""The command line's exceptions (an episode filter it cannot read): one module, beside the
CLI's other input errors, which it raises from the layers below.
"""

from __future__ import annotations

from rayrollout.errors import InputError

__all__ = ["EpisodeFilterError"]


class EpisodeFilterError(InputError, ValueError):
    """A ``show`` filter names something that cannot match (a status that does not exist)."""
