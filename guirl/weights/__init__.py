"""Weight transport between the learner and the inference engines: what both sides import.

`broadcast`: a torch.distributed group from the learner to the engines' ranks (guirl's bucketed layout,
and SGLang's own per-tensor / flattened-bucket layout). `publisher`: the learner's side, one publisher per
transport behind one interface (`disk`, `broadcast_publisher`). Where the engines take new weights from
travels as `guirl.messages.weights.WeightSource`.
"""
