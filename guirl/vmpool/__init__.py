"""VM pool: providers (local desktops, cloud VMs), the VM-side server and its client, task setup and
evaluators. Built in a later issue; the package exists so the layout is fixed from the start."""
