"""The roles, one actor per module: coordinator, inference broker, env worker, dataset worker, learner, PRM
(and the echo and demo actors). They are built on `guirl.runtime`; what imports a role is the assembly above
them (`guirl.roles`, `guirl.report`, and the demo and offline-PRM drivers), never the runtime or the
libraries they are made of (`tests/unit/test_layers.py` checks it)."""
