"""One typed config.  Its fields generate the CLI flags, ``SACBOT_*`` env vars and TOML keys.

Precedence, lowest to highest: defaults < the preset of the env id (``sacbot/config/presets.py``)
< TOML file < ``SACBOT_*`` env vars < flags.  A field ``utd_ratio`` is the TOML key
``utd_ratio``, the env var ``SACBOT_UTD_RATIO`` and the flag ``--utd-ratio``.  The original
bot's ``SACLSTM_*`` names are read as aliases of five of them.  A bad value raises
:class:`ConfigError`, which names the setting, the value and what is accepted; the CLI
turns it into exit code 2.

    cfg = load_config(toml_path="bot.toml", env=os.environ, cli={"utd_ratio": "2"})
"""

from __future__ import annotations

from sacbot.config.settings import (  # noqa: F401
    ALIASES,
    ENV_PREFIX,
    MAX_COUNT,
    MAX_SEED,
    MAX_UTD_RATIO,
    NOT_SETTINGS,
    STEP_RE,
    Config,
    ConfigError,
    env_name,
    flag_name,
    log,
)
from sacbot.config.sources import (  # noqa: F401
    Layer,
    _read_toml,
    add_arguments,
    coerce,
    from_args,
    load_config,
    resolve_env_id,
)
