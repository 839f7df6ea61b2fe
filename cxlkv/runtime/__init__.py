"""What a cxlkv process needs from its host at run time, shared by the master, clientd
and the SDK: the event loop and its stall monitor (:mod:`~cxlkv.runtime.loops`),
logging (:mod:`~cxlkv.runtime.logs`), Prometheus helpers (:mod:`~cxlkv.runtime.metrics`),
process identity (:mod:`~cxlkv.runtime.procs`), the private runtime directory and the
trusted-daemon check (:mod:`~cxlkv.runtime.rundir`), bounded stops
(:mod:`~cxlkv.runtime.stopping`), and systemd notifications (:mod:`~cxlkv.runtime.systemd`)."""
