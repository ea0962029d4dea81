"""One run over several load processes of this host (``RunSpec.processes``): one schedule,
computed once and dealt (``plan``), a common start on ``CLOCK_MONOTONIC`` (``share``'s
gate), the children (``child``) and the parent that merges their records into one run
(``coordinator``, ``merge``). ``load.run_load`` picks the one-process runner or this."""
