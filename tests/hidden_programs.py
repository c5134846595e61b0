"""A ``PATH`` on which one program is missing: how a test plays a machine without bubblewrap.

Every program of the current ``PATH`` but the hidden one is linked into a folder of the
test's own, and that folder is the whole ``PATH`` a child process gets. ``shutil.which``
(how the code sandbox and the system-package gate find ``bwrap``) then finds nothing, while
everything else a run calls is where it was. Interpreters are started by absolute path
(``sys.executable``), so the virtual environment is unaffected.
"""

from __future__ import annotations

import os
from pathlib import Path


def path_without(program: str, folder: Path) -> str:
    """A ``PATH`` (one folder, made at ``folder``) with every program of the current one but
    ``program``."""
    folder.mkdir(parents=True, exist_ok=True)
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for entry in os.scandir(directory):
            link = folder / entry.name
            if entry.name == program or link.exists() or link.is_symlink():
                continue  # hidden, or an earlier PATH entry wins as it would have
            if entry.is_file() and os.access(entry.path, os.X_OK):
                link.symlink_to(entry.path)
    return str(folder)
