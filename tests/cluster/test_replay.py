"""The main job: trace replay on a real local cluster, and the cluster commands."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cxlkv.trace.replay import ReplayOptions, run_embedded

TRACE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "conversation_trace.jsonl"
needs_trace = pytest.mark.skipif(not TRACE.exists(), reason="shared trace not present")


@needs_trace
@pytest.mark.parametrize("policy", ["lru", "arc", "prefix"])
def test_replay_500_requests_verified_and_matches_simulation(tmp_path: Path, policy: str) -> None:
    """First 500 requests, content verified, 0 errors; the store's block hit rate
    equals an in-process simulation of the same policy, capacity and watermarks
    within 1 point (one worker: the trace's order is kept exactly)."""
    opts = ReplayOptions(trace_path=str(TRACE), limit=500, workers=1, block_bytes=16 * 1024,
                         capacity_fraction=0.3, policy=policy)
    report = run_embedded(opts, clientds=2, run_dir=str(tmp_path / "run"))
    assert report.errors == 0, report.error_samples
    assert report.requests == 500
    assert report.verified_blocks > 0
    assert report.verified_blocks == round(report.blocks * report.block_hit_rate)
    assert report.block_hit_rate > 0.05
    assert abs(report.block_hit_rate - report.policy_sim_hit_rate) <= 0.01, report
    assert report.bound_hit_rate >= report.block_hit_rate
    # every other shipped policy and the offline optimum at the same capacity
    assert set(report.other_sim_hit_rates) == {"lru", "arc", "prefix"} - {policy, "lru"}
    assert report.bound_hit_rate >= report.belady_hit_rate >= max(
        [report.policy_sim_hit_rate, report.lru_sim_hit_rate, *report.other_sim_hit_rates.values()])
    assert "Belady" in report.table()
    assert report.bytes_written == report.put_blocks * opts.block_bytes


@needs_trace
def test_replay_cli_json_concurrent_hosts(tmp_path: Path) -> None:
    """`cxlkv replay --embedded --json` with several workers over two clientds:
    0 errors and the documented fields; no process or region left behind."""
    # the embedded cluster's run directory goes under tmp_path (TMPDIR); its
    # cluster.json names the cluster, whose regions are /dev/shm/cxlkv-<id>-*
    # (other clusters on the machine may come and go meanwhile)
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = subprocess.Popen(
        [sys.executable, "-m", "cxlkv.cli", "replay", str(TRACE), "--embedded", "--json",
         "--limit", "300", "--workers", "4", "--block-bytes", "8KiB"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    cluster_ids: set[str] = set()
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline:
        for cj in tmp_path.glob("cxlkv-replay-*/cluster.json"):
            try:
                cluster_ids.add(json.loads(cj.read_text())["cluster_id"])
            except (OSError, ValueError, KeyError):
                pass  # being written
        time.sleep(0.05)
    stdout, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    assert proc.returncode == 0, stderr[-3000:]
    assert cluster_ids, "the replay's cluster.json was never seen"
    rec = json.loads(stdout)
    for field in ("errors", "block_hit_rate", "lru_sim_hit_rate", "bound_hit_rate", "requests_per_s",
                  "p50_ms", "p99_ms", "token_hit_rate", "bytes_read", "bytes_written", "verified_blocks",
                  "elapsed_s", "gbps"):
        assert field in rec, field
    assert rec["errors"] == 0 and rec["requests"] == 300
    assert rec["clientds"] == 2 and rec["workers"] == 4
    for cid in cluster_ids:
        assert not list(Path("/dev/shm").glob(f"cxlkv-{cid}-*")), cid
    assert not list(tmp_path.glob("cxlkv-replay-*")), "the run directory is left behind"


def test_replay_cli_errors(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from cxlkv.trace.replay import replay_cmd

    r = CliRunner().invoke(replay_cmd, [str(tmp_path / "missing.jsonl"), "--embedded"])
    assert r.exit_code != 0 and "not found" in r.output
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}\n')
    r = CliRunner().invoke(replay_cmd, [str(trace), "--embedded", "--capacity-fraction", "2"])
    assert r.exit_code != 0 and "capacity-fraction" in r.output
    r = CliRunner().invoke(replay_cmd, [str(trace), "--embedded", "--block-bytes", "lots"])
    assert r.exit_code != 0 and "block-bytes" in r.output
    r = CliRunner(env={"CXLKV_SOCKET": ""}).invoke(replay_cmd, [str(trace)])
    assert r.exit_code != 0 and "--embedded" in r.output


def test_replay_workers_prefault_by_default_only_on_the_embedded_cluster(tmp_path: Path, monkeypatch) -> None:
    """``--embedded`` workers fault their mapping in before the timed part (the region is
    the one the replay sized); against a running cluster (``--socket``) only when asked,
    its region may be too large to map page by page."""
    from click.testing import CliRunner

    import cxlkv.trace.replay as replay_mod

    seen: list[bool] = []

    def capture(opts, *args, **kwargs):
        seen.append(opts.prefault)
        raise SystemExit(0)

    monkeypatch.setattr(replay_mod, "run_embedded", capture)
    monkeypatch.setattr(replay_mod, "run_replay", capture)
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}\n')
    for args in (["--embedded"], ["--embedded", "--no-prefault"], ["--socket", "x.sock"],
                 ["--socket", "x.sock", "--prefault"]):
        CliRunner().invoke(replay_mod.replay_cmd, [str(trace), *args])
    assert seen == [True, False, False, True]
    assert ReplayOptions().prefault is True


def test_cluster_up_status_down(tmp_path: Path) -> None:
    run_dir = tmp_path / "c"
    cli = [sys.executable, "-m", "cxlkv.cli", "cluster"]
    up = subprocess.run(cli + ["up", "--run-dir", str(run_dir), "--region-size", "32MiB"],
                        capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    state = json.loads((run_dir / "cluster.json").read_text())
    try:
        assert len(state["clientds"]) == 2 and all(Path(p).exists() for p in state["regions"])
        st = subprocess.run(cli + ["status", "--run-dir", str(run_dir), "--json"],
                            capture_output=True, text=True, timeout=60)
        procs = json.loads(st.stdout)["processes"]
        assert [p["alive"] for p in procs] == [True, True, True]
        again = subprocess.run(cli + ["up", "--run-dir", str(run_dir)], capture_output=True, text=True, timeout=60)
        assert again.returncode != 0 and "already running" in again.stderr
        env = dict(os.environ, CXLKV_SOCKET=state["clientds"][0]["socket_path"])
        put = subprocess.run([sys.executable, "-m", "cxlkv.cli", "put", "k", "-"], input="v",
                             capture_output=True, text=True, timeout=60, env=env)
        assert put.returncode == 0, put.stderr
    finally:
        down = subprocess.run(cli + ["down", "--run-dir", str(run_dir)], capture_output=True, text=True, timeout=60)
    assert down.returncode == 0, down.stderr
    assert "killed" not in down.stdout
    for c in state["clientds"]:
        assert not Path(f"/proc/{c['pid']}").exists() or "Z" in Path(f"/proc/{c['pid']}/stat").read_text().split(") ")[1][:1]
    assert not any(Path(p).exists() for p in state["regions"])
    assert subprocess.run(cli + ["status", "--run-dir", str(run_dir)], capture_output=True, timeout=60).returncode != 0


def test_cluster_up_refuses_over_a_half_dead_cluster(tmp_path: Path) -> None:
    """With the master dead but a clientd alive, `up` must not orphan the clientd and region."""
    import signal

    run_dir = tmp_path / "c"
    cli = [sys.executable, "-m", "cxlkv.cli", "cluster"]
    up = subprocess.run(cli + ["up", "--run-dir", str(run_dir), "--region-size", "32MiB"],
                        capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    state = json.loads((run_dir / "cluster.json").read_text())
    try:
        os.kill(state["master_pid"], signal.SIGKILL)
        os.kill(state["clientds"][1]["pid"], signal.SIGKILL)  # leaves its sockets and ready file
        again = subprocess.run(cli + ["up", "--run-dir", str(run_dir), "--region-size", "32MiB"],
                               capture_output=True, text=True, timeout=120)
        assert again.returncode != 0 and "already running" in again.stderr and "clientd-0" in again.stderr
        assert "Traceback" not in again.stderr
        assert json.loads((run_dir / "cluster.json").read_text()) == state
    finally:
        down = subprocess.run(cli + ["down", "--run-dir", str(run_dir)], capture_output=True, text=True, timeout=60)
    assert down.returncode == 0, down.stderr
    assert not any(Path(p).exists() for p in state["regions"])
    for c in state["clientds"]:
        assert not Path(f"/proc/{c['pid']}").exists() or "Z" in Path(f"/proc/{c['pid']}/stat").read_text().split(") ")[1][:1]
    left = [p for c in state["clientds"] for p in (c["socket_path"], c["lean_socket_path"], c["ready_file"])
            if os.path.lexists(p)]
    assert left == []  # the killed clientd's stale .sock, .sock.lean and .ready are gone too


def test_cluster_down_and_status_never_touch_a_recycled_pid(tmp_path: Path) -> None:
    """cluster.json names processes by pid *and* start time: a pid now held by an
    unrelated process (or by a cxlkv-looking one started later) is reported gone and
    not signalled; the recorded process itself is stopped."""
    from click.testing import CliRunner

    from cxlkv.cli.cluster import cluster_group
    from cxlkv.runtime.procs import process_start_time

    run_dir = tmp_path / "c"
    run_dir.mkdir()
    unrelated = subprocess.Popen(["sleep", "60"])                      # no cxlkv in its command line
    lookalike = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "cxlkv"])
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "cxlkv-clientd"])
    try:
        for p in (unrelated, lookalike, ours):
            while process_start_time(p.pid) is None:
                time.sleep(0.01)
        stale = [run_dir / n for n in ("clientd-0.sock", "clientd-0.sock.lean", "clientd-0.ready")]
        for f in stale:
            f.write_text("")
        state = {
            "master_address": "127.0.0.1:1", "regions": [],
            "master_pid": unrelated.pid, "master_start_time": process_start_time(unrelated.pid),
            "clientds": [
                {"name": "clientd-0", "pid": lookalike.pid, "start_time": process_start_time(lookalike.pid) - 1,
                 "socket_path": str(stale[0]), "lean_socket_path": str(stale[1]), "ready_file": str(stale[2])},
                {"name": "clientd-1", "pid": ours.pid, "start_time": process_start_time(ours.pid),
                 "socket_path": str(run_dir / "clientd-1.sock")},
            ],
        }
        (run_dir / "cluster.json").write_text(json.dumps(state))
        st = CliRunner().invoke(cluster_group, ["status", "--run-dir", str(run_dir), "--json"])
        assert st.exit_code == 0, st.output
        assert [p["alive"] for p in json.loads(st.output)["processes"]] == [False, False, True]
        down = CliRunner().invoke(cluster_group, ["down", "--run-dir", str(run_dir), "--timeout", "5"])
        assert down.exit_code == 0 and "killed" not in down.output, down.output
        assert ours.wait(timeout=5) == -signal.SIGTERM
        assert unrelated.poll() is None and lookalike.poll() is None   # never signalled
        assert not any(f.exists() for f in stale)
        assert not (run_dir / "cluster.json").exists()
    finally:
        for p in (unrelated, lookalike, ours):
            p.kill()
            p.wait()


@needs_trace
@pytest.mark.parametrize("how,delay_s", [("ctrl-c", 0.2), ("ctrl-c", 2.0), ("sigterm", 2.0)])
def test_ctrl_c_leaves_no_process_or_region(how: str, delay_s: float) -> None:
    """SIGINT to the replay's process group (a terminal's Ctrl-C) mid-run — also
    while the workers are being started (the shorter delay) —, or SIGTERM to the
    command alone (kill, timeout, a cancelled CI job): it exits, and no daemon,
    worker or region file of it remains."""
    import shutil
    import tempfile

    # Its own temporary directory (short: socket paths live there), where the
    # cluster it starts is found, so other clusters on this machine (another
    # job's) neither hide nor fake a leftover.
    tmp = Path(tempfile.mkdtemp(prefix="cxlkv-t-", dir="/tmp"))
    p = subprocess.Popen([sys.executable, "-m", "cxlkv.cli", "replay", str(TRACE), "--embedded", "--limit", "5000"],
                         start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         env={**os.environ, "TMPDIR": str(tmp)}, preexec_fn=_sigint_default)
    try:
        _interrupt_and_check(p, tmp, how, delay_s)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def _sigint_default() -> None:
    """In the child: SIGINT back to its default, as a terminal's foreground job has it.
    A test run started in the background of a non-interactive shell inherits SIGINT
    ignored, and so would the replay (a Python started with SIGINT ignored keeps it
    ignored: Ctrl-C would rightly do nothing, and the test would see a full run)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt_and_check(p: subprocess.Popen, tmp: Path, how: str, delay_s: float) -> None:
    state: dict = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not state and p.poll() is None:
        for f in tmp.glob("cxlkv-replay-*/cluster.json"):  # written once its cluster is up
            try:
                state = json.loads(f.read_text())
            except (OSError, ValueError):
                pass
        time.sleep(0.05)
    assert state, ("the replay's cluster did not come up within 60 s", p.poll())
    regions = [Path(r) for r in state["regions"]]
    assert all(r.exists() for r in regions)
    time.sleep(delay_s)
    if how == "sigterm":
        p.send_signal(signal.SIGTERM)
    else:
        os.killpg(p.pid, signal.SIGINT)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == (128 + signal.SIGTERM if how == "sigterm" else 1), (p.returncode, out[-2000:])
    assert b"Traceback" not in out, out[-2000:]
    time.sleep(0.5)
    assert not [r for r in regions if r.exists()], out[-2000:]
    assert not list(tmp.iterdir()), (list(tmp.iterdir()), out[-2000:])  # its run directory is gone too
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    alive = {ln.split()[0] for ln in ps.splitlines()[1:]}
    pids = [p.pid, state["master_pid"]] + [c["pid"] for c in state["clientds"]]
    assert not [x for x in pids if str(x) in alive], (pids, out[-2000:])
    assert state["run_dir"] not in ps, out[-2000:]  # no daemon or worker of its cluster


def test_replay_socket_takes_capacity_from_master(cluster, tmp_path: Path) -> None:
    """`replay --socket` against a running cluster: the simulations' capacity is the
    cluster's (its CXL segments' bytes ÷ one block's extent, from the master), and
    the report says so — never a made-up ``capacity_fraction`` × unique blocks."""
    from cxlkv.trace.replay import region_bytes_for, run_replay
    from cxlkv.v1 import common_pb2

    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(
        json.dumps({"timestamp": i, "input_length": 1024, "output_length": 1, "hash_ids": [i % 3, 10 + i]}) + "\n"
        for i in range(6)))
    opts = ReplayOptions(trace_path=str(trace), workers=1, block_bytes=4096, capacity_fraction=0.1)
    report = run_replay(opts, [cluster.socket_path(0)])
    assert report.errors == 0, report.error_samples
    st = cluster.master_stat()
    cxl = sum(s.capacity_bytes for s in st.segments if s.tier == common_pb2.CXL)
    extent = region_bytes_for(1, 4096) - region_bytes_for(0, 4096)
    assert report.capacity_source == "master"
    assert report.capacity_blocks == cxl // extent
    assert report.policy == st.eviction_policy
    row = report.table()
    assert "from the master" in row and "--capacity-fraction" not in row


def test_replay_socket_without_master_labels_the_fraction(tmp_path: Path) -> None:
    """The master cannot be asked: the report says its capacity is --capacity-fraction's,
    not the store's, and not comparable."""
    from cxlkv.trace.replay import cluster_capacity

    assert cluster_capacity(str(tmp_path / "no.sock"), 4096) is None
    from cxlkv.trace.replay import ReplayReport

    fields = {f: 0 for f in ReplayReport.__dataclass_fields__}
    fields.update(policy="arc", error_samples=[], other_sim_hit_rates={}, capacity_source="fraction", capacity_fraction=0.1,
                  capacity_blocks=3, unique_blocks=30, block_bytes=4096, master_counters={})
    text = ReplayReport(**fields).table()
    assert "NOT the store's" in text and "--capacity-fraction 0.1" in text


@needs_trace
def test_default_trace_is_found_beside_the_checkout_from_any_directory(tmp_path: Path) -> None:
    """`cxlkv replay` without TRACE, run from another directory, reads
    ../shared/traces/ beside the checkout (README), not beside the current directory."""
    from cxlkv.trace.replay import resolve_trace

    assert Path(resolve_trace(None)).resolve() == TRACE.resolve()
    out = subprocess.run(
        [sys.executable, "-m", "cxlkv.cli", "replay", "--embedded", "--json", "--limit", "20",
         "--workers", "1", "--block-bytes", "4KiB", "--clientds", "1"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout)["requests"] == 20


def test_missing_trace_names_where_it_looked(tmp_path: Path, monkeypatch) -> None:
    from click.testing import CliRunner

    import cxlkv.trace.replay as replay
    from cxlkv.bench.tiering import tiering_cmd

    places = [tmp_path / "a" / "t.jsonl", tmp_path / "b" / "t.jsonl"]
    monkeypatch.setattr(replay, "default_trace_candidates", lambda: places)
    for cmd, args in ((replay.replay_cmd, ["--embedded"]), (tiering_cmd, [])):
        r = CliRunner().invoke(cmd, args)
        assert r.exit_code != 0
        assert "trace not found" in r.output and all(str(p) in r.output for p in places), r.output
    r = CliRunner().invoke(replay.replay_cmd, ["rel/missing.jsonl", "--embedded"])
    assert r.exit_code != 0 and "rel/missing.jsonl not found" in r.output
    assert str(Path.cwd() / "rel" / "missing.jsonl") in r.output


def test_start_line_waits_for_ready_or_stopped_workers() -> None:
    """The replay is timed from the start line; a worker that stopped before getting
    ready does not hold the others back (its missing report is counted as an error)."""
    import multiprocessing as mp
    import threading

    from cxlkv.trace.replay import _Start

    class Proc:
        def __init__(self, alive: bool) -> None:
            self.alive = alive

        def is_alive(self) -> bool:
            return self.alive

    ctx = mp.get_context("spawn")
    start = _Start(ctx.RawArray("b", 2), ctx.Event(), ctx.RawValue("d", 0.0))
    procs = [Proc(True), Proc(False)]  # worker 1 died before it was ready
    threading.Timer(0.2, lambda: start.ready.__setitem__(0, 1)).start()
    t0 = time.monotonic()
    assert start.wait_ready(procs, timeout_s=10) == []
    assert 0.15 < time.monotonic() - t0 < 5
    assert start.go.is_set() and start.at.value >= t0


def test_start_line_stops_a_worker_that_never_gets_ready() -> None:
    """A worker alive but never ready (stuck connecting, say) is terminated at the
    deadline, so the replay neither waits for it forever nor for its report."""
    import multiprocessing as mp

    from cxlkv.trace.replay import _Start

    ctx = mp.get_context("spawn")
    start = _Start(ctx.RawArray("b", 2), ctx.Event(), ctx.RawValue("d", 0.0))
    stuck = ctx.Process(target=time.sleep, args=(600,), daemon=True)
    stuck.start()
    try:
        start.ready[1] = 1
        t0 = time.monotonic()
        assert start.wait_ready([stuck, stuck], timeout_s=0.3) == [0]
        assert 0.25 < time.monotonic() - t0 < 5 and start.go.is_set()
        stuck.join(10)
        assert not stuck.is_alive()
    finally:
        if stuck.is_alive():
            stuck.kill()


def test_ctrl_c_while_replay_starts_its_workers_is_not_lost(tmp_path: Path) -> None:
    """`cxlkv replay` holds SIGINT blocked while it starts its workers
    (``sigint_held``). A Ctrl-C then — or one already pending when the window
    opens (it came while ``fork`` had every signal blocked) — is raised in the
    main process when the window ends; a thread a library started at import
    (numpy's OpenBLAS pool) never takes it; and a worker starts with SIGINT
    blocked (inherited across exec), so it never raises KeyboardInterrupt while
    its interpreter starts."""
    script = """
import multiprocessing as mp, os, signal, sys, time
import click
from cxlkv.cli import main
assert "numpy" not in sys.modules
main.get_command(click.Context(main), "replay")
assert "numpy" in sys.modules
from cxlkv.trace.replay import sigint_held

def sigblk(tid):
    return int(next(l for l in open(f"/proc/{os.getpid()}/task/{tid}/status") if l.startswith("SigBlk:")).split()[1], 16)

def child(q):
    q.put(bool(sigblk(os.getpid()) & (1 << (signal.SIGINT - 1))))

if __name__ == "__main__":
    for tid in os.listdir("/proc/self/task"):
        if int(tid) != os.getpid():
            assert sigblk(tid) & (1 << (signal.SIGINT - 1)), f"thread {tid} can take SIGINT"
    for when in ("inside", "before"):  # "before" second: the resource tracker runs by then
        p, blocked_in_child = None, None
        outer = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # as fork_exec does
        if when == "before":
            os.kill(os.getpid(), signal.SIGINT)  # pending before the window opens
        try:
            with sigint_held():
                signal.pthread_sigmask(signal.SIG_SETMASK, outer | {signal.SIGINT})
                if when == "inside":
                    os.kill(os.getpid(), signal.SIGINT)
                ctx = mp.get_context("spawn")
                q = ctx.Queue()
                p = ctx.Process(target=child, args=(q,))
                p.start()
                blocked_in_child = q.get(timeout=60)
                p.join(30)
                time.sleep(0.1)
            signal.pthread_sigmask(signal.SIG_SETMASK, outer)
            time.sleep(0.2)
            print(when, "lost", blocked_in_child)
        except KeyboardInterrupt:
            if p is not None:
                p.join(30)
            print(when, "kept", blocked_in_child)
"""
    path = tmp_path / "held.py"  # a file: spawned children import their target from it
    path.write_text(script)
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120,
                         preexec_fn=_sigint_default)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["inside", "kept", "True", "before", "kept", "True"], out.stdout + out.stderr[-2000:]
