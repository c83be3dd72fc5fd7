import sys

from sacbot.app.cli import main

sys.exit(main())
