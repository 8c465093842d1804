"""The actors, one per module, and the runtime they share: mailbox, connections, process, supervisor."""
