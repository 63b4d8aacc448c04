"""The branch-viability diagnostic (paper §3.2, Appendices A-B; Table 1, Figure 1): the phases A-G as
functions over tables, one rule each (:mod:`.phases`: rules ``spines``, ``teacher_pass``,
``candidates``, ``mc_dropout``, ``forced_continuation``, ``viability_labels``, ``branch_scores``),
their per-spine building blocks (:mod:`.branch_points`) and statistics (:mod:`.statistics`: AUROC,
AUPRC, residualization, cluster bootstrap, binned failure rates)."""
