import sys

from forge_nb.launch.forks import early

early.start()  # before Monarch is imported: the fork server is forked from this process (`launch.forks.early`)

from forge_nb.server.server import main  # noqa: E402 -- after the fork

sys.exit(main())
