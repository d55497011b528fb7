import sys

if sys.argv[1:2] == ["--zygote"]:  # a zygote (`server.zygote`): returns only in a child it forked, as its server
    from forge_nb.server import zygote

    sys.argv[1:] = [zygote.serve_here(sys.argv[2])]

from forge_nb.launch.forks import early

early.start()  # before Monarch is imported: the fork server is forked from this process (`launch.forks.early`)

from forge_nb.server.server import main  # noqa: E402 -- after the fork

sys.exit(main())
