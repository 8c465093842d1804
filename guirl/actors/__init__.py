"""The roles, one actor per module: coordinator, inference broker, env worker, dataset worker, learner, PRM
(and the echo and demo actors). They are built on `guirl.runtime`; nothing outside this package imports a
role except the launch code that names it (`guirl.roles`)."""
