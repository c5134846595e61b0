"""``Figures``: the base of every model of run figures the engine and writer hand back.

Typed, so code reading them is checked; and readable as a read-only mapping
(``figures["mean_reward"]``, ``"writer" in figures``, ``.items()``, ``dict(figures)``),
because training loops log them as dicts and were written against the dict form these models
replaced. Iterating one yields ``(name, value)`` pairs, as pydantic's models do, not names.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["Figures"]


class Figures(BaseModel):
    """A pydantic model of figures that also reads like the dict it was."""

    model_config = ConfigDict(extra="forbid")

    def __getitem__(self, key: str) -> Any:
        if key not in type(self).model_fields:
            raise KeyError(f"{type(self).__name__} has no figure {key!r}; it has {self.keys()}")
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in type(self).model_fields

    def get(self, key: str, default: Any = None) -> Any:
        """The figure ``key``, or ``default`` where the model has no such figure."""
        return getattr(self, key) if key in self else default

    def keys(self) -> list[str]:
        """The figure names, in declaration order."""
        return list(type(self).model_fields)

    def values(self) -> list[Any]:
        """The figures, in declaration order."""
        return [getattr(self, name) for name in type(self).model_fields]

    def items(self) -> list[tuple[str, Any]]:
        """``(name, figure)`` pairs, in declaration order (``dict(figures)`` gives the same)."""
        return [(name, getattr(self, name)) for name in type(self).model_fields]
