"""A throwaway Slurm on this machine: munged, slurmctld and two slurmd, all under one temp dir.

Nothing touches /etc: munge's key and socket, slurm.conf, state, spool, logs and pid files
live in the temp dir and clients find it by ``SLURM_CONF``. Two slurmd (``n1`` with feature
``gpu``, ``n2`` with ``cpu``) run on this host with their own ports. Everything is stopped by
the PIDs in its pid files (notes/slurm.md).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from raycluster import free_port_block


def missing_reason() -> str | None:
    """Why a local Slurm cannot run here, or None when it can. Its packages are the
    ``system_package("slurm")`` mark's (conftest.py); this is what they cannot give."""
    if os.geteuid() != 0:
        return "a local slurmd needs root (it starts job steps as their user)"
    return None


def _bin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


@dataclass
class LocalSlurm:
    root: Path
    nodes: tuple[str, ...] = ("n1", "n2")

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        return env

    def start(self) -> None:
        root = self.root
        (root / "state").mkdir(parents=True, exist_ok=True)
        key = root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        subprocess.run(
            [
                _bin("munged"),
                f"--key-file={key}",
                f"--socket={root / 'munge.sock'}",
                f"--pid-file={root / 'munged.pid'}",
                f"--seed-file={root / 'munge.seed'}",
                f"--log-file={root / 'munged.log'}",
                "--force",
            ],
            check=True,
            timeout=30,
        )
        base = free_port_block(2 + len(self.nodes))
        host = socket.gethostname()
        lines = [
            "ClusterName=rrtest",
            f"SlurmctldHost={host}",
            f"SlurmctldPort={base}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={root / 'munge.sock'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "JobAcctGatherType=jobacct_gather/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "KillWait=5",
            f"StateSaveLocation={root / 'state'}",
            f"SlurmdSpoolDir={root / 'spool-%n'}",
            f"SlurmctldPidFile={root / 'slurmctld.pid'}",
            f"SlurmdPidFile={root / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={root / 'slurmctld.log'}",
            f"SlurmdLogFile={root / 'slurmd-%n.log'}",
        ]
        features = ["gpu", "cpu"]
        for i, node in enumerate(self.nodes):
            lines.append(
                f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={base + 1 + i} "
                f"CPUs=1 RealMemory=2000 Features={features[i % 2]} State=UNKNOWN"
            )
        lines.append(
            f"PartitionName=rr Nodes={','.join(self.nodes)} Default=YES MaxTime=60 State=UP"
        )
        self.conf.write_text("\n".join(lines) + "\n")
        env = self.env()
        subprocess.run([_bin("slurmctld"), "-f", str(self.conf)], env=env, check=True, timeout=60)
        for node in self.nodes:
            subprocess.run(
                [_bin("slurmd"), "-f", str(self.conf), "-N", node], env=env, check=True, timeout=60
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            out = subprocess.run(
                ["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True, check=False
            ).stdout.split()
            if len(out) >= 1 and all(s == "idle" for s in out) and self._count_idle(env):
                return
            time.sleep(1)
        raise TimeoutError(f"Slurm nodes not idle after 60 s; see {root}/*.log")

    def _count_idle(self, env: dict[str, str]) -> bool:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %T"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        return sum(line.endswith("idle") for line in out.splitlines()) == len(self.nodes)

    def submit(self, args: list[str], env: dict[str, str], cwd: Path) -> str:
        out = subprocess.run(
            ["sbatch", "--parsable", *args],
            env={**env, "SLURM_CONF": str(self.conf)},
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        return out.strip().split(";")[0]

    def wait(self, job_id: str, timeout_s: float) -> str:
        """The job's final state (COMPLETED, FAILED, ...), from ``scontrol show job``."""
        deadline = time.monotonic() + timeout_s
        state = "UNKNOWN"
        while time.monotonic() < deadline:
            out = subprocess.run(
                ["scontrol", "show", "job", job_id],
                env=self.env(),
                capture_output=True,
                text=True,
                check=False,
            ).stdout
            match = re.search(r"JobState=(\w+)", out)
            state = match.group(1) if match else state
            if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "UNKNOWN"):
                return state
            time.sleep(2)
        subprocess.run(["scancel", job_id], env=self.env(), check=False, timeout=30)
        raise TimeoutError(f"Slurm job {job_id} still {state} after {timeout_s}s (cancelled)")

    def stop(self) -> None:
        """Stop slurmd(s), slurmctld and munged by the PIDs in their pid files."""
        pid_files = [self.root / f"slurmd-{n}.pid" for n in self.nodes]
        pid_files += [self.root / "slurmctld.pid", self.root / "munged.pid"]
        for pid_file in pid_files:
            try:
                pid = int(pid_file.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            for _ in range(50):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
