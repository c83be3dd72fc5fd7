"""The assembly: the one place that knows both sides and puts a bot together.

* :mod:`~sacbot.assembly.assemble`: how a bot starts (eval, pretrained, resume, fresh) and which
  learner it feeds;
* :mod:`~sacbot.assembly.bot`: :class:`~sacbot.assembly.bot.Agent`, the public bot (``sacbot.Agent``):
  the acting loop started by the assembly.

Imports: everything below it (acting, learning, store, wire, config); never the app.
"""
