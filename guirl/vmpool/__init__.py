"""VM pool: providers (local desktops, cloud VMs), the VM-side server and its client, OSWorld's task
setup steps, getters and evaluators (`tasks`), and the pool that leases desktops to an env worker."""
