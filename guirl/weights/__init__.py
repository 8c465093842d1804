"""Weight transport between the learner and the inference engines: what both sides import.

`broadcast`: a torch.distributed group from the learner to the engines' ranks (guirl's bucketed layout,
and SGLang's own per-tensor / flattened-bucket layout).
"""
