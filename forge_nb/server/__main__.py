import sys

from forge_nb.server.server import main

sys.exit(main())
