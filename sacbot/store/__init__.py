"""The store: everything a bot keeps on disk, written atomically.

* :mod:`~sacbot.store.checkpoint`: the zip format, writes, rotation, verified reads;
* :mod:`~sacbot.store.compat`: whether a saved bot may resume under the settings and game given;
* :mod:`~sacbot.store.migrations`: older formats read into the current form;
* :mod:`~sacbot.store.lock`, :mod:`~sacbot.store.rundir`: one writer per weights and run directory;
* :mod:`~sacbot.store.liveness`, :mod:`~sacbot.store.files`: the heartbeat, round counter, logs;
* :mod:`~sacbot.store.pretrained`: the bots shipped with the package.

Imports: :mod:`sacbot.config` and :mod:`sacbot.wire`; never torch (eval reads a checkpoint without it).
"""
