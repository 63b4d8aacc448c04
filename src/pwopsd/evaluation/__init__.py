"""Evaluation (paper §4.1, "Evaluation metric definitions"): answer extraction and grading
(:mod:`.grading`, math-verify in killable worker processes), the per-problem metrics Avg/Pass/Maj@N
(:mod:`.metrics`) and the pipeline of rules ``grade`` and ``aggregate_metrics`` (:mod:`.pipeline`:
generations -> graded samples -> per-seed metrics -> the mean ± std over seeds)."""
