"""sacbot: a runtime for bots that learn while they play.

Layout: ``agent`` (the acting side, a numpy ``policy``), ``training`` (the learner
thread around ``sac`` and ``replay``), ``io`` (the checkpoint writer thread around
``checkpoint``), the plain-data ``messages`` and ``channels`` between them, and the
``snapshot`` that carries weights from training to acting.
"""

__version__ = "0.1.0"
