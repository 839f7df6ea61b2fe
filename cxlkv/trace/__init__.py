"""The real workload: the Mooncake conversation trace, an in-process cache simulator
over it (:mod:`~cxlkv.trace.sim`) and its replay on a cluster
(:mod:`~cxlkv.trace.replay`, ``cxlkv replay``)."""
