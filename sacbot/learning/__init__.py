"""The learning side: the SAC-LSTM learner and the hosts it runs in.

* :mod:`~sacbot.learning.sac`: the SAC-LSTM maths, top to bottom; :mod:`~sacbot.learning.quant`
  its quantization-aware layers; :mod:`~sacbot.learning.replay` the sequence replay;
* :mod:`~sacbot.learning.training`: the loop that drains experience and trains at the UTD ratio;
* :mod:`~sacbot.learning.io_thread`: checkpoint writes off the training thread;
* :mod:`~sacbot.learning.thread_learner`, :mod:`~sacbot.learning.process_learner`: the hosts;
* :mod:`~sacbot.learning.memory`: what training needs in memory, checked before it starts.

Imports: :mod:`sacbot.config`, :mod:`sacbot.wire`, :mod:`sacbot.store`, torch; never the acting side.
"""
