"""The learner's library: RL math as pure functions (`advantages`, `losses`, `rewards`, `rule_reward`,
`logprobs`), samples and their checks (`samples`, `buffer`, `batch`), one update (`step`), the FSDP2 trainer
(`trainer`, `fsdp`) on rank 0's thread with its follower ranks (`rank0`, `followers`), checkpoints
(`checkpoint`), weight publishing (`publish`, over `guirl.weights`) and the run's lineage (`lineage`). The
actor that drives them is `guirl.actors.learner`."""
