"""What the paper shows: Tables 2-5 (:mod:`.tables`, rule ``table``; Table 1 is rule
``branch_auroc_table``), the figures with their data as CSV (:mod:`.figures`: rules
``schedules_figure``, ``training_curves``, ``branch_auroc_figure``) and the paper-vs-reproduction
report (:mod:`.reproduction`, rule ``reproduction_report``)."""
