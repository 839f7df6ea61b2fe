"""Back within a second (issue 18, item 3): after a master outage of any length,
clientds and their applications work again within 1 s of the master serving.

gRPC's default reconnect backoff (1 s growing by 1.6x to 120 s) kept clientds away
for up to a minute after a restarted master served again; the master link now
sets its own backoff and polls quickly while the master is away. The outage here
is 20 s (long enough for gRPC's default backoff to have grown past 10 s);
``CXLKV_OUTAGE_S=120`` runs the issue's 2-minute case by hand.
"""

from __future__ import annotations

import os
import threading
import time

from cxlkv.errors import CxlkvError

#: Outage length, in seconds.
OUTAGE_S = float(os.environ.get("CXLKV_OUTAGE_S", "20"))
#: Asserted bound from "master serving" to "a put and a get through clientd worked":
#: the contract is 1 s; the rest is margin for a loaded machine.
BACK_WITHIN_S = 1.5


def test_clientds_work_again_within_a_second_of_a_restarted_master(make_cluster) -> None:
    cluster = make_cluster(clientds=2)
    clients = [cluster.client(i) for i in range(2)]
    try:
        for i, c in enumerate(clients):
            c.put(f"rc/before/{i}", b"x")
        cluster.stop_master()
        t_down = time.monotonic()
        failures = 0
        while time.monotonic() - t_down < OUTAGE_S:  # applications keep trying meanwhile
            try:
                clients[0].put(f"rc/during/{failures}", b"y")
            except CxlkvError:
                failures += 1
            time.sleep(0.5)
        assert failures > 0  # the master really was away
        serving_at = cluster.start_master_again()
        back_s = [0.0, 0.0]

        def until_it_works(i: int) -> None:
            c, n = clients[i], 0
            while True:
                n += 1
                try:
                    c.put(f"rc/after/{i}/{n}", b"z" * 100)
                    assert c.get(f"rc/after/{i}/{n}") == b"z" * 100
                    break
                except CxlkvError:
                    if time.time() - serving_at > 30:
                        break  # reported by the assert below
                    time.sleep(0.01)
            back_s[i] = time.time() - serving_at

        threads = [threading.Thread(target=until_it_works, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        print(f"outage {OUTAGE_S:g} s; back after master serving: "
              + ", ".join(f"clientd-{i} {b * 1000:.0f} ms" for i, b in enumerate(back_s)))
        assert back_s[0] < BACK_WITHIN_S, back_s
        assert back_s[1] < BACK_WITHIN_S, back_s
        st = cluster.master_stat()
        assert sorted(c.name for c in st.clients if c.alive) == ["clientd-0", "clientd-1"]
    finally:
        for c in clients:
            c.close()
    cluster.assert_invariants()
