"""On-policy self-distillation training (paper §3.3-3.4, §4.1): the token-level losses of OPSD,
EOPD, REOPOLD and PW-OPSD in their reference forms (:mod:`.losses`) and computed from hidden states
in chunks (:mod:`.chunked`), a run's inputs (:mod:`.inputs`) and its process's rank, RNG states and
determinism (:mod:`.process`), the training loop (:mod:`.loop`) and one run as rule ``train`` runs
it, in one process or under torchrun (:mod:`.job`; ``merge_adapter`` uses :func:`.merge.merge_lora_checkpoint`)."""
