"""The actor runtime every role is built on: an actor's mailbox and connections (`base`, `mailbox`,
`connection`, `sockets`), CURVE security, the process an actor runs in and the supervisor that (re)starts
it (`process`, `supervisor`, `launch`), and the error, retry and counter helpers. It knows no role: the
roles (coordinator, broker, env worker, learner, PRM) are in `guirl.actors`."""
