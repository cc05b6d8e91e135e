"""The tuner: how the shipped tuned entries are found, measured and written.

- :mod:`.cells`: the problems timed (standard-suite cells ``d64c16k``, any shape).
- :mod:`.variants`: what is timed (``+K=V`` on the default, ``FAMILY:K=V``, peers).
- :mod:`.search`: one-knob neighbours within a family's rules; transplanted entries.
- :mod:`.timer`: interleaved, L2-flushed bursts on one GPU's clock.
- :mod:`.ab`: one validated A/B of a cell; :mod:`.results` its file.
- :mod:`.batch`: many cells, one worker process per GPU.
- :mod:`.rule`: the adoption rule (per reading with confirmations, or pooled with a sign
  test); :mod:`.adopt`: the rule over a folder of results, written through
  :func:`flashscope.tuned.write_entries`.
- :mod:`.sass`: two Nsight Compute source pages compared, opcode by opcode and stall by
  stall.

``flashscope tune`` (:mod:`flashscope.commands.tune`) is the command; docs/tune.md the
guide.
"""
