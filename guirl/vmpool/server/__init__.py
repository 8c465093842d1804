"""The VM-side server: OSWorld's VM HTTP protocol (so one client drives an OSWorld image or a guirl
desktop), plus guirl's typed `/action` endpoint. It runs inside the VM, next to the X display."""
