"""``sacbot serve``: a game in any language connects over a local socket and gets an action per tick.

* :mod:`sacbot.serve.protocol`: frames, message checks, the version (docs/protocol.md is the spec);
* :mod:`sacbot.serve.server`: the server (listeners, status, shutdown; one Agent per bot name);
* :mod:`sacbot.serve.loop`: its one selector loop over every connection;
* :mod:`sacbot.serve.bots`: the bots it holds, each under ``ROOT/<name>/``;
* :mod:`sacbot.serve.client`: :class:`~sacbot.serve.client.SacbotClient`, the Python client;
* :mod:`sacbot.serve.command`: the ``sacbot serve`` command.

This package is the acting side: nothing in it imports torch (a bot's learner is built by the
assembly every Agent uses).  Importing it alone imports nothing else, so that the command line can
read the constants below without loading numpy.
"""

PROTOCOL_VERSION = 1
DEFAULT_PORT = 7373  # below Linux's ephemeral range (32768+), so no outgoing connection holds it
MAX_FRAME = 1 << 20  # 1 MiB by default (--max-frame): a step of ~100k observation values fits
