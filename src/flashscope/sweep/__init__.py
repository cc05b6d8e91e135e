"""Config sweeps: the space as data, offline and GPU evaluation, resumable JSONL results,
executors (process pool, one worker per GPU, Ray), Pareto fronts, evolutionary search and
the tuned data files. See ``docs/sweep.md``.

- :mod:`.space`: the space, its checks and feasibility pruning;
- :mod:`.store`: append-only JSONL with atomic records and resume;
- :mod:`.executors`: where the work runs;
- :mod:`.evaluate`: one point offline or on the GPU;
- :mod:`.pareto`, :mod:`.plot`: fronts and their PNG;
- :mod:`.evolve`: guided search;
- :mod:`.tuned`: best configs -> ``flashscope/data/tuned/<target>.json``;
- :mod:`.run`: orchestration (:func:`run_sweep`).
"""
