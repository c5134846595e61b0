"""Data model and I/O: what a run reads and writes, and nothing that runs episodes.

Lives here: the task and trajectory models and their Arrow schema (``schema``), the run
configuration (``config``), task files (``tasks``), Chat <-> Responses-API conversion
(``convert``), output folders and their writers (``writer``) and exports (``export``).

May import: the standard library, third-party libraries and ``rayrollout.errors``; never
another part of rayrollout, so every other part can build on it.
"""
