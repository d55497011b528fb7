"""Starting the procs a session runs in: the placement plan (`placement`: which proc of which role goes on which
host with which devices, a pure function of the config and the hosts), and the meshes that carry it out on this
host (`local`), on hosts that run a forge_nb worker (`hosts`, `worker`) or on a Slurm job's nodes (`slurm`); a
gang's torchrun environment (`torchrun`); keeping library noise out of notebook cells (`quiet`); and the fork
servers, an optional start-up optimisation (`forks`)."""
