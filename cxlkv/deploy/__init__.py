"""Standing a cluster up: a local multi-process cluster (:mod:`cxlkv.deploy.cluster`,
used by the tests, ``cxlkv cluster`` and ``cxlkv replay --embedded``) and the
cluster's certificates (:mod:`cxlkv.deploy.certs`, ``cxlkv certs``). systemd units,
example configs and Prometheus files are in the repository's ``deploy/`` folder."""
