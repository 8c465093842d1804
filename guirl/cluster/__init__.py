"""Running guirl across machines: the cluster file (`spec`), the SSH and Slurm launchers and the agent they
start on each host (`launch`, `agent`), and a run's placement of roles on hosts with its live controls
(`run`). The local launcher is the runtime's (`guirl.runtime.launch`); the command is `guirl.cli.cluster`."""
