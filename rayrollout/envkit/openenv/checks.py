"""What an OpenEnv environment's args can be checked for before a run, without playing it.

By URL (``server_problem``): ``GET {url}/schema`` answers with an action schema. By class
(``class_problem``): the ``module:Class`` imports and subclasses OpenEnv's base, else the
nearest names. ``OpenEnvEnvironment.config_problem`` asks both before a collect starts.
"""

from __future__ import annotations

import ast
import difflib
import http.client
import importlib
import importlib.util
import inspect
import json
import urllib.error
import urllib.request
from pathlib import Path

from rayrollout.envkit.openenv.socket import socket_url

__all__ = ["PROBE_TIMEOUT_S", "class_problem", "server_problem"]

PROBE_TIMEOUT_S = 3.0
"""Seconds ``GET /schema`` may take: OpenEnv's server answers it in milliseconds."""
_BODY_LIMIT = 1 << 20


def server_problem(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the OpenEnv server at ``url`` cannot be played (it does not answer, answers an
    HTTP error to ``GET /schema``, or gives no action schema), or None when it can."""
    base = socket_url(url).removesuffix("/ws")
    http_base = base.replace("wss://", "https://", 1).replace("ws://", "http://", 1)
    schema_url = f"{http_base}/schema"
    fix = "start the server, or fix environments.NAME.args.url"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(schema_url, timeout=timeout_s) as response:
            body = response.read(_BODY_LIMIT)
    except urllib.error.HTTPError as exc:
        exc.close()
        return (
            f"OpenEnv server at {url} answers HTTP {exc.code} to GET /schema: is it an "
            "OpenEnv server (its app from openenv's create_app)? Fix environments.NAME.args.url"
        )
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError):
            why = f"no answer within {timeout_s:g} s"
        elif isinstance(reason, OSError) and reason.strerror:
            why = reason.strerror
        else:
            why = str(reason)
        return f"OpenEnv server at {url} does not answer (GET {schema_url}: {why}): {fix}"
    try:
        schema = json.loads(body).get("action")
    except (ValueError, AttributeError):
        schema = None
    if not isinstance(schema, dict):
        return (
            f"OpenEnv server at {url} gave no action schema at GET /schema: is it an OpenEnv "
            "server (its app from openenv's create_app)? Fix environments.NAME.args.url"
        )
    return None


def class_problem(path: str, what: str, base: str) -> str | None:
    """Why ``path`` ('module:Class', the args' ``what``) is not a subclass of ``base``
    ('module:Class' of OpenEnv's base class) importable here, or None when it is."""
    module_name, _, name = path.partition(":")
    if not module_name or not name:
        return f"OpenEnv {what} must be 'module:Class', got {path!r}: fix environments.NAME.args"
    # Found and read before it is imported: an OpenEnv environment's module imports openenv
    # and FastMCP, seconds on a busy machine, and a mistyped name should cost none of that.
    try:
        spec = importlib.util.find_spec(module_name)  # imports its parent packages only
        missing = f"ModuleNotFoundError: No module named {module_name!r}"
    except Exception as exc:
        spec, missing = None, f"{type(exc).__name__}: {exc}"
    if spec is None:
        return (
            f"OpenEnv {what} {path!r} cannot be imported: {missing} (run from the folder that "
            "holds the module, or put it on PYTHONPATH)"
        )
    source = _source_names(spec.origin)
    if source is not None and name not in source[0]:
        return _no_such_name(path, what, module_name, name, source[1])
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the module's own import error, whatever it is, says why
        return (
            f"OpenEnv {what} {path!r} cannot be imported: {type(exc).__name__}: {exc} (run "
            "from the folder that holds the module, or put it on PYTHONPATH)"
        )
    found = getattr(module, name, None)
    if found is None:
        classes = [n for n, v in vars(module).items() if inspect.isclass(v) and n[0] != "_"]
        return _no_such_name(path, what, module_name, name, classes)
    base_module, _, base_name = base.partition(":")
    expected = getattr(importlib.import_module(base_module), base_name)
    if not (isinstance(found, type) and issubclass(found, expected)):
        return f"OpenEnv {what} {path!r} is not a subclass of OpenEnv's {base_name} ({base})"
    return None


def _no_such_name(path: str, what: str, module_name: str, name: str, classes: list[str]) -> str:
    """The line for a name its module lacks, with the nearest of the module's ``classes``."""
    close = difflib.get_close_matches(name, classes, n=3, cutoff=0.6)
    hint = (
        "did you mean " + " or ".join(f"'{module_name}:{n}'" for n in close) + "?"
        if close
        else f"its classes: {', '.join(sorted(classes)[:12]) or 'none'}"
    )
    return f"OpenEnv {what} {path!r}: module {module_name!r} has no {name!r}; {hint}"


def _source_names(origin: str | None) -> tuple[set[str], list[str]] | None:
    """Every name the module's source at ``origin`` binds anywhere (classes, functions,
    assignments, imports), and its public top-level classes, read without running it.

    Over-inclusive on purpose: a name bound only in a nested scope counts, so a name found
    here may still be missing (the import then says so). None where the source cannot tell
    what the module holds: no Python source, a syntax error, ``import *``, a module
    ``__getattr__``, or ``globals()`` written to.
    """
    if not origin or not origin.endswith(".py"):
        return None
    try:
        tree = ast.parse(Path(origin).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return None
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Name):
            names.add(node.id)  # stores and loads: a load of globals() counts too
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.add(alias.asname or alias.name.partition(".")[0])
    if names & {"__getattr__", "globals", "setattr", "vars"}:
        return None
    classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef) and n.name[0] != "_"]
    return names, classes
