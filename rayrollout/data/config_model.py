"""``ConfigModel``: the base of every model a config file fills (the run's sections, a policy
kind's settings, a vLLM deployment file).

One definition of the rule they share: an unknown key is an error (``extra="forbid"``), so a
typo in a YAML file fails loudly instead of being ignored.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["ConfigModel"]


class ConfigModel(BaseModel):
    """Config keys, checked: a key the model does not declare is refused."""

    model_config = ConfigDict(extra="forbid")
