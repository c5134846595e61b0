"""Data model and I/O: what a run reads and writes (tasks, trajectories, the config, the
output folder, exports), and nothing that runs episodes.

May import: the standard library, third-party libraries and ``rayrollout.errors``; never
another part of rayrollout, so every other part can build on it.
"""
