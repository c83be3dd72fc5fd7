"""``sacbot robocode``: a sacbot bot learns to fight in Robocode (robocode.sourceforge.io).

``install`` finds Robocode and prepares its working directory (the robot compiled from
``clients/robocode/`` and ``clients/java/``, the ``.battle`` files, the turn budget); ``results``
reads Robocode's results file and the robot's per-round lines; ``command`` runs ``sacbot serve`` and
the battles.  docs/robocode.md has the observation, action and reward mapping and the numbers.
"""

ROBOT = "sacbot.SacbotRobot"
# Robocode lists a robot compiled into its robots/ folder (no jar) as a development version, with a '*'.
ROBOT_ENTRY = ROBOT + "*"
OBS_SIZE = 24
ACT_SIZE = 5
OPPONENTS = ("sample.SittingDuck", "sample.SpinBot", "sample.Walls", "sample.Tracker")
# The robot's rewards (its sacbot.reward property; docs/robocode.md): the first is the default.
REWARDS = ("damage", "energy", "dealt")
# How action 2 turns the gun (the robot's sacbot.gun property): from where it points, from the lead, or from the
# lead with a trigger that waits until the gun points there. A bot keeps the one it was trained with
# (ROOT/<bot>/weights/robot.json). A new bot's is the gated gun, the one with which bots learnt to beat every
# sample robot from scratch (docs/robocode.md); a checkpoint with no robot.json is from before the setting,
# when the gun turned from where it pointed.
GUNS = ("turn", "lead", "gated")
NEW_BOT_GUN = "gated"
LEGACY_GUN = "turn"
