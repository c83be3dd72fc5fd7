"""The one config: its fields (:mod:`~sacbot.config.settings`) generate the CLI flags, ``SACBOT_*``
variables and TOML keys; :mod:`~sacbot.config.sources` merges them; :mod:`~sacbot.config.presets`
holds the per-env presets.  Every name of the first two is importable from here.

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
    env_given,
    from_args,
    given_settings,
    load_config,
    resolve_env_id,
)
