"""``cxlkv cluster up|down|status``: a local multi-process cluster for demos and benchmarks.

``up`` starts a master and N clientds on emulated CXL regions in ``/dev/shm`` and
returns, leaving them running; their configs, logs and sockets live in one run
directory (``--run-dir``, default ``./run/cluster``) with a ``cluster.json`` that
``status`` and ``down`` read. ``down`` stops every process (SIGTERM, then SIGKILL)
and deletes the region files and the sockets and ready files of clientds that
did not remove them (killed ones).

``cluster.json`` records each process's pid *and* start time (``/proc/PID/stat``
field 22): a pid is signalled or reported alive only while the process with that
pid has the recorded start time and a command line naming cxlkv, so a pid reused
by an unrelated process after the cluster died is reported gone, never killed.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import click

from cxlkv.cli.sizes import Size
from cxlkv.config import format_size
from cxlkv.runtime.procs import same_process

DEFAULT_RUN_DIR = "run/cluster"


def _load_state(run_dir: Path) -> dict:
    path = run_dir / "cluster.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise click.ClickException(f"no cluster in {run_dir} (no cluster.json); start one with `cxlkv cluster up`") from None


def _processes(state: dict) -> list[tuple[str, int | None, int | None]]:
    """``(name, pid, start time)`` of every process ``cluster.json`` records."""
    procs = [("master", state.get("master_pid"), state.get("master_start_time"))]
    procs += [(m["name"], m.get("pid"), m.get("start_time")) for m in state.get("masters") or []
              if m.get("pid") != state.get("master_pid")]
    if state.get("etcd"):
        procs.append(("etcd", state["etcd"].get("pid"), state["etcd"].get("start_time")))
    procs += [(c["name"], c.get("pid"), c.get("start_time")) for c in state.get("clientds", [])]
    return procs


def _alive(pid: int | None, start_time: int | None) -> bool:
    """Whether ``pid`` is still the recorded cluster process (same start time, a cxlkv
    command line, not a zombie) — a recycled pid is not."""
    return same_process(pid, start_time, cmdline_contains="cxlkv")


def _stop_pid(pid: int | None, start_time: int | None, timeout_s: float) -> bool:
    """SIGTERM then SIGKILL the recorded process, if it is still that process.

    Returns:
        True if SIGKILL was needed.
    """
    if not _alive(pid, start_time):
        return False
    assert pid is not None
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid, start_time):
            return False
        time.sleep(0.05)
    if not _alive(pid, start_time):
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


@click.group("cluster")
def cluster_group() -> None:
    """A local cluster: a master and clientds on emulated CXL regions (/dev/shm)."""


@cluster_group.command("up")
@click.option("--run-dir", default=DEFAULT_RUN_DIR, show_default=True, type=click.Path(file_okay=False))
@click.option("--clientds", default=2, show_default=True, type=click.IntRange(min=1), help="clientd processes (hosts).")
@click.option("--region-size", default="1GiB", show_default=True, type=Size(min_bytes=1),
              help="Size of each emulated CXL region (64MiB, 2GiB; GB is decimal).")
@click.option("--segments", default=1, show_default=True, type=click.IntRange(min=1), help="Number of CXL regions.")
@click.option("--prefault/--no-prefault", default=False, show_default=True, help="Touch every region page at start.")
@click.option("--tls", is_flag=True, help="Generate a CA and certificates in RUN_DIR/certs and run every link "
                                          "to the master (gRPC, lean, /metrics) over mutual TLS.")
@click.option("--masters", default=1, show_default=True, type=click.IntRange(min=1),
              help="Masters; more than one also starts a local etcd and runs them with leader election "
                   "(docs/ha.md).")
@click.option("--expected-objects", type=click.IntRange(min=1), default=None,
              help="Objects to size each region's index for (2 slots of 64 B each, the table rounded up to a "
                   "power of two: 128-256 B of region per object; default: region size / 16 KiB). Small values need more: past it, objects overflow and their reads take the "
                   "RPC path (docs/index.md).")
def up_cmd(run_dir: str, clientds: int, region_size: int, segments: int, prefault: bool, tls: bool,
           masters: int, expected_objects: int | None) -> None:
    """Start a local cluster and leave it running (plaintext on loopback, or --tls)."""
    from cxlkv.deploy.cluster import LocalCluster
    from cxlkv.errors import CxlkvError

    rd = Path(run_dir)
    if (rd / "cluster.json").exists():
        state = json.loads((rd / "cluster.json").read_text())
        # Any live process or region left by the previous cluster would be orphaned when
        # this one overwrites (or, failing, deletes) cluster.json: `down` must clean it first.
        alive = [name for name, pid, start in _processes(state) if _alive(pid, start)]
        if alive:
            raise click.ClickException(f"a cluster is already running in {rd} ({', '.join(alive)} alive; "
                                       f"`cxlkv cluster down --run-dir {run_dir}` first)")
        left = [p for p in state.get("regions", []) if Path(p).exists()]
        if left:
            raise click.ClickException(f"the previous cluster in {rd} stopped but left its region(s) "
                                       f"{', '.join(left)}; `cxlkv cluster down --run-dir {run_dir}` deletes them")
    try:
        size = region_size
        cluster = LocalCluster(rd, clientds=clientds, region_size_bytes=size, segments=segments,
                               clientd_options={"prefault": prefault}, tls=tls, masters=masters,
                               index_objects=expected_objects)
        cluster.start()
    except CxlkvError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:  # the run directory cannot be written (full, read-only): stopped and cleaned up
        where = f" ({exc.filename})" if exc.filename else ""
        raise click.ClickException(f"cannot start the cluster in {rd}: {exc.strerror or exc}{where}") from None
    if cluster.etcd is not None:
        click.echo(f"etcd     {cluster.etcd_endpoint}  prefix {cluster.etcd_prefix}  (log {rd / 'etcd.log'})")
        for i, (p, addr) in enumerate(zip(cluster.masters, cluster.master_addresses)):
            role = "leader " if p is cluster.master else "standby"
            click.echo(f"master-{i} {addr}  {role}  (log {p.log_path})")
        click.echo(f"export CXLKV_ETCD={cluster.etcd_url} CXLKV_ETCD_PREFIX={cluster.etcd_prefix}"
                   "   # cxlkv status then shows the leader, standbys and epoch")
    else:
        click.echo(f"master   {cluster.master_address}  (log {rd / 'master.log'})")
    for i, path in enumerate(cluster.socket_paths):
        click.echo(f"clientd-{i} {path}")
    for path in cluster.region_paths:
        click.echo(f"region   {path} ({format_size(size)})")
    click.echo(f"\nexport CXLKV_SOCKET={cluster.socket_paths[0]}   # then: cxlkv put/get/stat …")
    if tls:
        a = cluster.tls_files("admin")
        click.echo(f"certs    {cluster.certs_dir} (CA, master, clientd-N, admin)")
        click.echo(f"export CXLKV_TLS_CA={a.ca_file} CXLKV_TLS_CERT={a.cert_file} CXLKV_TLS_KEY={a.key_file}"
                   "   # the admin identity, for cxlkv status / cxlkv admin")
    click.echo("cxlkv status   # usage, hit rate, clients and each daemon's /metrics URL")
    click.echo(f"stop with: cxlkv cluster down --run-dir {run_dir}")


@cluster_group.command("down")
@click.option("--run-dir", default=DEFAULT_RUN_DIR, show_default=True, type=click.Path(file_okay=False))
@click.option("--timeout", "timeout_s", default=10.0, show_default=True, help="Seconds before SIGKILL.")
def down_cmd(run_dir: str, timeout_s: float) -> None:
    """Stop a local cluster; delete its regions and the sockets and ready files left
    by killed clientds. A recorded pid now used by another process is left alone."""
    rd = Path(run_dir)
    state = _load_state(rd)
    killed = []
    for c in state.get("clientds", []):
        if _stop_pid(c.get("pid"), c.get("start_time"), timeout_s):
            killed.append(c["name"])
    masters = state.get("masters") or [{"name": "master", "pid": state.get("master_pid"),
                                         "start_time": state.get("master_start_time")}]
    for m in masters:
        if _stop_pid(m.get("pid"), m.get("start_time"), timeout_s):
            killed.append(m["name"])
    if state.get("etcd") and _stop_pid(state["etcd"].get("pid"), state["etcd"].get("start_time"), timeout_s):
        killed.append("etcd")
    for path in state.get("regions", []):
        Path(path).unlink(missing_ok=True)
    for i, c in enumerate(state.get("clientds", [])):
        sock = c.get("socket_path")
        leftovers = [sock, c.get("lean_socket_path") or (sock + ".lean" if sock else None),
                     c.get("ready_file") or str(rd / f"clientd-{i}.ready")]
        for path in leftovers:
            if path:
                Path(path).unlink(missing_ok=True)  # every clientd is stopped: these are stale
    (rd / "cluster.json").unlink(missing_ok=True)
    click.echo("cluster stopped" + (f" (killed: {', '.join(killed)})" if killed else ""))


@cluster_group.command("status")
@click.option("--run-dir", default=DEFAULT_RUN_DIR, show_default=True, type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True)
def status_cmd(run_dir: str, as_json: bool) -> None:
    """Which processes of a local cluster run, and where."""
    from tabulate import tabulate

    state = _load_state(Path(run_dir))
    rows = [{"process": m["name"], "pid": m.get("pid"), "alive": _alive(m.get("pid"), m.get("start_time")),
             "address": m.get("address")} for m in state.get("masters") or []] or [
        {"process": "master", "pid": state.get("master_pid"),
         "alive": _alive(state.get("master_pid"), state.get("master_start_time")),
         "address": state.get("master_address")}]
    if state.get("etcd"):
        e = state["etcd"]
        rows.append({"process": "etcd", "pid": e.get("pid"), "alive": _alive(e.get("pid"), e.get("start_time")),
                     "address": e.get("endpoint")})
    for c in state.get("clientds", []):
        rows.append({"process": c["name"], "pid": c.get("pid"), "alive": _alive(c.get("pid"), c.get("start_time")),
                     "address": c["socket_path"]})
    if as_json:
        click.echo(json.dumps({"processes": rows, "regions": state.get("regions", [])}, indent=2))
        return
    click.echo(tabulate([list(r.values()) for r in rows], headers=list(rows[0].keys())))
    for path in state.get("regions", []):
        exists = Path(path).exists()
        click.echo(f"region {path}: {format_size(Path(path).stat().st_size) if exists else 'missing'}")
