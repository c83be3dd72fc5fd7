"""The application: the ``sacbot`` command and what drives bots in envs.

* :mod:`~sacbot.app.cli`: the command line; :mod:`~sacbot.app.driver`: an Agent on a gymnasium env;
* :mod:`~sacbot.app.runner`: restarts a bot that dies; :mod:`~sacbot.app.cluster`,
  :mod:`~sacbot.app.ray_cluster`: many bots and one learner on Ray;
* :mod:`~sacbot.app.status`, :mod:`~sacbot.app.progress`, :mod:`~sacbot.app.tensorboard`: what a
  person watches.

Imports: anything of sacbot.  Nothing below imports it.
"""
