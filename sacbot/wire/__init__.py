"""The wire: what crosses between the acting side and the learner, as plain data.

* :mod:`~sacbot.wire.messages`: the typed messages and their msgpack form;
* :mod:`~sacbot.wire.channels`: bounded channels between threads (sends never block);
* :mod:`~sacbot.wire.snapshot`: the actor's weights, published by training and pulled by acting;
* :mod:`~sacbot.wire.boundary`: the :class:`~sacbot.wire.boundary.Learner` a bot holds, and the
  :class:`~sacbot.wire.boundary.Start` record a bot is started from.

Imports: only :mod:`sacbot.config` of sacbot; numpy and msgpack, never torch.
"""
