"""Sweep NeMo Gym 0.7.0's resources servers: which start offline, and how rayrollout plays them.

Run as a script (not a pytest test), from the repository root, in rayrollout's venv::

    python tests/nemo_gym/sweep.py [--only NAME,...] [--out FILE.json] [--batch N]

The latest summary of a whole sweep is kept beside this file, in ``sweep_result.json``
(``python tests/nemo_gym/sweep.py --batch 8 > tests/nemo_gym/sweep_result.json``), and
the NeMo Gym how-to page gives its figures.

1. Every resources server in the unpacked wheel is classified from its own config block,
   its code and its requirements: it needs an LLM judge (or another model server), the
   network or an outside service (API keys, containers, downloads at run time), or a GPU;
   the rest are "offline".
2. Each offline server's entry module is imported in NeMo Gym's venv first (one process
   each), so a missing package is named per server instead of failing a whole ``ng_run``.
3. The importable ones are started in batches by NeMo Gym's own ``ng_run``
   (``ngrun.NemoGymRun``); rayrollout plays each server's own ``data/example.jsonl`` against
   it with the scripted policy double, one Ray + Serve + policy for the whole sweep and one
   ``RolloutEngine`` per batch, reading rows exactly as ``collect --env NAME --env-url
   NAME=URL`` does, with the agent the docs tell a user to pass: ``reset_step`` for a
   GymnasiumServer (``/reset``, ``/step``) and for rows whose first observation is the
   server's, the default tool loop otherwise.
4. Per server it records rows read and refused by the task reader, episode statuses and
   every protocol error: a 4xx/5xx answer to ``/seed_session``, ``/verify`` or
   ``/close_session`` (a GymnasiumServer's: ``/reset``, ``/step``, ``/close``, less the 404s
   its protocol calls for) or a 5xx from a tool route (from the server's own access log), and the
   episodes' ``error``/``close_error`` texts. The JSON summary goes to stdout (and --out).
   (ng_run merges its servers' output, so now and then an access line loses its server
   prefix: access counts are a lower bound; the episodes' errors name every failed call.)

The ng_run processes get a dead HTTP(S) proxy and Hugging Face's offline switches, so a
server that reaches outside by surprise fails here instead of reaching the network.

Step 1 lives in ``sweep_classify.py``, step 2 and the reading of ng_run's output in
``sweep_probe.py``, steps 3 and 4 in ``sweep_play.py``; this file reports and is the
command line.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ngrun import free_port  # noqa: E402
from sweep_classify import SERVERS_DIR, Server, classify, find_block  # noqa: E402
from sweep_play import Sweep  # noqa: E402
from sweep_probe import probe_import, protocol_routes  # noqa: E402

BATCH = 12
# Small PyPI requirements of offline servers pip-installed into .venv-nemo-gym for this
# sweep (not among nemo-gym 0.7.0's own dependencies); the sweep does not install them.
INSTALLED = [
    "math-verify==0.8.0 (math_with_judge, polymath; brings latex2sympy2_extended, sympy)",
    "editdistance (ruler2)",
    "toml (structeval)",
    "xmltodict==1.0.2 (structured_outputs)",
    "openapi-schema-validator==0.6.3 (terminal_multi_harness)",
    "gymnasium==1.1.1 (grl_tetris, tales)",
    "assaybench==0.2.0 (assaybench)",
    "gym-sokoban==0.0.6 (grl_sokoban; brings gym)",
    "reasoning-gym>=0.1.19 (reasoning_gym)",
    "rdkit==2025.9.6 (fukuyamabench, moldetox)",
    "safe-mol==0.2.1 (moldetox; brings datamol and a Jupyter stack)",
    "beside .ci/nemo_gym's own additions for toolsandbox (polars-lts-cpu, rouge-score, ...)",
]


def reason_not_clean(server: Server) -> str | None:
    """One line on why a server did not run cleanly; None when it did."""
    if server.category != "offline":
        return f"{server.category}: " + "; ".join(r.split(": ", 1)[1] for r in server.reasons[:3])
    if server.started is False:
        return f"did not start: {server.not_started}"
    if server.started is None:
        return "not run"
    if server.read == 0:
        first = server.refused[0] if server.refused else "no rows"
        return f"every row refused by the task reader: {first}"
    if server.protocol_errors:
        first = (server.errors or server.close_errors or [""])[0]
        other = [n for n in server.notes if "GymnasiumServer" in n]
        why = f" [{other[0]}]" if other else ""
        return f"protocol errors {', '.join(server.protocol_errors)}{why}: {first[:300]}"
    if server.statuses.get("error"):
        return f"{server.statuses['error']} episode error(s): {server.errors[0][:300]}"
    if server.episodes < server.read:
        return f"only {server.episodes} of {server.read} episodes came back"
    return None


def tool_4xx(server: Server) -> dict[str, dict[str, int]]:
    """4xx answers of tool routes: not protocol errors, the model reads them as tool errors."""
    routes = protocol_routes(server)
    return {
        f"/{route}": codes
        for route, codes in server.access.items()
        if route not in routes and any(code.startswith("4") for code in codes)
    }


def summary(servers: list[Server], seconds: float) -> dict[str, Any]:
    categories = collections.Counter(s.category for s in servers)
    started = [s for s in servers if s.category == "offline" and s.started]
    played = [s for s in started if s.episodes]
    return {
        "counts": {
            "total": len(servers),
            "offline": categories["offline"],
            "judge": categories["judge"],
            "network": categories["network"],
            "gpu": categories["gpu"],
            "no_config": categories["no_config"],
            "started": len(started),
            "played": len(played),  # started, and the task reader let rows through
            "played_with_0_protocol_errors": sum(1 for s in played if not s.protocol_errors),
            "clean": sum(1 for s in played if reason_not_clean(s) is None),
        },
        "wall_s": round(seconds, 1),
        "not_clean": {s.name: r for s in servers if (r := reason_not_clean(s)) is not None},
        # A tool the row offers that the server does not serve answers 404 (so it would to
        # NeMo Gym's own agents): shown to the model as a tool error, not a protocol error.
        "tool_4xx": {s.name: t for s in servers if (t := tool_4xx(s))},
        "allowed_agents": {
            s.name: n.split(": ", 1)[1]
            for s in started
            for n in s.notes
            if n.startswith("allowed_agents")
        },
        "played_with_reset_step": [s.name for s in started if s.agent],
        "installed_into_nemo_gym_venv": INSTALLED,
        "clean": [s.name for s in servers if reason_not_clean(s) is None],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated server names (default: all)")
    parser.add_argument("--out", type=Path, help="write the summary and per-server details here")
    parser.add_argument("--batch", type=int, default=BATCH, help="servers per ng_run")
    parser.add_argument("--workdir", type=Path, help="keep ng_run logs and outputs here")
    parser.add_argument("--classify-only", action="store_true", help="classify, start nothing")
    args = parser.parse_args()
    began = time.monotonic()

    names = sorted(p.name for p in SERVERS_DIR.iterdir() if p.is_dir() and p.name[0] not in "._")
    if args.only:
        wanted = {n.strip() for n in args.only.split(",") if n.strip()}
        unknown = wanted - set(names)
        if unknown:
            parser.error(f"no such resources server: {', '.join(sorted(unknown))}")
        names = [n for n in names if n in wanted]
    servers = [classify(name) for name in names]
    offline = [s for s in servers if s.category == "offline"]
    print(f"{len(servers)} servers, {len(offline)} offline", file=sys.stderr, flush=True)

    if not args.classify_only and offline:
        with ThreadPoolExecutor(2) as pool:
            blocks = [find_block(s.name)[2] for s in offline]
            failures = list(pool.map(probe_import, offline, blocks))
        for server, failure in zip(offline, failures, strict=True):
            if failure:
                server.started, server.not_started = False, failure
        runnable = [s for s in offline if s.started is None]
        print(f"{len(runnable)} import cleanly", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix="ngsweep-") as tmp:
            workdir = args.workdir or Path(tmp)
            workdir.mkdir(parents=True, exist_ok=True)
            sweep = Sweep(workdir, free_port())
            sweep.start_policy()
            for index in range(0, len(runnable), args.batch):
                batch = runnable[index : index + args.batch]
                print(
                    f"batch {index // args.batch + 1}: {', '.join(s.name for s in batch)}",
                    file=sys.stderr,
                    flush=True,
                )
                sweep.run_batch(batch, index // args.batch)

    result = summary(servers, time.monotonic() - began)
    print(json.dumps(result, indent=2))
    if args.out:
        details = {s.name: asdict(s) for s in servers}
        args.out.write_text(json.dumps({**result, "servers": details}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
